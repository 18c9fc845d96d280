"""``hybridflow demo``: every installed estimator on one small grouped batch.

A stand-in for the training job until the loop lands: it builds 2 prompts x
4 sampled responses of different lengths with 0/1 outcome scores, plus
synthetic values of every column the built-in estimators declare (critic
values, a greedy baseline's score, two reward components, old log-probs and
sum pi^2 from a random policy), resolves each registered estimator by name
and prints the advantage of each response's first token. An installed
estimator that needs a column the demo does not make is listed as skipped.
"""

from __future__ import annotations

import torch

from hybridflow.core import DataProto
from hybridflow.core.keys import (
    OLD_LOG_PROBS,
    RESPONSE_MASK,
    REWARD_BASELINES,
    REWARD_COMPONENTS,
    SUM_PI_SQUARED,
    TOKEN_LEVEL_REWARDS,
    UID,
    VALUES,
)
from hybridflow.estimators.adapter import compute_advantage
from hybridflow.plugins.manager import ESTIMATORS, get_estimator, get_plugin_manager


def demo_batch(seed: int = 0, prompts: int = 2, n: int = 4, max_len: int = 6) -> DataProto:
    """Grouped responses with a 0/1 score at each one's last valid token."""
    gen = torch.Generator().manual_seed(seed)
    rows = prompts * n
    lengths = torch.randint(1, max_len + 1, (rows,), generator=gen)
    mask = (torch.arange(max_len) < lengths.unsqueeze(1)).float()
    scores = torch.randint(0, 2, (rows,), generator=gen).float()
    rewards = torch.zeros(rows, max_len)
    rewards[torch.arange(rows), lengths - 1] = scores
    values = torch.rand(rows, max_len, generator=gen) * mask
    probs = torch.softmax(torch.randn(rows, max_len, 8, generator=gen), dim=-1)  # a random policy over 8 tokens
    tensors = {
        TOKEN_LEVEL_REWARDS: rewards,
        RESPONSE_MASK: mask,
        VALUES: values,
        REWARD_BASELINES: scores.reshape(prompts, n).mean(-1).repeat_interleave(n),  # the greedy answer scores the mean
        REWARD_COMPONENTS: torch.stack([scores, (lengths <= max_len // 2).float()], dim=-1),  # correct, and short
        OLD_LOG_PROBS: probs[..., 0].log(),
        SUM_PI_SQUARED: probs.square().sum(-1),
    }
    uids = [f"prompt-{i // n}" for i in range(rows)]
    return DataProto.from_dict(tensors, {UID: uids})


def run_demo(seed: int = 0) -> str:
    """The demo's report: one column per estimator, one row per response."""
    batch = demo_batch(seed)
    registry = get_plugin_manager().registry(ESTIMATORS)
    present = set(batch.batch) | set(batch.non_tensor_batch)
    missing = {
        name: [n.column for n in get_estimator(name).needs if not n.optional and n.column not in present]
        for name in registry.names()
    }
    names = [name for name in registry.names() if not missing[name]]
    columns = {name: compute_advantage(batch, name).batch["advantages"][:, 0].tolist() for name in names}
    lengths = batch.batch[RESPONSE_MASK].sum(-1).int().tolist()
    scores = batch.batch[TOKEN_LEVEL_REWARDS].sum(-1).tolist()
    header = ["uid", "len", "score", *names]
    table = [header]
    for i in range(len(batch)):
        table.append(
            [
                batch.non_tensor_batch[UID][i],
                str(lengths[i]),
                f"{scores[i]:.0f}",
                *(f"{columns[n][i]:+.3f}" for n in names),
            ]
        )
    widths = [max(len(row[c]) for row in table) for c in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in table]
    out = [
        f"hybridflow demo: advantage at each response's first token, for the {len(names)} installed estimators",
        "(resolved by name through the plugin manager, as the training loop resolves algorithm.adv_estimator)",
        "",
        *lines,
    ]
    out.extend(
        f"skipped {name}: needs {', '.join(cols)}, which the demo does not make"
        for name, cols in missing.items()
        if cols
    )
    return "\n".join(out)

"""``hybridflow demo``: every installed estimator on one small grouped batch.

A stand-in for the training job until the loop lands: it builds 2 prompts x
4 sampled responses of different lengths with 0/1 outcome scores (and, for
estimators that need a critic, a fixed set of critic values), resolves each
registered estimator by name and prints the advantage of each response's
first token.
"""

from __future__ import annotations

import torch

from hybridflow.core import DataProto
from hybridflow.core.keys import RESPONSE_MASK, TOKEN_LEVEL_REWARDS, UID, VALUES
from hybridflow.estimators.adapter import compute_advantage
from hybridflow.plugins.manager import ESTIMATORS, get_plugin_manager


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
    uids = [f"prompt-{i // n}" for i in range(rows)]
    return DataProto.from_dict({TOKEN_LEVEL_REWARDS: rewards, RESPONSE_MASK: mask, VALUES: values}, {UID: uids})


def run_demo(seed: int = 0) -> str:
    """The demo's report: one column per estimator, one row per response."""
    batch = demo_batch(seed)
    registry = get_plugin_manager().registry(ESTIMATORS)
    names = registry.names()
    columns = {name: compute_advantage(batch, name).batch["advantages"][:, 0].tolist() for name in names}
    lengths = batch.batch[RESPONSE_MASK].sum(-1).int().tolist()
    scores = batch.batch[TOKEN_LEVEL_REWARDS].sum(-1).tolist()
    header = ["uid", "len", "score", *names]
    table = [header]
    for i in range(len(batch)):
        table.append([batch.non_tensor_batch[UID][i], str(lengths[i]), f"{scores[i]:.0f}", *(f"{columns[n][i]:+.3f}" for n in names)])
    widths = [max(len(row[c]) for row in table) for c in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in table]
    out = [
        f"hybridflow demo: advantage at each response's first token, for the {len(names)} installed estimators",
        "(resolved by name through the plugin manager, as the training loop resolves algorithm.adv_estimator)",
        "",
        *lines,
    ]
    return "\n".join(out)

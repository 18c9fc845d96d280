"""Random but valid batches for an advantage estimator: every column it declares in ``needs``.

A case is grouped responses (rows sharing a ``uid``) of different lengths,
one with a hole in its mask (an observation masked in the middle of a
multi-turn response), an outcome score on each response's last valid token,
and a value for every input the estimator declares, built to mean what the
declaration says (``plugins/entries.py``)::

    GROUP_IDS                   the case's uids, mapped to ids as the adapter maps them
    CRITIC_VALUES               standard normal values (B, T)
    POLICY_OLD_LOG_PROBS        log pi_old(a_t) of a random policy over 8 tokens (<= 0)
    POLICY_SUM_PI_SQUARED       sum_v pi_old(v)^2 of the same policy, in (0, 1]
    GREEDY_BASELINE_SCORES      one score per prompt, repeated over its rows
    REWARD_COMPONENT_SCORES     K = 2 scores per response
    ROLLOUT_CORRECTION_WEIGHTS  positive weights, 0 outside the mask
    any other tensor input      standard normal values of its declared dims (K = 2)
    any other categorical input the case's uids, like GROUP_IDS

Scores are continuous (no ties, so an estimator's tie-breaking rule cannot
make row order matter); with ``equal_scores`` every response of a group
gets the group's score, one of a few dyadic values (exact in float32, so a
group mean equals it exactly), and the group's reward components are equal too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from hybridflow.estimators.adapter import group_index
from hybridflow.plugins.entries import (
    CRITIC_VALUES,
    GREEDY_BASELINE_SCORES,
    POLICY_OLD_LOG_PROBS,
    POLICY_SUM_PI_SQUARED,
    REWARD_COMPONENT_SCORES,
    ROLLOUT_CORRECTION_WEIGHTS,
    AdvantageEstimator,
)

COMPONENTS = 2
"""K, the width of (B, K) inputs such as ``reward_components``."""
VOCAB = 8
"""Tokens of the random policy behind ``old_log_probs`` and ``sum_pi_squared``."""
_DYADIC = torch.tensor([1.0, 0.5, -1.0, 2.0, 0.25, -0.75, 1.5, 0.0])


@dataclass(frozen=True)
class EstimatorCase:
    """One batch for an estimator, named by ``label`` in failure messages.

    ``rewards`` and ``mask`` are (B, T); ``uids`` is (B,) strings;
    ``columns`` holds each declared tensor input by its argument name, rows first.
    """

    label: str
    rewards: torch.Tensor
    mask: torch.Tensor
    uids: np.ndarray
    columns: dict[str, torch.Tensor]

    def inputs(self, estimator: AdvantageEstimator) -> dict[str, Any]:
        """The keyword arguments of ``estimator.fn``, fresh copies, as the adapter would pass them."""
        out: dict[str, Any] = {"token_level_rewards": self.rewards.clone(), "response_mask": self.mask.clone()}
        for need in estimator.needs:
            out[need.arg] = group_index(self.uids) if need.non_tensor else self.columns[need.arg].clone()
        return out

    def take(self, rows: torch.Tensor, label: str) -> EstimatorCase:
        """The same responses in the order ``rows`` (row j of the result is row ``rows[j]`` of this case)."""
        return EstimatorCase(
            label,
            self.rewards[rows],
            self.mask[rows],
            self.uids[rows.numpy()],
            {k: v[rows] for k, v in self.columns.items()},
        )

    def renamed(self, label: str) -> EstimatorCase:
        """The same rows with every uid renamed so that sorted uids (hence group ids) come in reverse order."""
        unique = sorted(set(self.uids.tolist()))
        names = {uid: f"renamed-{len(unique) - rank:04d}" for rank, uid in enumerate(unique)}
        return replace(self, label=label, uids=np.array([names[u] for u in self.uids], dtype=object))


def make_case(
    estimator: AdvantageEstimator,
    group_sizes: Sequence[int],
    *,
    label: str,
    seed: int,
    length: int = 6,
    lengths: Sequence[int] | None = None,
    empty_rows: Sequence[int] = (),
    equal_scores: bool = False,
) -> EstimatorCase:
    """A batch of ``sum(group_sizes)`` rows, groups contiguous, with every input ``estimator`` declares.

    ``lengths`` fixes the response lengths (default: random in [1, length]);
    ``empty_rows`` get length 0 (a filtered or empty response).
    """
    gen = torch.Generator().manual_seed(seed)
    group = torch.repeat_interleave(torch.arange(len(group_sizes)), torch.tensor(list(group_sizes)))
    rows = len(group)
    sizes = torch.randint(1, length + 1, (rows,), generator=gen) if lengths is None else torch.tensor(list(lengths))
    sizes[list(empty_rows)] = 0
    mask = (torch.arange(length) < sizes.unsqueeze(-1)).float()
    holed = [r for r in range(rows) if sizes[r] >= 4]
    if holed:
        mask[holed[0], 1] = 0.0
    if equal_scores:
        scores = _DYADIC[group % len(_DYADIC)]
    else:
        scores = torch.randn(rows, generator=gen)
    last = (torch.arange(length) * mask).argmax(dim=-1)
    rewards = torch.zeros(rows, length)
    rewards[torch.arange(rows), last] = scores * (sizes > 0)
    uids = np.array([f"prompt-{int(g)}" for g in group], dtype=object)
    columns = _declared_columns(estimator, gen, mask, group, equal_scores)
    return EstimatorCase(label, rewards, mask, uids, columns)


def _declared_columns(
    estimator: AdvantageEstimator, gen: torch.Generator, mask: torch.Tensor, group: torch.Tensor, equal_scores: bool
) -> dict[str, torch.Tensor]:
    rows, length = mask.shape
    probs = torch.softmax(1.5 * torch.randn(rows, length, VOCAB, generator=gen), dim=-1)  # pi_old at each position
    per_group = torch.randn(int(group.max()) + 1, COMPONENTS, generator=gen)
    if equal_scores:  # the group's responses are equally good under every component too
        components = _DYADIC[(group.unsqueeze(-1) + torch.arange(COMPONENTS)) % len(_DYADIC)]
    else:
        components = torch.randn(rows, COMPONENTS, generator=gen)
    known = {
        CRITIC_VALUES.column: lambda: torch.randn(rows, length, generator=gen),
        POLICY_OLD_LOG_PROBS.column: lambda: probs[..., 0].log(),
        POLICY_SUM_PI_SQUARED.column: lambda: probs.square().sum(-1),
        GREEDY_BASELINE_SCORES.column: lambda: per_group[group, 0],
        REWARD_COMPONENT_SCORES.column: lambda: components,
        ROLLOUT_CORRECTION_WEIGHTS.column: lambda: torch.exp(0.3 * torch.randn(rows, length, generator=gen)) * mask,
    }
    sizes = {"B": rows, "T": length}
    columns = {}
    for need in estimator.needs:
        if need.non_tensor:
            continue
        build = known.get(need.column)
        columns[need.arg] = (
            build() if build else torch.randn([sizes.get(d, COMPONENTS) for d in need.dims], generator=gen)
        )
    return columns

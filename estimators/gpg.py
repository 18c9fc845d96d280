"""GPG: group policy gradient (Chu et al. 2025, arXiv:2504.02546), as veRL's ``gpg`` estimator.

A group-mean baseline without std division, rescaled so that a batch where
most responses score zero still takes full-size steps. With outcome scores
s_i = sum_t r_{i,t}, B rows in the batch and M of them with s_i != 0::

    alpha = B / max(M, 1)                       # over the whole batch
    A_i = alpha * (s_i - mean_g) / f_norm;   A_{i,t} = A_i * mask_{i,t};  returns = advantages

A group of one has mean 0. veRL's signature also takes an ``alpha`` that it
overwrites with B / M, so it is not an option here. Pair it with the ``gpg``
policy loss (plain -A log pi, no ratio). Shapes: rewards and mask (B, T),
index (B,); outputs (B, T).
"""

from __future__ import annotations

import torch

from hybridflow.estimators.functional import group_mean_std
from hybridflow.plugins import AdvantageEstimator, hookimpl


def gpg_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: torch.Tensor, *, f_norm: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-mean baselined score, scaled by rows over rows with a non-zero score."""
    scores = token_level_rewards.sum(dim=-1)
    mean, _, _ = group_mean_std(scores, index)
    alpha = len(scores) / torch.count_nonzero(scores).clamp(min=1)
    advantages = (alpha * (scores - mean) / f_norm).unsqueeze(-1) * response_mask
    return advantages, advantages


@hookimpl
def hybridflow_register_estimators(register):
    register(AdvantageEstimator(name="gpg", fn=gpg_advantage, needs_groups=True))

"""OPO: on-policy RL with the optimal reward baseline (Hao et al. 2025, arXiv:2505.23585), as veRL's ``opo``.

For the responses of one prompt (rows sharing a ``uid``), with outcome score
s_i = sum_t r_{i,t} and length |y_i| = sum_t mask_{i,t}, the baseline is the
length-weighted mean score of the group, and there is no std division::

    b_g = sum_{j in g} |y_j| s_j / sum_{j in g} |y_j|
    A_i = s_i - b_g;   A_{i,t} = A_i * mask_{i,t};  returns = advantages

A group of one has b = 0 (veRL's convention), so it keeps A_i = s_i. Shapes:
rewards and mask (B, T), index (B,); outputs (B, T).
"""

from __future__ import annotations

import torch

from hybridflow.estimators.functional import group_mean_std, group_sum
from hybridflow.plugins import AdvantageEstimator, hookimpl


def opo_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outcome score minus the group's length-weighted mean score."""
    scores = token_level_rewards.sum(dim=-1)
    lengths = response_mask.sum(dim=-1)
    _, _, count = group_mean_std(scores, index)
    # clamp: a group whose responses are all empty has no weight; its (zero-length) rows are masked anyway
    baseline = group_sum(lengths * scores, index) / group_sum(lengths, index).clamp(min=1)
    adv = scores - torch.where(count > 1, baseline, torch.zeros_like(baseline))
    advantages = adv.unsqueeze(-1) * response_mask
    return advantages, advantages


@hookimpl
def hybridflow_register_estimators(register):
    register(AdvantageEstimator(name="opo", fn=opo_advantage, needs_groups=True))

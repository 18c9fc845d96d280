"""GRPO: group-relative outcome advantage (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

For the n responses of one prompt (rows sharing a ``uid``), with outcome score
s_i = sum_t r_{i,t}::

    A_i = (s_i - mean_g) / (std_g + epsilon)     # std_g unbiased
    A_{i,t} = A_i * mask_{i,t};  returns = advantages

A group of one has mean 0 and std 1. Shapes: rewards and mask (B, T),
index (B,); outputs (B, T).
"""

from __future__ import annotations

import torch

from hybridflow.estimators.functional import group_mean_std
from hybridflow.plugins import AdvantageEstimator, hookimpl


def grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: torch.Tensor,
    *,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-normalized outcome score, broadcast over the response tokens."""
    scores = token_level_rewards.sum(dim=-1)
    mean, std, _ = group_mean_std(scores, index)
    adv = scores - mean
    if norm_by_std:
        adv = adv / (std + epsilon)
    advantages = adv.unsqueeze(-1) * response_mask
    return advantages, advantages


@hookimpl
def hybridflow_register_estimators(register):
    register(AdvantageEstimator(name="grpo", fn=grpo_advantage, needs_groups=True))

"""RLOO: REINFORCE leave-one-out (Ahmadian et al. 2024, arXiv:2402.14740).

Each response is baselined by the mean score of the *other* responses to the
same prompt::

    A_i = s_i - (sum_{j in g, j != i} s_j) / (n_g - 1)
    A_{i,t} = A_i * mask_{i,t};  returns = advantages

A group of one keeps A_i = s_i. Shapes: (B, T) in and out, index (B,).
"""

from __future__ import annotations

import torch

from hybridflow.estimators.functional import group_mean_std
from hybridflow.plugins import AdvantageEstimator, hookimpl


def rloo_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outcome score minus the mean of the other group members' scores."""
    scores = token_level_rewards.sum(dim=-1)
    mean, _, n = group_mean_std(scores, index)
    # s_i - (n*mean - s_i)/(n-1)  ==  n/(n-1) * (s_i - mean)
    adv = torch.where(n > 1, (scores - mean) * n / (n - 1).clamp(min=1), scores)
    advantages = adv.unsqueeze(-1) * response_mask
    return advantages, advantages


@hookimpl
def hybridflow_register_estimators(register):
    register(AdvantageEstimator(name="rloo", fn=rloo_advantage, needs_groups=True))

"""REINFORCE++-baseline (Hu 2025, arXiv:2501.03262): group baseline, then batch whitening.

::

    A_i = s_i - mean_g                   # a group of one: mean 0
    A_{i,t} = A_i * mask_{i,t}
    advantages = whiten(A over all valid tokens of the batch) * mask
    returns = advantages

Shapes: (B, T) in and out, index (B,).
"""

from __future__ import annotations

import torch

from hybridflow.estimators.functional import group_mean_std, masked_whiten
from hybridflow.plugins import AdvantageEstimator, hookimpl


def reinforce_plus_plus_baseline_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-mean baselined score, whitened over the batch's valid tokens."""
    scores = token_level_rewards.sum(dim=-1)
    mean, _, _ = group_mean_std(scores, index)
    tiled = (scores - mean).unsqueeze(-1) * response_mask
    advantages = masked_whiten(tiled, response_mask) * response_mask
    return advantages, advantages


@hookimpl
def hybridflow_register_estimators(register):
    register(
        AdvantageEstimator(
            name="reinforce_plus_plus_baseline", fn=reinforce_plus_plus_baseline_advantage, needs_groups=True
        )
    )

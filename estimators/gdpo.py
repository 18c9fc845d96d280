"""GDPO: group reward-decoupled normalization policy optimization (arXiv:2601.05242), as veRL's ``gdpo``.

With several rewards (say correctness and format), GRPO on their sum lets
the widest one drown the others. GDPO normalizes each component within the
group first, then mixes, then whitens over the batch. With c_{i,k} the score
of response i under component k (column k of ``reward_components``) and
weights w_k (default 1)::

    A_{i,k} = (c_{i,k} - mean_g(c_k)) / (std_g(c_k) + epsilon)   # GRPO per component; std unbiased
    S_{i,t} = (sum_k w_k A_{i,k}) * mask_{i,t}
    advantages = whiten(S over all valid tokens of the batch) * mask;  returns = advantages

A group of one has mean 0 and std 1 (GRPO's convention); without
``norm_by_std`` the group std is not divided. ``token_level_rewards`` is not
read: the components carry the signal. Shapes: rewards and mask (B, T),
index (B,), reward_components (B, K); outputs (B, T).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hybridflow.estimators.functional import group_mean_std, masked_whiten
from hybridflow.plugins import AdvantageEstimator, hookimpl
from hybridflow.plugins.entries import GROUP_IDS, REWARD_COMPONENT_SCORES


def gdpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: torch.Tensor,
    reward_components: torch.Tensor,
    *,
    reward_weights: Sequence[float] | None = None,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each reward component group-normalized on its own, weighted, summed, then whitened over the batch."""
    num = reward_components.shape[1]
    weights = torch.ones(num) if reward_weights is None else torch.tensor([float(w) for w in reward_weights])
    if weights.shape != (num,):
        raise ValueError(f"gdpo: {len(weights)} reward_weights for {num} reward components")
    mixed = torch.zeros_like(reward_components[:, 0])
    for k in range(num):
        mean, std, _ = group_mean_std(reward_components[:, k], index)
        normalized = reward_components[:, k] - mean
        mixed = mixed + weights[k] * (normalized / (std + epsilon) if norm_by_std else normalized)
    tiled = mixed.unsqueeze(-1) * response_mask
    advantages = masked_whiten(tiled, response_mask) * response_mask
    return advantages, advantages


@hookimpl
def hybridflow_register_estimators(register):
    register(AdvantageEstimator(name="gdpo", fn=gdpo_advantage, needs=(GROUP_IDS, REWARD_COMPONENT_SCORES)))

"""REINFORCE++ (Hu 2025, arXiv:2501.03262): discounted return, whitened over the batch.

Scanning each response backwards over its valid tokens::

    G_t = r_t + gamma * G_{t+1}          where mask_t = 1
    G_t = 0, and G carries through       where mask_t = 0

A masked position neither adds its reward nor discounts. Then::

    returns = G
    advantages = whiten(G over all valid tokens of the batch) * mask

Shapes: (B, T) in and out. No critic, no groups.
"""

from __future__ import annotations

import torch

from hybridflow.estimators.functional import masked_whiten
from hybridflow.plugins import AdvantageEstimator, hookimpl


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Return-to-go over valid tokens; zero at masked positions."""
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        valid = mask[:, t]
        running = torch.where(valid > 0, rewards[:, t] + gamma * running, running)
        returns[:, t] = running * valid
    return returns


def reinforce_plus_plus_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, *, gamma: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whitened discounted return-to-go."""
    returns = discounted_returns(token_level_rewards, response_mask, gamma)
    advantages = masked_whiten(returns, response_mask) * response_mask
    return advantages, returns


@hookimpl
def hybridflow_register_estimators(register):
    register(AdvantageEstimator(name="reinforce_plus_plus", fn=reinforce_plus_plus_advantage))

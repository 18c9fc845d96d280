"""GAE: generalized advantage estimation (Schulman et al. 2016, arXiv:1506.02438), for PPO.

Scanning backwards, with V_next and A_next updated only at valid positions
(a masked position carries them through unchanged)::

    delta_t = r_t + gamma * V_next - V_t
    A_t     = delta_t + gamma * lam * A_next
    returns = A + V                                  # before whitening
    advantages = whiten(A over all valid tokens of the batch)

As in veRL, masked positions of ``advantages`` are whitened, not zeroed: the
loss masks them. Needs a critic (``values``). Shapes: (B, T) in and out.
"""

from __future__ import annotations

import torch

from hybridflow.estimators.functional import masked_whiten
from hybridflow.plugins import AdvantageEstimator, hookimpl


def gae_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    values: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimates and value targets."""
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * next_adv
        advantages[:, t] = adv_t
        valid = response_mask[:, t] > 0
        next_value = torch.where(valid, values[:, t], next_value)
        next_adv = torch.where(valid, adv_t, next_adv)
    returns = advantages + values
    return masked_whiten(advantages, response_mask), returns


@hookimpl
def hybridflow_register_estimators(register):
    register(AdvantageEstimator(name="gae", fn=gae_advantage, needs_critic=True))

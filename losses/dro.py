"""DRO: direct reward optimization (Richemond et al. 2024, arXiv:2405.19107), as veRL's ``dro``.

A REINFORCE term with a quadratic penalty on the log-ratio in place of a
clip: the farther a token's log-probability moves from the old policy's, the
harder it is pulled back. Per token::

    loss = -(A * log pi - dro_beta / 2 * (log pi - log pi_old)^2) * w
    d loss / d log pi = -A + dro_beta * (log pi - log pi_old)

(w: rollout-correction weights, 1 when not given; the log-ratio is not
clamped, as in veRL). ``dro_beta`` has no default: as in veRL it must be set
to a positive value (``actor.policy_loss_options.dro_beta``).
"""

from __future__ import annotations

import torch

from hybridflow.losses.functional import masked_mean, reweight
from hybridflow.plugins import PolicyLoss, hookimpl


def dro_loss(
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    dro_beta: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE with a quadratic penalty on the log-ratio to the old policy."""
    if dro_beta is None or dro_beta <= 0:
        raise ValueError(f"the dro loss needs a positive dro_beta (actor.policy_loss_options.dro_beta), got {dro_beta}")
    log_ratio = log_probs - old_log_probs
    token_losses = -(advantages * log_probs - 0.5 * dro_beta * log_ratio.square())
    with torch.no_grad():
        metrics = {"ppo_kl": float(masked_mean(-log_ratio, response_mask.to(log_ratio.dtype)))}
    return reweight(token_losses, rollout_is_weights), metrics


@hookimpl
def hybridflow_register_policy_losses(register):
    register(PolicyLoss(name="dro", fn=dro_loss))

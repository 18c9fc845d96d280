"""SAPO: soft adaptive policy optimization (Qwen, arXiv:2511.20347), as veRL's ``sapo``.

A smooth gate on the ratio replaces PPO's hard clip: near r = 1 the
gradient is the policy gradient, and it fades (instead of dropping to zero)
as the ratio moves away, faster for negative advantages. Per token, with
r = exp(log pi - log pi_old) (log-ratio clamped to [-20, 20])::

    tau  = tau_pos if A > 0 else tau_neg
    f(r) = sigmoid(tau * (r - 1)) * 4 / tau        # f'(1) = 1, like r itself
    loss = -f(r) * A * w
    d loss / d log pi = -A * 4 * sigmoid(tau (r - 1)) * (1 - sigmoid(tau (r - 1))) * r

(w: rollout-correction weights, 1 when not given). Defaults are veRL's
(``tau_pos`` 1.0, ``tau_neg`` 1.05). veRL always aggregates SAPO with
``seq-mean-token-mean``; here the actor's ``loss_agg_mode`` decides, so set
it to that to match.
"""

from __future__ import annotations

import torch

from hybridflow.losses.functional import clamped_log_ratio, masked_mean, reweight
from hybridflow.plugins import PolicyLoss, hookimpl


def sapo_loss(
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy gradient through a sigmoid gate on the ratio instead of a hard clip."""
    log_ratio = clamped_log_ratio(log_probs, old_log_probs)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, tau_pos, tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    token_losses = -gate * advantages
    with torch.no_grad():
        metrics = {"ppo_kl": float(masked_mean(-log_ratio, response_mask.to(ratio.dtype)))}
    return reweight(token_losses, rollout_is_weights), metrics


@hookimpl
def hybridflow_register_policy_losses(register):
    register(PolicyLoss(name="sapo", fn=sapo_loss))

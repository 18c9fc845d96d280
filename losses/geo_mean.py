"""GMPO: geometric-mean policy optimization (Zhao et al. 2025, arXiv:2507.20673), as veRL's ``geo_mean``.

GRPO averages token ratios arithmetically, so one outlier token sets the
step; GMPO takes the geometric mean of the (clipped) token ratios of a
sequence. Per sequence i, with d_t = log pi_t - log pi_old_t (not clamped,
as in veRL), sgn = sign(A_t), |y_i| valid tokens, w rollout-correction
weights (1 when not given)::

    d'_t   = sgn * min(sgn * d_t, sgn * clip(d_t, -clip_ratio_low, clip_ratio_high))   # clip in log space
    rho_i  = exp(sum_t mask_t d'_t / (|y_i| + 1e-8))                                     # geometric mean ratio
    A_i    = sum_t mask_t A_t / (|y_i| + 1e-8)                                           # sequence advantage
    W_i    = exp(sum_t mask_t log(w_t + 1e-10) / (|y_i| + 1e-8))                         # geometric mean weight
    L_i    = -A_i * rho_i * W_i

The loss is per sequence; it is returned at every token of the sequence
(loss_{i,t} = L_i), so the actor's ``seq-mean-token-mean`` gives
mean_i L_i, veRL's aggregation (which ignores ``loss_agg_mode``). The paper's
clip range is wide, ratios in (e^-0.4, e^0.4), hence the defaults (veRL
reads its actor's generic 0.2). Diagnostics:
``pg_clipfrac`` / ``pg_clipfrac_lower`` (tokens clipped with A > 0 / A < 0),
``ppo_kl``.
"""

from __future__ import annotations

import torch

from hybridflow.losses.functional import masked_mean
from hybridflow.plugins import PolicyLoss, hookimpl


def geo_mean_loss(
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.4,
    clip_ratio_high: float = 0.4,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Sequence loss on the geometric mean of the token ratios, clipped per token in log space."""
    mask = response_mask.to(log_probs.dtype)
    log_ratio = log_probs - old_log_probs
    sign = torch.sign(advantages)
    clipped = torch.clamp(log_ratio, -clip_ratio_low, clip_ratio_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped)
    length = mask.sum(-1) + 1e-8
    seq_ratio = torch.exp((pessimistic * mask).sum(-1) / length)
    seq_loss = -(advantages * mask).sum(-1) / length * seq_ratio
    if rollout_is_weights is not None:  # the weights of a sequence loss: their geometric mean over its tokens
        seq_loss = seq_loss * torch.exp((torch.log(rollout_is_weights.detach() + 1e-10) * mask).sum(-1) / length)
    with torch.no_grad():
        was_clipped = (log_ratio != clipped).to(mask.dtype)
        metrics = {
            "pg_clipfrac": float(masked_mean(was_clipped * (advantages > 0), mask)),
            "pg_clipfrac_lower": float(masked_mean(was_clipped * (advantages < 0), mask)),
            "ppo_kl": float(masked_mean(-log_ratio, mask)),
        }
    return seq_loss.unsqueeze(-1).expand_as(log_probs), metrics


@hookimpl
def hybridflow_register_policy_losses(register):
    register(PolicyLoss(name="geo_mean", fn=geo_mean_loss))

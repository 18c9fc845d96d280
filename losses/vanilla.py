"""PPO's clipped surrogate (Schulman et al. 2017, arXiv:1707.06347) with dual clip (Ye et al. 2020, arXiv:1912.09729).

Per token, with ratio r = exp(log pi - log pi_old) (log-ratio clamped to [-20, 20])::

    pg_loss1 = -A * r
    pg_loss2 = -A * clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clipped  = max(pg_loss1, pg_loss2)
    loss     = min(clipped, -A * clip_ratio_c)   if A < 0   # dual clip bounds the loss of a negative advantage
               clipped                           otherwise
    loss     = loss * w                          # rollout-correction weights, when given

Diagnostics (no gradient): ``pg_clipfrac`` (share of tokens where the clip
is active), ``pg_clipfrac_lower`` (where the dual clip is), ``ppo_kl`` (mean
of log pi_old - log pi).
"""

from __future__ import annotations

import torch

from hybridflow.losses.functional import clamped_log_ratio, masked_mean, reweight
from hybridflow.plugins import PolicyLoss, hookimpl


def ppo_clip_loss(
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate per token, with the dual clip for negative advantages."""
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1.0 (it bounds -A * ratio from above), got {clip_ratio_c}")
    log_ratio = clamped_log_ratio(log_probs, old_log_probs)
    ratio = torch.exp(log_ratio)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    clipped = torch.maximum(pg_loss1, pg_loss2)
    pg_loss3 = -advantages * clip_ratio_c
    token_losses = torch.where(advantages < 0, torch.minimum(clipped, pg_loss3), clipped)
    with torch.no_grad():
        mask = response_mask.to(ratio.dtype)
        metrics = {
            "pg_clipfrac": float(masked_mean((pg_loss2 > pg_loss1).to(mask.dtype), mask)),
            "pg_clipfrac_lower": float(masked_mean(((clipped > pg_loss3) & (advantages < 0)).to(mask.dtype), mask)),
            "ppo_kl": float(masked_mean(-log_ratio, mask)),
        }
    return reweight(token_losses, rollout_is_weights), metrics


@hookimpl
def hybridflow_register_policy_losses(register):
    register(PolicyLoss(name="vanilla", fn=ppo_clip_loss))

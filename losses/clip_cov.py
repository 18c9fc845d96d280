"""Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", arXiv:2505.22617), as veRL's
``clip_cov``.

Entropy collapses because the tokens with the largest covariance between
advantage and log-probability dominate the update. Clip-Cov detaches a
small random share of those tokens. On the valid tokens of the batch, with
the PPO terms pg1 = -A r, pg2 = -A clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)
(r = exp(log pi - log pi_old), not clamped, as in veRL)::

    cov_t = (A_t - mean(A)) * (log pi_t - mean(log pi))          # means over valid tokens
    candidates = valid tokens with clip_cov_lb < cov_t < clip_cov_ub not already clipped (pg2 <= pg1)
    drop = max(1, floor(clip_cov_ratio * #valid)) candidates, chosen uniformly at random
    loss = max(pg1, pg2) * (0 if dropped else 1) * w

(w: rollout-correction weights, 1 when not given). The choice uses torch's
global generator (seed it for reproducibility). ``pg_clipfrac`` is the share
of valid tokens dropped. Defaults are veRL's.
"""

from __future__ import annotations

import torch

from hybridflow.losses.functional import masked_mean, reweight, token_covariance
from hybridflow.plugins import PolicyLoss, hookimpl


def clip_cov_loss(
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate with the gradient of a few high-covariance tokens removed."""
    if clip_cov_ratio <= 0:
        raise ValueError(f"clip_cov_ratio must be > 0, got {clip_cov_ratio}")
    log_ratio = log_probs - old_log_probs
    ratio = torch.exp(log_ratio)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    with torch.no_grad():
        mask = response_mask.to(ratio.dtype)
        valid = mask > 0
        cov = token_covariance(advantages, log_probs, mask)
        candidates = valid & (pg_loss2 <= pg_loss1) & (cov > clip_cov_lb) & (cov < clip_cov_ub)
        where = candidates.nonzero()
        chosen = where[torch.randperm(len(where))[: max(int(clip_cov_ratio * valid.sum().item()), 1)]]
        keep = torch.ones_like(ratio)
        keep[chosen[:, 0], chosen[:, 1]] = 0.0
        metrics = {"pg_clipfrac": float(masked_mean(1.0 - keep, mask)), "ppo_kl": float(masked_mean(-log_ratio, mask))}
    token_losses = torch.maximum(pg_loss1, pg_loss2) * keep
    return reweight(token_losses, rollout_is_weights), metrics


@hookimpl
def hybridflow_register_policy_losses(register):
    register(PolicyLoss(name="clip_cov", fn=clip_cov_loss))

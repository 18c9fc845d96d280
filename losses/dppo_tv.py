"""DPPO-Binary-TV (Qi et al. 2026, arXiv:2602.04879), as veRL's ``dppo_tv``: PPO with a TV trust region.

PPO's ratio clip over-penalizes rare tokens (a tiny probability doubles
easily) and under-penalizes likely ones (0.99 -> 0.8 is a ratio of 0.81).
DPPO keeps a token in the update while the policy's move on it, measured as
a divergence between p = pi(a) and p_old = pi_old(a), stays inside the trust
region in the direction the advantage pushes; outside it the token's
gradient is dropped. Per token, with r = exp(log pi - log pi_old)
(log-ratio clamped to [-20, 20])::

    keep = (p - p_old <= clip_ratio_high)   if A > 0       # binary TV, the direction A pushes p
           (p - p_old >= -clip_ratio_low)   otherwise
    loss = -A * sg[min(r, clip_ratio_c)] * log pi * sg[keep] * w
    d loss / d log pi = -A * min(r, clip_ratio_c) * keep

(w: rollout-correction weights, 1 when not given). The truncated ratio is an
importance weight with no gradient (truncated IS, not a surrogate).
``clip_ratio_low``/``clip_ratio_high`` are divergence thresholds, not ratio
bounds; the defaults are the paper's (veRL's DPPO example: 0.15), and
``clip_ratio_c`` is the truncation veRL's loss falls back to (20).
Diagnostics: ``pg_clipfrac`` (share of valid tokens dropped),
``pg_clipfrac_lower`` (kept tokens whose ratio was truncated), ``ppo_kl``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hybridflow.losses.functional import clamped_log_ratio, masked_mean, reweight
from hybridflow.plugins import PolicyLoss, hookimpl

TrustRegion = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float, float], torch.Tensor]


def binary_tv_region(
    log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor, low: float, high: float
) -> torch.Tensor:
    """Tokens whose probability moved less than the threshold in the direction the advantage pushes."""
    moved = log_probs.exp() - old_log_probs.exp()
    return torch.where(advantages > 0, moved <= high, moved >= -low)


def dppo_token_losses(
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    region: TrustRegion,
    low: float,
    high: float,
    clip_ratio_c: float,
    rollout_is_weights: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The DPPO loss for a trust ``region`` (shared by ``dppo_tv`` and ``dppo_kl``)."""
    log_ratio = clamped_log_ratio(log_probs, old_log_probs)
    ratio = torch.exp(log_ratio)
    truncated = torch.clamp(ratio, max=clip_ratio_c).detach()
    keep = region(log_probs.detach(), old_log_probs, advantages, low, high).to(ratio.dtype)
    token_losses = -advantages * truncated * log_probs * keep
    with torch.no_grad():
        mask = response_mask.to(ratio.dtype)
        metrics = {
            "pg_clipfrac": float(masked_mean(1.0 - keep, mask)),
            "pg_clipfrac_lower": float(masked_mean((ratio > clip_ratio_c).to(mask.dtype) * keep, mask)),
            "ppo_kl": float(masked_mean(-log_ratio, mask)),
        }
    return reweight(token_losses, rollout_is_weights), metrics


def dppo_tv_loss(
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.15,
    clip_ratio_high: float = 0.15,
    clip_ratio_c: float = 20.0,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated-IS policy gradient on the tokens inside a binary total-variation trust region."""
    return dppo_token_losses(
        old_log_probs, log_probs, advantages, response_mask, binary_tv_region,
        clip_ratio_low, clip_ratio_high, clip_ratio_c, rollout_is_weights,
    )  # fmt: skip


@hookimpl
def hybridflow_register_policy_losses(register):
    register(PolicyLoss(name="dppo_tv", fn=dppo_tv_loss))

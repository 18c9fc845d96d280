"""CISPO: clipped importance-sampling policy optimization (MiniMax-M1, arXiv:2506.13585), as veRL's ``cispo``.

PPO's clip zeroes the gradient of every token whose ratio left the trust
region, and those are often the rare "fork" tokens of a reasoning chain.
CISPO clips the importance weight instead and stops its gradient, so every
token keeps a REINFORCE gradient, scaled by a bounded weight. Per token,
with r = exp(log pi - log pi_old) (log-ratio clamped to [-20, 20])::

    loss = -sg[clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)] * A * log pi * w
    d loss / d log pi = -clip(r, ...) * A          # never zero, unlike PPO's clip

(w: rollout-correction weights, 1 when not given). The paper sets no real
lower bound (a large ``clip_ratio_low``) and tunes the upper one; the
defaults are veRL's (its actor's clip ratios). ``pg_clipfrac`` is the share
of valid tokens whose weight was clipped.
"""

from __future__ import annotations

import torch

from hybridflow.losses.functional import clamped_log_ratio, masked_mean, reweight
from hybridflow.plugins import PolicyLoss, hookimpl


def cispo_loss(
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE on every token, weighted by the clipped, stop-gradient importance ratio."""
    log_ratio = clamped_log_ratio(log_probs, old_log_probs)
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high).detach()
    token_losses = -clipped * advantages * log_probs
    with torch.no_grad():
        mask = response_mask.to(ratio.dtype)
        metrics = {
            "pg_clipfrac": float(masked_mean((ratio != clipped).to(mask.dtype), mask)),
            "ppo_kl": float(masked_mean(-log_ratio, mask)),
        }
    return reweight(token_losses, rollout_is_weights), metrics


@hookimpl
def hybridflow_register_policy_losses(register):
    register(PolicyLoss(name="cispo", fn=cispo_loss))

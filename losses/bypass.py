"""Rollout correction's bypass mode: the rollout's log-probs serve as the old log-probs (veRL's ``bypass_mode``).

Decoupled correction keeps three policies: pi_rollout sampled, pi_old is
recomputed by a teacher-forced pass, pi_current trains, and the weights
pi_old / pi_rollout (``losses/rollout_correction.py``) multiply the loss.
Bypass mode drops pi_old: the ratio's denominator is pi_rollout itself, so the
recompute pass is skipped (``algorithm.rollout_correction.bypass_mode``). As
veRL's ``compute_policy_loss_bypass_mode``, per micro-batch, with
r = pi_current / pi_rollout (token level; its product over the row at
sequence level) and w the ``rollout_is`` weights of r, truncated or masked,
no gradient::

    ppo_clip    loss = vanilla PPO clip of r       # the ratio is the correction: no w on top
    reinforce   loss = -A * log pi_current * w     # w = 1 when rollout_is is null; no clipping

The masked tokens (``rollout_is_mode=mask``, veRL's rejection sampling)
leave the policy term under either type; the actor keeps the full mask for
its entropy and KL terms, and the mini-batch counts of the aggregation are
taken before the rejection, as veRL's global batch counts are. The
diagnostics are ``ppo_kl`` (the mean of log pi_rollout - log pi_current; and
the PPO clip's own under ``ppo_clip``) and the ``rollout_corr/`` weight
statistics of :func:`~hybridflow.losses.rollout_correction.rollout_correction`
on this micro-batch.
"""

from __future__ import annotations

from typing import Any

import torch

from hybridflow.losses.functional import masked_mean
from hybridflow.losses.rollout_correction import rollout_correction
from hybridflow.losses.vanilla import ppo_clip_loss

BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")


def bypass_policy_loss(
    rollout_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_type: str = "ppo_clip",
    correction: dict[str, Any] | None = None,
    ppo_options: dict[str, Any] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Per-token losses (B, T), the mask of the policy term (B, T) and diagnostics.

    :param correction: keyword arguments of :func:`rollout_correction` (``rollout_is``, its mode, thresholds,
        batch normalization) for the weights of pi_current / pi_rollout; None: no weights, no rejection.
    :param ppo_options: options of the vanilla PPO clip (``clip_ratio_low``, ...), for ``ppo_clip``.
    """
    if loss_type not in BYPASS_LOSS_TYPES:
        raise ValueError(f"loss_type={loss_type!r}; allowed: {', '.join(BYPASS_LOSS_TYPES)}")
    weights, mask, metrics = None, response_mask, {}
    if correction is not None:
        out = rollout_correction(log_probs.detach(), rollout_log_probs, response_mask, **correction)
        weights, mask, metrics = out.weights, out.response_mask, dict(out.metrics)
    if loss_type == "ppo_clip":
        token_losses, loss_metrics = ppo_clip_loss(
            rollout_log_probs, log_probs, advantages, mask, **(ppo_options or {})
        )
        return token_losses, mask, {**loss_metrics, **metrics}
    token_losses = -advantages * log_probs * (1.0 if weights is None else weights.detach())
    with torch.no_grad():
        metrics["ppo_kl"] = float(masked_mean(rollout_log_probs - log_probs, mask.to(log_probs.dtype)))
    return token_losses, mask, metrics

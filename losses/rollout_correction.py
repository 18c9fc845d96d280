"""Rollout correction: importance weights between the rollout policy and the training policy.

The rollout engine (vLLM in bf16, say) and the trainer (FSDP in fp32) give a
sampled token slightly different probabilities, and an asynchronous rollout
may sample with stale weights. The loss is an expectation under the training
policy pi_old, but the tokens came from pi_rollout; reweighting by
w = pi_old / pi_rollout corrects that. Names and semantics follow veRL's
``rollout_corr_helper`` (``rollout_is``, ``rollout_is_threshold``,
``rollout_is_batch_normalize``, its metric names)::

    token level      log w_{i,t} = old_log_probs_{i,t} - rollout_log_probs_{i,t}
    sequence level   log w_i = sum_t mask_{i,t} (old - rollout)_{i,t}, shared by row i's tokens
    w = exp(clamp(log w, -20, 20)) * mask

    truncate (TIS)      weights = min(w, C)                 C = rollout_is_threshold; mask unchanged
    mask (IcePop, RS)   keep = lower <= w <= C              lower = rollout_is_threshold_lower (default 1 / C)
                        weights = w * keep;  response_mask = response_mask * keep

At sequence level a sequence whose product weight is out of bounds is
dropped whole. veRL selects the mask mode by writing the threshold as a
``"lower_upper"`` string (IcePop: weights zeroed) and drops tokens from the
mask with its rejection sampler (``rollout_rs="token_k1"`` /
``"seq_sum_k1"``); here one typed option, ``rollout_is_mode``, does both.
``rollout_is_batch_normalize`` divides the weights by their mean (over valid
tokens, or over non-empty sequences at sequence level) after truncation or
masking. The driver calls this once on the whole batch, before the update;
the weights carry no gradient.

Metrics, all under ``rollout_corr/``, taken before batch normalization as
veRL reports them:

- ``rollout_is_mean``, ``rollout_is_max``, ``rollout_is_min``: the weights
  applied, over valid tokens;
- ``rollout_is_ratio_fraction_high`` / ``_low``: share of raw weights above
  C (the truncated ones, in TIS mode) / below the lower bound, over valid
  tokens, or over non-empty sequences at sequence level;
- ``rollout_is_eff_sample_size``: 1 / mean((w / mean w)^2), a share of the tokens;
- ``rollout_rs_masked_fraction`` / ``rollout_rs_seq_masked_fraction``: valid
  tokens dropped / non-empty sequences with a dropped token (0 when truncating);
- ``kl``, ``k3_kl``: KL(pi_rollout || pi_old) as the mean of rollout - old,
  and of w - log w - 1 (token-level w);
- ``rollout_is_batch_norm_factor``: the mean divided by, when normalizing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridflow.losses.functional import masked_mean

ROLLOUT_IS_LEVELS = ("token", "sequence")
ROLLOUT_IS_MODES = ("truncate", "mask")


@dataclass(frozen=True)
class RolloutCorrection:
    """What :func:`rollout_correction` returns.

    ``weights``: (B, T) float, no gradient, 0 outside the returned mask;
    the batch column ``rollout_is_weights`` the losses multiply by.
    ``response_mask``: (B, T), the input mask with dropped tokens removed
    (unchanged when truncating); the driver replaces ``response_mask`` with it.
    ``metrics``: float diagnostics, keys prefixed ``rollout_corr/``.
    """

    weights: torch.Tensor
    response_mask: torch.Tensor
    metrics: dict[str, float]


@torch.no_grad()
def rollout_correction(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    rollout_is: str = "token",
    rollout_is_mode: str = "truncate",
    rollout_is_threshold: float = 2.0,
    rollout_is_threshold_lower: float | None = None,
    rollout_is_batch_normalize: bool = False,
) -> RolloutCorrection:
    """Importance weights pi_old / pi_rollout per token or sequence, truncated or masked, with diagnostics."""
    if old_log_probs.shape != rollout_log_probs.shape or old_log_probs.shape != response_mask.shape:
        raise ValueError(
            f"old_log_probs {tuple(old_log_probs.shape)}, rollout_log_probs {tuple(rollout_log_probs.shape)} and "
            f"response_mask {tuple(response_mask.shape)} must have one (B, T) shape"
        )
    if rollout_is not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"rollout_is={rollout_is!r}; allowed: {', '.join(ROLLOUT_IS_LEVELS)}")
    if rollout_is_mode not in ROLLOUT_IS_MODES:
        raise ValueError(f"rollout_is_mode={rollout_is_mode!r}; allowed: {', '.join(ROLLOUT_IS_MODES)}")
    upper = float(rollout_is_threshold)
    lower = 1.0 / upper if rollout_is_threshold_lower is None else float(rollout_is_threshold_lower)
    if not 0 < lower <= upper:
        raise ValueError(f"rollout correction needs 0 < lower <= upper, got lower={lower}, upper={upper}")

    mask = response_mask.to(old_log_probs.dtype)
    log_ratio = (old_log_probs - rollout_log_probs).detach()
    log_w = (log_ratio * mask).sum(-1, keepdim=True).expand_as(log_ratio) if rollout_is == "sequence" else log_ratio
    raw = torch.exp(log_w.clamp(min=-20.0, max=20.0)) * mask
    high, low = (raw > upper) & (mask > 0), (raw < lower) & (mask > 0)
    if rollout_is_mode == "truncate":
        keep = mask
        weights = raw.clamp(max=upper)
    else:
        keep = mask * ~(high | low)
        weights = raw * keep

    metrics = _diagnostics(weights, keep, high, low, mask, rollout_is)
    metrics["kl"] = masked_mean(rollout_log_probs - old_log_probs, mask)
    metrics["k3_kl"] = masked_mean(torch.expm1(log_ratio) - log_ratio, mask)  # E[w - log w - 1] at token level
    if rollout_is_batch_normalize:
        # at sequence level each row has one weight (its valid tokens share it): average rows, not tokens
        norm = masked_mean(weights, mask) if rollout_is == "token" else _share(weights, mask, "sequence")
        weights = weights / norm if norm > 1e-8 else weights
        metrics["rollout_is_batch_norm_factor"] = norm if norm > 1e-8 else torch.tensor(1.0)
    new_mask = (response_mask * keep.to(response_mask.dtype)).to(response_mask.dtype)
    return RolloutCorrection(weights, new_mask, {f"rollout_corr/{k}": float(v) for k, v in metrics.items()})


def _diagnostics(
    weights: torch.Tensor, keep: torch.Tensor, high: torch.Tensor, low: torch.Tensor, mask: torch.Tensor, level: str
) -> dict[str, torch.Tensor]:
    """The weight statistics of the module docstring (before batch normalization, as veRL reports them)."""
    valid = mask > 0
    normalized = weights / (masked_mean(weights, mask) + 1e-8)
    return {
        "rollout_is_mean": masked_mean(weights, mask),
        "rollout_is_max": weights[valid].max() if valid.any() else torch.tensor(0.0),
        "rollout_is_min": weights[valid].min() if valid.any() else torch.tensor(0.0),
        "rollout_is_ratio_fraction_high": _share(high, mask, level),
        "rollout_is_ratio_fraction_low": _share(low, mask, level),
        "rollout_is_eff_sample_size": 1.0 / masked_mean(normalized.square(), mask).clamp(min=1e-12),
        "rollout_rs_masked_fraction": masked_mean(mask - keep, mask),
        "rollout_rs_seq_masked_fraction": _share(mask - keep, mask, "sequence"),
    }


def _share(values: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """Mean of ``values`` over valid tokens (``token``), or of each non-empty row's largest value (``sequence``).

    For a 0/1 flag the sequence level is the share of non-empty rows where it
    holds at some valid token; for a weight shared by a row's tokens, its mean
    over rows.
    """
    values = values.to(mask.dtype) * mask
    if level == "token":
        return masked_mean(values, mask)
    return masked_mean(values.amax(-1), (mask.sum(-1) > 0).to(mask.dtype))

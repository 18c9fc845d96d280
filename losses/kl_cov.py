"""KL-Cov (Cui et al. 2025, arXiv:2505.22617), as veRL's ``kl_cov``: a KL penalty on the highest-covariance tokens.

The companion of ``clip_cov``: instead of detaching high-covariance tokens,
penalize their move away from the old policy. On the valid tokens of the
batch, with r = exp(log pi - log pi_old) (not clamped, as in veRL)::

    cov_t = (A_t - mean(A)) * (log pi_t - mean(log pi))        # means over valid tokens
    top   = the max(1, floor(kl_cov_ratio * #valid)) valid tokens with the largest cov
    loss  = (-A r + ppo_kl_coef * |log r|)   on top tokens
            -A r                              elsewhere (no clip)
    loss  = loss * w

(w: rollout-correction weights, 1 when not given). Defaults are veRL's
(``ppo_kl_coef`` 0.1 is its config default). ``ppo_kl`` is the mean |log r|,
as veRL reports it.
"""

from __future__ import annotations

import torch

from hybridflow.losses.functional import masked_mean, reweight, token_covariance
from hybridflow.plugins import PolicyLoss, hookimpl


def kl_cov_loss(
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    kl_cov_ratio: float = 2e-4,
    ppo_kl_coef: float = 0.1,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Unclipped surrogate plus an |log ratio| penalty on the tokens of largest advantage-log-prob covariance."""
    if kl_cov_ratio <= 0:
        raise ValueError(f"kl_cov_ratio must be > 0, got {kl_cov_ratio}")
    log_ratio = log_probs - old_log_probs
    surrogate = -advantages * torch.exp(log_ratio)
    with torch.no_grad():
        mask = response_mask.to(log_ratio.dtype)
        valid = mask > 0
        top = torch.zeros_like(valid)
        if valid.any():
            cov = token_covariance(advantages, log_probs, mask)[valid]
            picked = torch.topk(cov, max(1, int(len(cov) * kl_cov_ratio))).indices
            top[valid.nonzero()[picked].unbind(-1)] = True
        metrics = {"ppo_kl": float(masked_mean(log_ratio.abs(), mask))}
    token_losses = torch.where(top, surrogate + ppo_kl_coef * log_ratio.abs(), surrogate)
    return reweight(token_losses, rollout_is_weights), metrics


@hookimpl
def hybridflow_register_policy_losses(register):
    register(PolicyLoss(name="kl_cov", fn=kl_cov_loss))

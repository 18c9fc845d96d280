"""Small helpers the policy losses share: the clamped log-ratio and the rollout-correction reweighting.

Diagnostics use :func:`~hybridflow.core.masked.masked_mean`
(re-exported here), so the codebase keeps one masked mean.
"""

from __future__ import annotations

import torch

from hybridflow.core.masked import masked_mean

__all__ = ["clamped_log_ratio", "masked_mean", "reweight", "token_covariance"]


def clamped_log_ratio(log_probs: torch.Tensor, old_log_probs: torch.Tensor) -> torch.Tensor:
    """``log pi - log pi_old`` clamped to [-20, 20] (veRL's bound), so ``exp`` of it cannot overflow."""
    return torch.clamp(log_probs - old_log_probs, min=-20.0, max=20.0)


def token_covariance(advantages: torch.Tensor, log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``(A_t - mean A) * (log pi_t - mean log pi)`` per token, means over valid tokens, no gradient (Clip-/KL-Cov)."""
    with torch.no_grad():
        return (advantages - masked_mean(advantages, mask)) * (log_probs - masked_mean(log_probs, mask))


def reweight(token_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    """Per-token losses times the rollout-correction weights; unchanged when there are none.

    The weights change the measure the loss averages over, not the objective,
    so no gradient flows through them even if a caller forgot to detach.
    """
    if rollout_is_weights is None:
        return token_losses
    if rollout_is_weights.shape != token_losses.shape:
        raise ValueError(
            f"rollout_is_weights has shape {tuple(rollout_is_weights.shape)}, "
            f"the token losses {tuple(token_losses.shape)}"
        )
    return token_losses * rollout_is_weights.detach()

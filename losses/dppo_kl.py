"""DPPO-Binary-KL (Qi et al. 2026, arXiv:2602.04879), as veRL's ``dppo_kl``: DPPO with a binary-KL trust region.

The loss of ``dppo_tv`` with the divergence measured as the KL between the
two Bernoulli distributions "this token or not" under pi_old and pi, with
p = pi(a), p_old = pi_old(a)::

    D = p_old * log(p_old / p) + (1 - p_old) * log((1 - p_old + 1e-8) / (1 - p + 1e-8))
    keep = (D <= clip_ratio_high) or (p <= p_old)    if A > 0   # only a move up can leave the region
           (D <= clip_ratio_low)  or (p >= p_old)    otherwise
    loss = -A * sg[min(r, clip_ratio_c)] * log pi * sg[keep] * w

(w: rollout-correction weights, 1 when not given). The defaults are the
paper's thresholds (veRL's DPPO example: 0.05) and veRL's truncation
fallback (20). Diagnostics as in ``dppo_tv``.
"""

from __future__ import annotations

import torch

from hybridflow.losses.dppo_tv import dppo_token_losses
from hybridflow.plugins import PolicyLoss, hookimpl


def binary_kl_region(
    log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor, low: float, high: float
) -> torch.Tensor:
    """Tokens whose Bernoulli KL stays under the threshold, or that moved against the advantage's push."""
    prob, old_prob = log_probs.exp(), old_log_probs.exp()
    divergence = old_prob * (old_log_probs - log_probs) + (1 - old_prob) * torch.log(
        (1 - old_prob + 1e-8) / (1 - prob + 1e-8)
    )
    return torch.where(
        advantages > 0, (divergence <= high) | (prob <= old_prob), (divergence <= low) | (prob >= old_prob)
    )


def dppo_kl_loss(
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.05,
    clip_ratio_high: float = 0.05,
    clip_ratio_c: float = 20.0,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated-IS policy gradient on the tokens inside a binary-KL trust region."""
    return dppo_token_losses(
        old_log_probs, log_probs, advantages, response_mask, binary_kl_region,
        clip_ratio_low, clip_ratio_high, clip_ratio_c, rollout_is_weights,
    )  # fmt: skip


@hookimpl
def hybridflow_register_policy_losses(register):
    register(PolicyLoss(name="dppo_kl", fn=dppo_kl_loss))

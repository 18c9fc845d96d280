"""GSPO: group sequence policy optimization (Zheng et al. 2025, arXiv:2507.18071).

The importance ratio is taken per *sequence*, as the geometric mean of the
token ratios over the valid tokens, so one wild token cannot dominate::

    log s_i   = mean_t (log pi_{i,t} - log pi_old_{i,t})          # over valid tokens
    s_{i,t}   = sg[s_i] * pi_{i,t} / sg[pi_{i,t}]                  # value s_i, token-level gradient
    loss_{i,t} = max(-A_{i,t} * s_{i,t}, -A_{i,t} * clip(s_{i,t}, 1 - clip_ratio_low, 1 + clip_ratio_high)) * w_{i,t}

(w: rollout-correction weights, 1 when not given). The paper's clip range is
tiny (3e-4 / 4e-4) because s_i is a per-token average; pair it with
``loss_agg_mode=seq-mean-token-mean`` (veRL always aggregates GSPO that way).
"""

from __future__ import annotations

import torch

from hybridflow.losses.functional import masked_mean, reweight
from hybridflow.plugins import PolicyLoss, hookimpl


def gspo_loss(
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: float = 4e-4,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Sequence-level clipped surrogate with token-level gradients."""
    mask = response_mask.to(log_probs.dtype)
    seq_log_ratio = ((log_probs - old_log_probs) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    log_ratio = seq_log_ratio.detach().unsqueeze(-1) + log_probs - log_probs.detach()
    ratio = torch.exp(torch.clamp(log_ratio, max=10.0))
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)
    token_losses = torch.maximum(pg_loss1, pg_loss2)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": float(masked_mean((pg_loss2 > pg_loss1).to(mask.dtype), mask)),
            "ppo_kl": float(masked_mean((old_log_probs - log_probs), mask)),
        }
    return reweight(token_losses, rollout_is_weights), metrics


@hookimpl
def hybridflow_register_policy_losses(register):
    register(PolicyLoss(name="gspo", fn=gspo_loss))

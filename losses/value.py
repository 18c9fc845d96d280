"""The critic's clipped value loss (PPO, as in OpenAI baselines' ppo2).

Per token, with old values V_old from before the update and returns R::

    V_clipped = V_old + clip(V - V_old, -cliprange, cliprange)
    loss      = 0.5 * max((V - R)^2, (V_clipped - R)^2)

``vf_clipfrac`` is the share of valid tokens where the clipped term wins.
"""

from __future__ import annotations

import torch


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, response_mask: torch.Tensor, cliprange: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token clipped value loss (B, T) and diagnostics."""
    clipped = old_values + torch.clamp(values - old_values, -cliprange, cliprange)
    loss_unclipped = (values - returns).square()
    loss_clipped = (clipped - returns).square()
    token_losses = 0.5 * torch.maximum(loss_unclipped, loss_clipped)
    with torch.no_grad():
        mask = response_mask.to(values.dtype)
        clipfrac = float(((loss_clipped > loss_unclipped).to(mask.dtype) * mask).sum() / mask.sum().clamp(min=1))
    return token_losses, {"critic/vf_clipfrac": clipfrac}

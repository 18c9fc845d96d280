"""Statistics over the valid positions of a padded batch, shared by the estimators and the losses."""

from __future__ import annotations

import torch

__all__ = ["masked_mean"]


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is 1 (a scalar tensor; 0 when nothing is valid)."""
    return (x * mask).sum() / mask.sum().clamp(min=1)

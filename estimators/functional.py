"""Small tensor helpers the estimators share: whitening and group statistics (``masked_mean`` itself is in
:mod:`hybridflow.core.masked`, shared with the losses)."""

from __future__ import annotations

import torch

from hybridflow.core.masked import masked_mean


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` with mean and unbiased variance over valid positions.

    Masked positions are transformed too (not zeroed); callers that want
    zeros there multiply by the mask. Needs at least two valid positions.
    """
    n = mask.sum()
    if n < 2:
        raise ValueError(f"whitening needs at least 2 valid tokens in the batch, got {int(n)}")
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask) * (n / (n - 1))
    return (x - mean) * torch.rsqrt(var + eps)


def group_mean_std(scores: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row mean, unbiased std and size of the row's group.

    :param scores: (B,) one score per response.
    :param index: (B,) int64 group id per row, in ``[0, num_groups)``.
    :returns: three (B,) tensors. A group of one gets mean 0 and std 1, so
        its normalized score is the raw score (veRL's convention).
    """
    num_groups = int(index.max()) + 1 if index.numel() else 0
    count = torch.bincount(index, minlength=num_groups).to(scores.dtype)
    mean = torch.zeros(num_groups, dtype=scores.dtype).index_add_(0, index, scores) / count
    sq_dev = torch.zeros(num_groups, dtype=scores.dtype).index_add_(0, index, (scores - mean[index]) ** 2)
    std = torch.sqrt(sq_dev / (count - 1).clamp(min=1))
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[index], std[index], count[index]


def group_sum(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """For each row, the sum of ``values`` over the rows of its group.

    :param values: (B, ...) one entry (or row of entries) per response.
    :param index: (B,) int64 group id per row, in ``[0, num_groups)``.
    :returns: same shape as ``values``.
    """
    num_groups = int(index.max()) + 1 if index.numel() else 0
    sums = torch.zeros((num_groups, *values.shape[1:]), dtype=values.dtype).index_add_(0, index, values)
    return sums[index]


def reward_to_go(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``G_t = sum_{s >= t} mask_s * r_s`` per row (undiscounted; masked positions keep the running sum)."""
    return (rewards * mask).flip(-1).cumsum(-1).flip(-1)

"""This rank's part and the whole of a tensor that may be a DTensor: the one place the code asks which it is.

FSDP2 and tensor parallelism hold parameters (and optimizer state) as DTensors; the same code also meets plain
tensors (a one-rank run, a buffer, a test). :func:`local` is this rank's shard, without communication;
:func:`full` is the whole tensor, a collective for a DTensor (every rank of its mesh calls it, in the same order).
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

__all__ = ["full", "local"]


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (a view, no communication); a plain tensor as it is."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: a DTensor gathered (collective over its mesh), a plain tensor detached (not copied)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor.detach()

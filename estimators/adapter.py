"""The one adapter from a DataProto to an estimator's tensors and back.

The driver calls ``compute_advantage(batch, cfg.algorithm.adv_estimator)``
and never branches on the estimator's name: what an estimator needs (a
critic's values, group ids) is declared in its registration and checked here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hybridflow.core import DataProto
from hybridflow.core.keys import ADVANTAGES, RESPONSE_MASK, RETURNS, TOKEN_LEVEL_REWARDS, UID, VALUES
from hybridflow.plugins import get_estimator


def group_index(uids: np.ndarray) -> torch.Tensor:
    """(B,) int64 group ids from a column of uids: equal uid, equal id."""
    _, inverse = np.unique(np.asarray(uids, dtype=str), return_inverse=True)
    return torch.from_numpy(inverse.astype(np.int64).reshape(-1))


def _tensor(batch: DataProto, key: str, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    if key not in batch.batch:
        raise KeyError(f"estimator {name!r} needs batch[{key!r}], which is missing; present: {sorted(batch.batch)}")
    value = batch.batch[key]
    if shape is not None and tuple(value.shape) != shape:
        raise ValueError(f"estimator {name!r}: batch[{key!r}] has shape {tuple(value.shape)}, expected {shape}")
    if value.dim() != 2:
        raise ValueError(f"estimator {name!r}: batch[{key!r}] must be 2-D (B, T), got shape {tuple(value.shape)}")
    if value.is_complex():
        raise TypeError(f"estimator {name!r}: batch[{key!r}] must be real, got {value.dtype}")
    return value.float()


def compute_advantage(batch: DataProto, name: str, **options: Any) -> DataProto:
    """Add ``advantages`` and ``returns`` (B, T) float32 to ``batch`` using the estimator ``name``.

    Reads ``token_level_rewards`` and ``response_mask`` (B, T), plus
    ``values`` (B, T) when the estimator needs a critic and the non-tensor
    ``uid`` column when it compares the responses of one prompt. ``options``
    override the estimator's own defaults; an option it does not have is a
    ``TypeError`` listing the ones it has. Returns the same (updated) batch.
    """
    estimator = get_estimator(name)
    unknown = set(options) - set(estimator.options)
    if unknown:
        raise TypeError(
            f"estimator {name!r} has no option(s) {sorted(unknown)}; its options are {estimator.options or '{}'}"
        )
    rewards = _tensor(batch, TOKEN_LEVEL_REWARDS, name)
    mask = _tensor(batch, RESPONSE_MASK, name, tuple(rewards.shape))
    inputs: dict[str, Any] = {"token_level_rewards": rewards, "response_mask": mask}
    if estimator.needs_critic:
        inputs["values"] = _tensor(batch, VALUES, name, tuple(rewards.shape))
    if estimator.needs_groups:
        if UID not in batch.non_tensor_batch:
            raise KeyError(
                f"estimator {name!r} compares the responses of one prompt and needs the non-tensor column "
                f"{UID!r} (one id per prompt, shared by its n samples); present: {sorted(batch.non_tensor_batch)}"
            )
        inputs["index"] = group_index(batch.non_tensor_batch[UID])
    advantages, returns = estimator.fn(**inputs, **options)
    for label, out in (("advantages", advantages), ("returns", returns)):
        if tuple(out.shape) != tuple(rewards.shape):
            raise ValueError(f"estimator {name!r} returned {label} of shape {tuple(out.shape)}, expected {tuple(rewards.shape)}")
    batch.batch[ADVANTAGES] = advantages.float()
    batch.batch[RETURNS] = returns.float()
    return batch

"""The one adapter from a DataProto to an estimator's tensors and back.

The driver calls ``compute_advantage(batch, cfg.algorithm.adv_estimator)``
and never branches on the estimator's name: what an estimator needs beyond
rewards and the mask (a critic's values, group ids, old log-probs, ...) is
declared in its registration (``AdvantageEstimator.needs``) and read here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hybridflow.core import DataProto
from hybridflow.core.keys import ADVANTAGES, RESPONSE_MASK, RETURNS, TOKEN_LEVEL_REWARDS
from hybridflow.plugins import get_estimator
from hybridflow.plugins.entries import EstimatorInput


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


def _declared(batch: DataProto, need: EstimatorInput, name: str, rows: int, length: int) -> torch.Tensor | None:
    """The column ``need`` names, checked against its declared dims; None when optional and absent."""
    what = f"{need.shape} {need.meaning}"
    if need.non_tensor:
        if need.column not in batch.non_tensor_batch:
            if need.optional:
                return None
            raise KeyError(
                f"estimator {name!r} needs the non-tensor column {need.column!r} ({what}); "
                f"present: {sorted(batch.non_tensor_batch)}"
            )
        return group_index(batch.non_tensor_batch[need.column])
    if need.column not in batch.batch:
        if need.optional:
            return None
        raise KeyError(
            f"estimator {name!r} needs batch[{need.column!r}] ({what}), which is missing; "
            f"present: {sorted(batch.batch)}"
        )
    value = batch.batch[need.column]
    sizes = {"B": rows, "T": length}
    expected = tuple(sizes.get(d) for d in need.dims)  # None: any size ("K")
    if value.dim() != len(need.dims) or any(e is not None and e != s for e, s in zip(expected, value.shape)):
        raise ValueError(
            f"estimator {name!r}: batch[{need.column!r}] has shape {tuple(value.shape)}, expected {need.shape} "
            f"with B={rows}, T={length}"
        )
    if value.is_complex():
        raise TypeError(f"estimator {name!r}: batch[{need.column!r}] must be real, got {value.dtype}")
    return value.float()


def compute_advantage(batch: DataProto, name: str, **options: Any) -> DataProto:
    """Add ``advantages`` and ``returns`` (B, T) float32 to ``batch`` using the estimator ``name``.

    Reads ``token_level_rewards`` and ``response_mask`` (B, T), plus every
    input the estimator declares in ``needs`` (``values`` when it needs a
    critic, group ids from the non-tensor ``uid`` column when it compares the
    responses of one prompt, ...); a missing declared column is a
    ``KeyError`` naming the column and the estimator. ``options`` override
    the estimator's own defaults; an option it does not have is a
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
    for need in estimator.needs:
        value = _declared(batch, need, name, *rewards.shape)
        if value is not None:
            inputs[need.arg] = value
    advantages, returns = estimator.fn(**inputs, **options)
    for label, out in (("advantages", advantages), ("returns", returns)):
        if tuple(out.shape) != tuple(rewards.shape):
            raise ValueError(
                f"estimator {name!r} returned {label} of shape {tuple(out.shape)}, expected {tuple(rewards.shape)}"
            )
    batch.batch[ADVANTAGES] = advantages.float()
    batch.batch[RETURNS] = returns.float()
    return batch

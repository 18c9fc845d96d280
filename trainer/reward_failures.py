"""Samples whose reward could not be computed, kept out of the learning signal (``reward.on_failure=exclude``).

A verifier that times out, raises (a sandbox that crashed, an LLM-judge endpoint that is down) or a reward-model
worker's error says nothing about the response: scoring it ``reward.timeout_score`` would enter it into its group's
baseline as a wrong answer. Excluded instead, such a sample:

- leaves the advantage: the estimator runs on the other rows only, so a group's mean, std or leave-one-out baseline
  is that of the samples that were scored (and a whitened batch's statistics too);
- leaves the loss: its ``response_mask`` is zeroed (fully masked rows count in no denominator, ``losses/aggregation``).

A group of an estimator that compares samples (``needs_groups``) left with fewer than two scored samples is dropped
the same way: one sample has no baseline of its own group. ``reward.on_failure=score`` keeps veRL's behaviour (the
failed sample scores ``timeout_score`` and trains like any other).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from hybridflow.core import DataProto
from hybridflow.core.keys import ADVANTAGES, RESPONSE_MASK, RETURNS, REWARD_FAILED, UID
from hybridflow.estimators import compute_advantage
from hybridflow.plugins import get_estimator

logger = logging.getLogger(__name__)

MAX_FAILED_STEPS = 3
"""Consecutive steps left with nothing to train on after which the run stops: the reward is down, not flaky."""


def rows_to_train(failed: torch.Tensor, uids: np.ndarray, groups: bool) -> torch.Tensor:
    """(B,) bool: the rows that enter the advantage and the loss: not ``failed`` and, when ``groups``, in a group
    (rows sharing a uid) that either lost no sample or kept at least two."""
    keep = ~failed.bool()
    if not groups or not failed.any():
        return keep
    _, group = np.unique(np.asarray(uids, dtype=str), return_inverse=True)
    group = torch.from_numpy(group.reshape(-1).astype(np.int64))
    kept = torch.bincount(group, weights=keep.double()).long()
    lost = torch.bincount(group, weights=failed.double()).long() > 0
    return keep & ~(lost & (kept < 2))[group]


def advantages_without_failures(
    batch: DataProto, name: str, options: dict[str, Any]
) -> tuple[DataProto, torch.Tensor, dict[str, float]]:
    """``(batch, trained, metrics)``: ``compute_advantage`` over the rows :func:`rows_to_train` keeps (``trained``,
    (B,) bool); the others get advantage and return 0 and an empty ``response_mask``. Metrics:
    ``reward/infra_failed_frac`` and ``reward/groups_dropped`` (groups left with no row). A batch without the
    ``reward_failed`` column (``on_failure=score``) is computed whole, every row trained."""
    if REWARD_FAILED not in batch.batch:
        return compute_advantage(batch, name, **options), torch.ones(len(batch), dtype=torch.bool), {}
    failed = batch.batch[REWARD_FAILED].bool()
    uids = np.asarray(batch.non_tensor_batch[UID], dtype=str)
    keep = rows_to_train(failed, uids, get_estimator(name).needs_groups)
    metrics = {
        "reward/infra_failed_frac": failed.float().mean().item(),
        "reward/groups_dropped": float(len(set(uids.tolist())) - len(set(uids[keep.numpy()].tolist()))),
    }
    if bool(keep.all()):
        return compute_advantage(batch, name, **options), keep, metrics
    mask = batch.batch[RESPONSE_MASK]
    advantages = torch.zeros(mask.shape, dtype=torch.float32)
    returns = torch.zeros(mask.shape, dtype=torch.float32)
    if bool(keep.any()):
        scored = compute_advantage(batch[keep], name, **options)
        advantages[keep], returns[keep] = scored.batch[ADVANTAGES], scored.batch[RETURNS]
    batch.batch[ADVANTAGES], batch.batch[RETURNS] = advantages, returns
    batch.batch[RESPONSE_MASK] = mask * keep.unsqueeze(-1).to(mask.dtype)
    return batch, keep, metrics


class RewardUnavailableError(RuntimeError):
    """Nothing could be trained on for :data:`MAX_FAILED_STEPS` steps in a row: the rewards failed."""


class FailedSteps:
    """Counts the consecutive steps left with nothing to train on (every reward failed, or every group kept fewer
    than two scored samples); a step with any row trained resets the count."""

    def __init__(self, limit: int = MAX_FAILED_STEPS) -> None:
        self.limit = limit
        self.in_a_row = 0

    def trains(self, trained: torch.Tensor, step: int) -> bool:
        """Whether step ``step`` has a row to train on; warns when it has none, raises
        :class:`RewardUnavailableError` at the ``limit``-th such step in a row."""
        if bool(trained.any()):
            self.in_a_row = 0
            return True
        self.in_a_row += 1
        if self.in_a_row >= self.limit:
            raise RewardUnavailableError(
                f"{self.in_a_row} steps in a row (the last: step {step}) had no sample to train on: their rewards "
                "failed (the verifier, sandbox or judge is down); each failure is logged above with its reason "
                "(reward.on_failure=score would train on reward.timeout_score instead)"
            )
        logger.warning(
            "step %d: no sample to train on (every reward failed, or left its group with fewer than two scored); "
            "the step trains nothing (%d of %d such steps in a row)",
            step, self.in_a_row, self.limit,
        )  # fmt: skip
        return False

"""The two places new policy weights come from, as a :class:`~hybridflow.workers.rollout.base.WeightSource`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from hybridflow.core.weight_transfer import Incoming, TransferStats


class TrainingWeights:
    """Colocated: the training model's own weights (``workers/policy_weights.py``'s view, LoRA merged)."""

    def __init__(self, weights: Any, version: int) -> None:
        self.weights, self.version = weights, version

    def full(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every weight gathered whole, one at a time (collective over the training ranks)."""
        return self.weights.full()

    def sharded(self) -> list[tuple[str, torch.Tensor]]:
        """The training shards, the same tensors at every load, LoRA's merged ones refreshed (collective)."""
        return self.weights.sharded()


class ReceivedWeights:
    """On the rollout's own ranks: one transfer from the trainer's rank 0 (``core/weight_transfer.py``)."""

    def __init__(self, incoming: Incoming) -> None:
        self.incoming = incoming
        self.version = incoming.version

    def full(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Each weight as it arrives (a view of its bucket, valid until the next bucket is asked for)."""
        return iter(self.incoming)

    def sharded(self) -> None:
        """None: the weights arrive whole."""
        return None

    def stats(self) -> TransferStats:
        """The transfer's numbers, once every weight was read."""
        return self.incoming.stats()

"""Offload between stages: a role's parameter shards and optimizer state in host memory while other roles run.

Colocated roles take turns on one device: rollout, log-probs, reference,
values, update. With ``fsdp_config.param_offload`` / ``optimizer_offload`` a
role keeps its state in host buffers (pinned on CUDA, so the copies run at
full bandwidth) and frees the device memory between the stages that use it;
each stage brings back what it needs and sends it away again when it ends, so
the device's peak is the largest stage's, not the sum of all roles' state.

The move works on storages: every distinct storage under the role's
parameters (FSDP2's local shards, or plain tensors) and optimizer state is
copied byte for byte into its host buffer and then resized to 0 bytes; bringing
it back resizes it to its size and copies the bytes back, so every tensor,
view and DTensor that refers to it is whole again, with exactly the values it
had. FSDP2 must be resharded first (a forward without backward leaves the
root's parameters gathered; :meth:`StateOffloader.offload` reshards).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from hybridflow.core import dtensor
from hybridflow.workers.fsdp import reshard

__all__ = ["StateOffloader", "drop_storages", "restore_storages"]


def _storages(tensors: Iterable[torch.Tensor]) -> list[torch.UntypedStorage]:
    """The distinct storages under ``tensors`` (tied parameters and views share one)."""
    seen: dict[int, torch.UntypedStorage] = {}
    for tensor in tensors:
        storage = dtensor.local(tensor).untyped_storage()
        if storage.nbytes() and storage.data_ptr() not in seen:
            seen[storage.data_ptr()] = storage
    return list(seen.values())


def _bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A uint8 tensor over the whole storage."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class _Offloaded:
    """Storages moved to host buffers, and their sizes."""

    def __init__(self, storages: list[torch.UntypedStorage]) -> None:
        pin = torch.cuda.is_available() and any(s.device.type == "cuda" for s in storages)
        self.moved = []
        for storage in storages:
            host = torch.empty(storage.nbytes(), dtype=torch.uint8, device="cpu", pin_memory=pin)
            host.copy_(_bytes(storage))
            self.moved.append((storage, storage.nbytes(), host))
            storage.resize_(0)

    def restore(self) -> None:
        for storage, nbytes, host in self.moved:
            storage.resize_(nbytes)
            _bytes(storage).copy_(host, non_blocking=False)
        self.moved = []


class StateOffloader:
    """Moves one role's parameters and/or optimizer state off the device between stages.

    :param params: offload the model's parameter shards (``fsdp_config.param_offload``).
    :param optimizer_state: offload the optimizer's state (``fsdp_config.optimizer_offload``).

    A stage runs inside ``with offloader.on_device(params=..., optimizer=...)``:
    what it asks for comes back for the block and, when offloading is on for
    it, leaves again afterwards (nested blocks move nothing twice). Start with
    :meth:`offload` once the model and optimizer are built.
    """

    def __init__(
        self, model: nn.Module, optimizer: torch.optim.Optimizer | None, *, params: bool, optimizer_state: bool
    ) -> None:
        self.model, self.optimizer = model, optimizer
        self.enabled = {"params": params, "optimizer": optimizer_state and optimizer is not None}
        self._away: dict[str, _Offloaded] = {}

    def _tensors(self, what: str) -> list[torch.Tensor]:
        if what == "params":
            return [p for p in self.model.parameters()]
        return [
            v
            for state in self.optimizer.state.values()
            for v in state.values()
            if isinstance(v, torch.Tensor) and v.dim() > 0
        ]  # the moments, not the 0-d step counters

    def offload(self, *which: str) -> None:
        """Send ``which`` (default: all enabled) to host memory, freeing their device storage."""
        for what in which or [w for w, on in self.enabled.items() if on]:
            if what in self._away or not self.enabled[what]:
                continue
            if what == "params":
                reshard(self.model)  # the sharded parameters are what stays; gathered copies are freed
            self._away[what] = _Offloaded(_storages(self._tensors(what)))

    def load(self, *which: str) -> None:
        """Bring ``which`` (default: all offloaded) back to the device with their values."""
        for what in which or list(self._away):
            if what in self._away:
                self._away.pop(what).restore()

    @property
    def offloaded(self) -> tuple[str, ...]:
        """What is in host memory now (``"params"``, ``"optimizer"``)."""
        return tuple(self._away)

    @contextmanager
    def on_device(self, *, params: bool = True, optimizer: bool = False) -> Iterator[None]:
        """Run a stage with its state on the device; offload it again afterwards (when offloading is on)."""
        which = [w for w, wanted in (("params", params), ("optimizer", optimizer)) if wanted and w in self._away]
        self.load(*which)
        try:
            yield
        finally:
            self.offload(*which)


def drop_storages(tensors: Iterable[torch.Tensor]) -> list[tuple[torch.UntypedStorage, int]]:
    """Free the storages under ``tensors`` without keeping their values (for state that is rewritten whole
    before its next use, like the rollout copy of the weights); returns what :func:`restore_storages` needs."""
    dropped = []
    for storage in _storages(tensors):
        dropped.append((storage, storage.nbytes()))
        storage.resize_(0)
    return dropped


def restore_storages(dropped: list[tuple[torch.UntypedStorage, int]]) -> None:
    """Give the storages :func:`drop_storages` freed their sizes back (their contents are undefined)."""
    for storage, nbytes in dropped:
        storage.resize_(nbytes)

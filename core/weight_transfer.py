"""Weights from the trainer's ranks to a rollout on ranks of its own, in memory, over torch.distributed.

With ``trainer.placement=split`` the rollout is a second worker group with
its own default process group, so the two sides share no communicator. A
:class:`WeightTransfer` is one more: a process group built from a TCP store
that the trainer's rank 0 hosts, with that rank as member 0 and the rollout
ranks as members 1..R (gloo on CPU, nccl on CUDA)::

    trainer ranks 0..N-1          gather each full weight (FSDP all-gather, all trainer ranks)
    trainer rank 0  = member 0  --broadcast, one flat buffer per bucket-->  members 1..R = rollout ranks
                                                                            each copies its tp block

Both ends walk one manifest (name, shape, dtype of every weight, in the
trainer's order) that member 0 publishes in the store when the group is made,
cut into the same buckets of at most ``bucket_bytes`` (one weight larger than
that is a bucket of its own), so each bucket is a single broadcast of a flat
tensor. A header broadcast first carries the weight version. Nothing touches
the disk and no tensor passes through the driver.

A sync fails closed: after each bucket the sender broadcasts its
:func:`fingerprint`, and a receiver whose copy differs writes nothing of that
bucket or the ones after it (it drains them, so the sender finishes) and raises
:class:`WeightSyncError` naming the bucket, its weights, the version and the
member. A sender that stops halfway leaves the receivers' broadcast to time out
(``trainer.timeouts.weight_sync_s``), an error too.
"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = [
    "Incoming",
    "Manifest",
    "TransferStats",
    "WeightSyncError",
    "WeightTransfer",
    "buckets",
    "fingerprint",
    "manifest_of",
]

Manifest = list[tuple[str, tuple[int, ...], str]]
"""``(name, shape, dtype name)`` of every weight, in the order they are sent."""

_MANIFEST_KEY = "hybridflow/weight_manifest"


@dataclass(frozen=True)
class TransferStats:
    """One transfer: its weight version, seconds from the header to the last bucket, bytes and broadcasts."""

    version: int
    seconds: float
    bytes: int
    buckets: int
    verify_seconds: float = 0.0
    """Of ``seconds``, the time spent computing the buckets' fingerprints (and, receiving, comparing them)."""

    def metrics(self) -> dict[str, float]:
        """``weight_sync/seconds``, ``weight_sync/bytes``, ``weight_sync/buckets``, ``weight_sync/verify_s``."""
        return {
            "weight_sync/seconds": self.seconds,
            "weight_sync/bytes": float(self.bytes),
            "weight_sync/buckets": float(self.buckets),
            "weight_sync/verify_s": self.verify_seconds,
        }


class WeightSyncError(RuntimeError):
    """A weight sync that did not arrive whole: the rollout must not generate on what it holds."""


def fingerprint(flat: torch.Tensor) -> int:
    """A cheap checksum of a bucket's bytes: the sum (mod 2**64) of its 64-bit words, plus its last bytes when its
    length is not a multiple of 8 (a 64-bit sum runs at memory speed: ~0.02 s for 400 MB on one CPU core; a
    widening 32-bit sum is 20x slower). One flipped bit changes it, and so does a zeroed or a lost part, unless its
    words happened to sum to 0 mod 2**64; a reordering of whole words does not (a transport reorders no words)."""
    raw = flat.reshape(-1).view(torch.uint8)
    head = raw.numel() // 8 * 8
    if raw.storage_offset() % 8:  # a 64-bit view needs an aligned start
        raw = raw.clone()
    words = int(raw[:head].view(torch.int64).sum()) if head else 0
    total = (words + int(raw[head:].sum())) % 2**64
    return total - 2**64 if total >= 2**63 else total  # as a signed 64-bit number: what a long tensor holds


def buckets(manifest: Manifest, bucket_bytes: int) -> list[list[int]]:
    """Consecutive manifest entries of one dtype, at most ``bucket_bytes`` each (a larger entry alone)."""
    out: list[list[int]] = []
    size, dtype = 0, None
    for i, (_, shape, dtype_name) in enumerate(manifest):
        nbytes = _numel(shape) * torch.empty((), dtype=getattr(torch, dtype_name)).element_size()
        if out and dtype_name == dtype and size + nbytes <= bucket_bytes:
            out[-1].append(i)
            size += nbytes
        else:
            out.append([i])
            size, dtype = nbytes, dtype_name
    return out


class WeightTransfer:
    """One end of the trainer-to-rollout process group (see the module docstring).

    :param host, port: the TCP store, hosted by member 0 (the trainer's rank 0).
    :param member: 0 for the sender, 1..R for the rollout ranks.
    :param members: 1 + R.
    :param device: where the flat buckets live (the rank's GPU for nccl, the CPU for gloo).
    """

    def __init__(
        self, host: str, port: int, member: int, members: int, device: torch.device, timeout_s: float = 600.0
    ) -> None:
        timeout = datetime.timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(host, port, members, is_master=member == 0, timeout=timeout, wait_for_workers=False)
        self.member, self.members, self.device = member, members, torch.device(device)
        if self.device.type == "cuda":
            self.group = dist.ProcessGroupNCCL(self.store, member, members)
        else:
            self.group = dist.ProcessGroupGloo(self.store, member, members, timeout)
        self.manifest: Manifest | None = None
        self.verify = True
        """Fingerprint every bucket (both ends must agree; off only to measure what it costs: bench_weight_sync)."""
        self.tamper: Callable[[int, torch.Tensor], None] | None = None
        """A test's seam: called with (bucket index, flat bucket) as each bucket arrives, before its check."""

    def publish(self, manifest: Manifest) -> None:
        """Member 0: make ``manifest`` the order of every transfer (call once, before the first send)."""
        self.manifest = [(name, tuple(shape), dtype) for name, shape, dtype in manifest]
        self.store.set(_MANIFEST_KEY, json.dumps(self.manifest))

    def read_manifest(self) -> Manifest:
        """Members 1..R: the manifest member 0 published (waits for it)."""
        self.manifest = [
            (name, tuple(shape), dtype) for name, shape, dtype in json.loads(self.store.get(_MANIFEST_KEY))
        ]
        return self.manifest

    def send(self, weights: Iterable[tuple[str, torch.Tensor]], version: int, bucket_bytes: int) -> TransferStats:
        """Member 0: broadcast ``weights`` (full tensors in manifest order) and ``version``."""
        manifest = self._need_manifest()
        start = time.perf_counter()
        self._broadcast(torch.tensor([version], dtype=torch.long, device=self.device))
        stream = iter(weights)
        sent, verify = 0, 0.0
        plan = buckets(manifest, bucket_bytes)
        for bucket in plan:
            parts = []
            for i in bucket:
                name, tensor = next(stream)
                if name != manifest[i][0] or tuple(tensor.shape) != manifest[i][1]:
                    raise ValueError(
                        f"weight {i} is {name} {tuple(tensor.shape)}, the manifest says "
                        f"{manifest[i][0]} {manifest[i][1]}"
                    )
                parts.append(tensor.detach().reshape(-1).to(self.device))
            flat = torch.cat(parts) if len(parts) > 1 else parts[0].contiguous()
            in_flight = self.group.broadcast(flat, 0)
            if self.verify:  # computed while the bucket is on its way; sent after it
                checked = time.perf_counter()
                mark = torch.tensor([fingerprint(flat)], dtype=torch.long, device=self.device)
                verify += time.perf_counter() - checked
            in_flight.wait()
            if self.verify:
                self._broadcast(mark)
            sent += flat.numel() * flat.element_size()
        return TransferStats(version, time.perf_counter() - start, sent, len(plan), verify)

    def receive(self, write: Callable[[str, torch.Tensor], None], bucket_bytes: int) -> TransferStats:
        """Members 1..R: receive one transfer; ``write(name, full tensor)`` is called for each weight (the
        tensor is a view of the bucket, valid during the call)."""
        incoming = self.incoming(bucket_bytes)
        for name, tensor in incoming:
            write(name, tensor)
        return incoming.stats()

    def incoming(self, bucket_bytes: int) -> Incoming:
        """Members 1..R: one transfer as an iterator of ``(name, full tensor)`` in manifest order (each a view of
        its bucket, which is allocated fresh and stays alive as long as one of its views does). The header is
        received here, before the first weight: ``.version`` is known at once, ``.stats()`` once drained. For
        a consumer that pulls the weights itself (vLLM's in-place reload)."""
        manifest = self._need_manifest()
        start = time.perf_counter()
        header = torch.zeros(1, dtype=torch.long, device=self.device)
        self._broadcast(header)
        return Incoming(self, manifest, buckets(manifest, bucket_bytes), int(header.item()), start)

    def close(self) -> None:
        """Let go of the group (the store closes with the last reference)."""
        self.group = None

    def _broadcast(self, tensor: torch.Tensor) -> None:
        self.group.broadcast(tensor, 0).wait()

    def _need_manifest(self) -> Manifest:
        if self.manifest is None:
            raise RuntimeError("no manifest yet: member 0 calls publish(), the others read_manifest(), once")
        return self.manifest


class Incoming:
    """One transfer being received (:meth:`WeightTransfer.incoming`): iterate it once, then ask for its stats."""

    def __init__(
        self, transfer: WeightTransfer, manifest: Manifest, plan: list[list[int]], version: int, start: float
    ) -> None:
        self.transfer, self.manifest, self.plan = transfer, manifest, plan
        self.version, self.start = version, start
        self.received = 0
        self.verify_seconds = 0.0
        self.done = False

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        manifest = self.manifest
        for index, bucket in enumerate(self.plan):
            flat, sizes = self._take(bucket)
            if self.transfer.tamper is not None:
                self.transfer.tamper(index, flat)
            if not self._arrived_whole(flat):
                for later in self.plan[index + 1 :]:  # drain them: the sender finishes, and none is written
                    self._take(later)
                    self._arrived_whole(torch.zeros(0))
                names = (
                    f"{manifest[bucket[0]][0]} .. {manifest[bucket[-1]][0]}"
                    if len(bucket) > 1
                    else manifest[bucket[0]][0]
                )
                raise WeightSyncError(
                    f"weight sync of version {self.version}: bucket {index} of {len(self.plan)} ({names}) arrived "
                    f"corrupted on member {self.transfer.member} of {self.transfer.members} (its fingerprint differs "
                    f"from the sender's); the buckets before it were written, so the rollout holds a mixture of "
                    "versions and must not generate"
                )
            for i, part in zip(bucket, flat.split(sizes)):
                yield manifest[i][0], part.view(manifest[i][1])
        self.done = True

    def _take(self, bucket: list[int]) -> tuple[torch.Tensor, list[int]]:
        sizes = [_numel(self.manifest[i][1]) for i in bucket]
        dtype = getattr(torch, self.manifest[bucket[0]][2])
        flat = torch.empty(sum(sizes), dtype=dtype, device=self.transfer.device)
        self.transfer._broadcast(flat)
        self.received += flat.numel() * flat.element_size()
        return flat, sizes

    def _arrived_whole(self, flat: torch.Tensor) -> bool:
        """Receive the sender's fingerprint of the bucket just taken; whether ``flat``'s equals it."""
        if not self.transfer.verify:
            return True
        sent = torch.zeros(1, dtype=torch.long, device=self.transfer.device)
        self.transfer._broadcast(sent)
        checked = time.perf_counter()
        whole = fingerprint(flat) == int(sent.item())
        self.verify_seconds += time.perf_counter() - checked
        return whole

    def stats(self) -> TransferStats:
        """The transfer's version, seconds from the header to the last bucket, bytes and broadcasts."""
        if not self.done:
            raise RuntimeError("the transfer was not received to its end: every bucket's broadcast must be taken")
        return TransferStats(
            self.version, time.perf_counter() - self.start, self.received, len(self.plan), self.verify_seconds
        )


def manifest_of(weights: Iterator[tuple[str, torch.Tensor]] | Iterable[tuple[str, torch.Tensor]]) -> Manifest:
    """The manifest of ``(name, tensor)`` pairs (their full shapes and dtypes)."""
    return [(name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in weights]


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for s in shape:
        out *= s
    return out

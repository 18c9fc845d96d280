"""Train-to-rollout resharding: the 3D-HybridEngine's in-memory weight move.

The actor trains in one layout (FSDP2 shards over all ranks, or a 2-D
``dp x tp`` mesh) and generates in another (rollout tensor parallelism over
``q`` ranks). After every update each rank must overwrite its rollout tensors
with the new weights, without a checkpoint and without materializing the whole
model anywhere.

Every tensor here is a *box* of its full tensor: an offset and a shape. A rank
holds one box of every training parameter (its DTensor shard; a plain tensor
is the whole box) and wants one box of each rollout tensor
(:class:`TensorSlice`). Example, one ``[8 x d]`` weight, FSDP over 4 ranks to
rollout TP 2 (rollout tp rank = ``rank % 2``)::

    held (training)        wanted (rollout)         moves (sender -> receiver: rows)
    rank 0: rows 0-1       rank 0: rows 0-3         1 -> 0: 2-3           (0 keeps 0-1)
    rank 1: rows 2-3       rank 1: rows 4-7         2 -> 1: 4-5, 3 -> 1: 6-7
    rank 2: rows 4-5       rank 2: rows 0-3         0 -> 2: 0-1, 1 -> 2: 2-3
    rank 3: rows 6-7       rank 3: rows 4-7         2 -> 3: 4-5           (3 keeps 6-7)

Algorithm:

1. :func:`plan_reshard` (once): each rank computes the box it holds of every
   source (DTensor metadata, uneven FSDP shards and 2-D ``_StridedShard``
   included) and the box it wants of every target; one ``all_gather_object``
   shares them. Every rank then derives the same list of *pieces*: for each
   receiver and each distinct held box that overlaps its wanted box, the
   intersection, sent by one holder (the receiver itself when it holds it, a
   local copy; otherwise the least-loaded holder of a replicated box). So a
   rank receives exactly its target blocks and nothing else.
2. :meth:`ReshardPlan.run` (every weight update): pieces are cut to at most
   ``bucket_bytes`` and packed into *rounds* so that no rank sends plus
   receives more than ``bucket_bytes`` in one round. Per round, each rank packs
   its outgoing pieces into one buffer ordered by receiver, one
   batch of ``isend``/``irecv`` moves them (only overlapping ranks
   exchange non-empty splits), and the received pieces are copied in place
   into narrow views of the targets.

Fail closed: with each round's bytes, every sender sends each receiver the
:func:`~hybridflow.core.weight_transfer.fingerprint` of its chunk; a receiver
whose copy differs writes nothing more (it still takes part in the remaining
rounds, so no peer waits) and raises ``WeightSyncError`` at the end, naming
the round, the sender, the weights and itself.

Memory bound: the extra memory of a run is one round's send plus receive
buffer, ``<= bucket_bytes`` (a parameter larger than the bucket is split into
several pieces and rounds). Local copies and DTensor ``to_local()`` are views
and allocate nothing.

:func:`gather_full_state` is the naive path, kept as a baseline: every rank
materializes every full tensor.

(DTensor ``redistribute`` between two different meshes raises
``NotImplementedError`` in torch 2.13; the plan needs only each shard's
metadata and one collective, so it does not depend on it.)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from hybridflow.core import dtensor
from hybridflow.core.weight_transfer import WeightSyncError, fingerprint

__all__ = ["Box", "ReshardPlan", "ReshardStats", "TensorSlice", "gather_full_state", "plan_reshard"]


@dataclass(frozen=True)
class TensorSlice:
    """The block ``[start, stop)`` of a full tensor along ``dim``; ``dim=None``: the whole tensor (replicated)."""

    dim: int | None
    start: int = 0
    stop: int = 0

    @classmethod
    def full(cls) -> TensorSlice:
        """The whole tensor (a replicated parameter)."""
        return cls(None)

    def shape(self, full_shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of this block of a tensor of ``full_shape``."""
        if self.dim is None:
            return tuple(full_shape)
        out = list(full_shape)
        out[self.dim] = self.stop - self.start
        return tuple(out)

    def take(self, full):
        """This block of ``full`` (a view)."""
        if self.dim is None:
            return full
        return full.narrow(self.dim, self.start, self.stop - self.start)

    def box(self, full_shape: tuple[int, ...]) -> Box:
        """This block as a :class:`Box` of a tensor of ``full_shape``."""
        offset = [0] * len(full_shape)
        if self.dim is not None:
            offset[self.dim] = self.start
        return Box(tuple(offset), self.shape(full_shape))


@dataclass(frozen=True)
class Box:
    """An axis-aligned block of a full tensor: ``offset`` of its first element and its ``shape``."""

    offset: tuple[int, ...]
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    def intersect(self, other: Box) -> Box | None:
        """The common block of two boxes of the same tensor, or None when they do not overlap."""
        start = tuple(max(a, b) for a, b in zip(self.offset, other.offset))
        stop = tuple(min(a + n, b + m) for a, n, b, m in zip(self.offset, self.shape, other.offset, other.shape))
        if any(lo >= hi for lo, hi in zip(start, stop)):
            return None
        return Box(start, tuple(hi - lo for lo, hi in zip(start, stop)))

    def view_of(self, tensor: torch.Tensor, inner: Box) -> torch.Tensor:
        """The view of ``inner`` (a sub-box, in full-tensor coordinates) in ``tensor``, which holds this box."""
        for dim, (lo, n) in enumerate(zip(inner.offset, inner.shape)):
            tensor = tensor.narrow(dim, lo - self.offset[dim], n)
        return tensor


@dataclass(frozen=True)
class ReshardStats:
    """What one :meth:`ReshardPlan.run` did on this rank.

    ``peak_extra_bytes``: the largest send + receive buffer of a round (the
    only memory the move allocates); ``bytes_sent`` / ``bytes_received``: over
    the network; ``bytes_local``: copied from this rank's own shards.
    """

    seconds: float
    peak_extra_bytes: int
    bytes_sent: int
    bytes_received: int
    bytes_local: int = 0
    rounds: int = 0
    verify_seconds: float = 0.0
    """Of ``seconds``: computing and comparing the chunks' fingerprints (and exchanging them)."""


@dataclass(frozen=True)
class _Piece:
    """One block of parameter ``name`` that rank ``src`` sends to rank ``dst`` (group ranks)."""

    name: str
    src: int
    dst: int
    box: Box
    dtype: torch.dtype  # the target's dtype: the sender converts while packing

    @property
    def nbytes(self) -> int:
        return self.box.numel * self.dtype.itemsize


@dataclass
class _Round:
    """One exchange: this rank's outgoing and incoming pieces, ordered by peer."""

    dtype: torch.dtype
    sends: list[_Piece] = field(default_factory=list)
    recvs: list[_Piece] = field(default_factory=list)


def _held_box(tensor: torch.Tensor) -> Box:
    """The box of the full tensor this rank holds: a DTensor's local shard, or all of a plain tensor."""
    if not isinstance(tensor, DTensor):
        return Box((0,) * tensor.dim(), tuple(tensor.shape))
    shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    local = tuple(tensor.to_local().shape)
    if tuple(shape) != local:
        raise ValueError(
            f"DTensor with placements {tensor.placements} has a local shard of shape {local}, but its metadata "
            f"says {tuple(shape)}; only layouts whose shards are contiguous blocks can be resharded"
        )
    return Box(tuple(offset), local)


def _check_tiling(name: str, full_shape: tuple[int, ...], boxes: Sequence[Box]) -> None:
    """Distinct held boxes must cover the tensor exactly once (catches non-block layouts)."""
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            if a.intersect(b) is not None:
                raise ValueError(f"{name}: ranks hold overlapping but different blocks {a} and {b}")
    if sum(box.numel for box in boxes) != math.prod(full_shape):
        raise ValueError(f"{name}: the ranks' blocks {list(boxes)} do not cover the full shape {full_shape}")


def _route(
    name: str, held: Mapping[int, Box], wanted: Mapping[int, tuple[Box, torch.dtype]], load: list[int]
) -> list[_Piece]:
    """The pieces that give every receiver its wanted box of ``name``; ``load`` (bytes per sender) is updated."""
    holders: dict[Box, list[int]] = {}
    for rank, box in sorted(held.items()):
        holders.setdefault(box, []).append(rank)
    pieces = []
    for dst, (want, dtype) in sorted(wanted.items()):
        for box, ranks in holders.items():
            common = box.intersect(want)
            if common is None:
                continue
            src = dst if dst in ranks else min(ranks, key=lambda r: (load[r], r))
            piece = _Piece(name, src, dst, common, dtype)
            if src != dst:
                load[src] += piece.nbytes
            pieces.append(piece)
    return pieces


def _split(box: Box, max_numel: int) -> list[Box]:
    """Cut ``box`` into blocks of at most ``max_numel`` elements (along dim 0, then inner dims)."""
    if box.numel <= max_numel:
        return [box]
    row = math.prod(box.shape[1:])
    if row <= max_numel:
        step = max_numel // row
        return [
            Box((box.offset[0] + i, *box.offset[1:]), (min(step, box.shape[0] - i), *box.shape[1:]))
            for i in range(0, box.shape[0], step)
        ]
    rows = [Box((box.offset[0] + i, *box.offset[1:]), (1, *box.shape[1:])) for i in range(box.shape[0])]
    # A row too big on its own: split its inner dims, keeping dim 0 of size 1.
    out = []
    for r in rows:
        inner = _split(Box(r.offset[1:], r.shape[1:]), max_numel)
        out.extend(Box((r.offset[0], *b.offset), (1, *b.shape)) for b in inner)
    return out


def _schedule(pieces: Sequence[_Piece], world: int, bucket_bytes: int) -> list[list[_Piece]]:
    """Pack pieces (cut to fit) into rounds in which no rank sends + receives more than ``bucket_bytes``.

    First fit, in the plan's order: every rank runs this on the same list and
    gets the same rounds. A round holds one dtype, so its buffers are typed.
    """
    rounds: list[tuple[torch.dtype, list[int], list[_Piece]]] = []
    for whole in pieces:
        itemsize = whole.dtype.itemsize
        if bucket_bytes < itemsize:
            raise ValueError(f"bucket_bytes={bucket_bytes} is smaller than one {whole.dtype} element")
        for box in _split(whole.box, bucket_bytes // itemsize):
            piece = _Piece(whole.name, whole.src, whole.dst, box, whole.dtype)
            for dtype, load, members in rounds:  # noqa: B007 (the round found is filled after the loop)
                if dtype == piece.dtype and max(load[piece.src], load[piece.dst]) + piece.nbytes <= bucket_bytes:
                    break
            else:
                dtype, load, members = piece.dtype, [0] * world, []
                rounds.append((dtype, load, members))
            load[piece.src] += piece.nbytes
            load[piece.dst] += piece.nbytes
            members.append(piece)
    return [members for _, _, members in rounds]


class ReshardPlan:
    """This rank's part of a train-to-rollout weight move; built by :func:`plan_reshard`, run after every update."""

    def __init__(
        self,
        sources: Mapping[str, torch.Tensor],
        targets: Mapping[str, torch.Tensor],
        pieces: list[_Piece],
        held: Mapping[str, Box],
        wanted: Mapping[str, Box],
        rank: int,
        world: int,
        group: dist.ProcessGroup | None,
    ) -> None:
        self.sources, self.targets = dict(sources), dict(targets)
        self.pieces = pieces  # every rank's pieces, in the same order everywhere
        self.held, self.wanted = dict(held), dict(wanted)
        self.rank, self.world, self.group = rank, world, group
        self.local = [p for p in pieces if p.src == p.dst == rank]
        self._rounds: dict[int, list[_Round]] = {}
        self.tamper: Callable[[int, torch.Tensor], None] | None = None
        """A test's seam: called with (round index, received buffer) as each round arrives, before its check."""

    def rounds(self, bucket_bytes: int) -> list[_Round]:
        """This rank's rounds for ``bucket_bytes`` (computed once per bucket size and kept)."""
        if bucket_bytes not in self._rounds:
            remote = [p for p in self.pieces if p.src != p.dst]
            mine = []
            for members in _schedule(remote, self.world, bucket_bytes):
                mine.append(
                    _Round(
                        members[0].dtype,
                        sorted((p for p in members if p.src == self.rank), key=lambda p: p.dst),
                        sorted((p for p in members if p.dst == self.rank), key=lambda p: p.src),
                    )
                )  # sorted() is stable: pieces between one pair keep the plan's order on both sides
            self._rounds[bucket_bytes] = mine
        return self._rounds[bucket_bytes]

    def _check_sources(self) -> None:
        """Fail clearly, instead of reading freed memory, when a source's storage is gone."""
        for name, tensor in self.sources.items():
            local = dtensor.local(tensor)
            if local.numel() and local.untyped_storage().nbytes() == 0:
                raise RuntimeError(
                    f"source {name}'s storage was freed since the plan was made; plan from the sharded "
                    "parameters (an FSDP2 model's gathered root parameters are freed when it reshards)"
                )

    def _source_view(self, piece: _Piece) -> torch.Tensor:
        return self.held[piece.name].view_of(dtensor.local(self.sources[piece.name]), piece.box)

    def _target_view(self, piece: _Piece) -> torch.Tensor:
        return self.wanted[piece.name].view_of(self.targets[piece.name], piece.box)

    def _global_rank(self, group_rank: int) -> int:
        """The default-group rank of ``group_rank`` in the plan's group (what ``P2POp`` takes)."""
        return group_rank if self.group is None else dist.get_global_rank(self.group, group_rank)

    def _splits(self, pieces: Sequence[_Piece], peer) -> list[int]:
        sizes = [0] * self.world
        for p in pieces:
            sizes[peer(p)] += p.box.numel
        return sizes

    def _exchange(self, round_: _Round, device: torch.device, index: int, write: bool) -> tuple[int, int, str]:
        """Pack, swap with the peers (batched isend/irecv), check, unpack one round (only when ``write``); returns
        (bytes sent, bytes received, what arrived corrupted: "" when nothing did)."""
        send = torch.empty(sum(p.box.numel for p in round_.sends), dtype=round_.dtype, device=device)
        offset = 0
        for p in round_.sends:
            send[offset : offset + p.box.numel].view(p.box.shape).copy_(self._source_view(p))
            offset += p.box.numel
        recv = torch.empty(sum(p.box.numel for p in round_.recvs), dtype=round_.dtype, device=device)
        sends = send.split(self._splits(round_.sends, lambda p: p.dst))
        recvs = recv.split(self._splits(round_.recvs, lambda p: p.src))
        self._swap(sends, recvs)
        if self.tamper is not None:
            self.tamper(index, recv)
        broken = self._corrupted(sends, recvs, round_, index)
        if write and not broken:
            offset = 0
            for p in round_.recvs:
                self._target_view(p).copy_(recv[offset : offset + p.box.numel].view(p.box.shape))
                offset += p.box.numel
        return send.nbytes, recv.nbytes, broken

    def _swap(self, sends: Sequence[torch.Tensor], recvs: Sequence[torch.Tensor]) -> None:
        """Each non-empty ``sends[peer]`` to that peer, each non-empty ``recvs[peer]`` from it (one batch)."""
        # Point-to-point between the pairs that exchange bytes: measured 1.6-6x faster than
        # gloo's all_to_all_single for the same splits (4 CPU ranks, 96 MiB per rank), and
        # ranks with nothing to swap stay out of each other's way.
        ops = []
        for op, chunks in ((dist.isend, sends), (dist.irecv, recvs)):
            for peer, chunk in enumerate(chunks):
                if chunk.numel():
                    ops.append(dist.P2POp(op, chunk, self._global_rank(peer), self.group))
        for work in dist.batch_isend_irecv(ops) if ops else ():
            work.wait()

    def _corrupted(self, sends, recvs, round_: _Round, index: int) -> str:
        """Swap the chunks' fingerprints with the peers; what arrived different from what its sender sent."""
        start = time.perf_counter()
        device = sends[0].device if sends else recvs[0].device
        sent = [torch.tensor([fingerprint(c) if c.numel() else 0], device=device) for c in sends]
        told = [torch.zeros(1, dtype=torch.long, device=device) for _ in recvs]
        self._swap(
            [f if c.numel() else f[:0] for f, c in zip(sent, sends)],
            [f if c.numel() else f[:0] for f, c in zip(told, recvs)],
        )
        bad = [peer for peer, chunk in enumerate(recvs) if chunk.numel() and fingerprint(chunk) != int(told[peer])]
        self.verify_seconds += time.perf_counter() - start
        if not bad:
            return ""
        names = sorted({p.name for p in round_.recvs if p.src == bad[0]})
        return (
            f"reshard round {index}: the chunk from rank {self._global_rank(bad[0])} ({', '.join(names[:3])}"
            f"{', ...' if len(names) > 3 else ''}) arrived corrupted on rank {self._global_rank(self.rank)} (its "
            "fingerprint differs from the sender's)"
        )

    @torch.no_grad()
    def run(self, bucket_bytes: int) -> ReshardStats:
        """Overwrite the targets in place with the current source values (collective: every rank, same bucket).

        Extra memory at any moment: one round's buffers, at most ``bucket_bytes``.
        """
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self._check_sources()
        start = time.perf_counter()
        for p in self.local:
            self._target_view(p).copy_(self._source_view(p))
        device = self._device()
        peak = sent = received = 0
        self.verify_seconds, broken = 0.0, ""
        rounds = self.rounds(bucket_bytes)
        for index, round_ in enumerate(rounds):  # after a corrupted round: take part, write nothing
            out, into, corrupted = self._exchange(round_, device, index, write=not broken)
            peak, sent, received = max(peak, out + into), sent + out, received + into
            broken = broken or corrupted
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if broken:
            raise WeightSyncError(
                f"{broken}; the rounds before it were written, so the rollout holds a mixture of versions and must "
                "not generate"
            )
        local = sum(p.nbytes for p in self.local)
        seconds = time.perf_counter() - start
        return ReshardStats(seconds, peak, sent, received, local, len(rounds), self.verify_seconds)

    def _device(self) -> torch.device:
        """Where the round buffers live: with the rollout tensors (nccl needs them on the GPU)."""
        tensors = [*self.targets.values(), *self.sources.values()]
        return dtensor.local(tensors[0]).device if tensors else torch.device("cpu")


def plan_reshard(
    sources: Sequence[tuple[str, torch.Tensor]],
    targets: Mapping[str, torch.Tensor],
    slices: Mapping[str, TensorSlice],
    group: dist.ProcessGroup | None = None,
) -> ReshardPlan:
    """Plan moving ``sources`` (training layout) into ``targets`` (rollout layout); collective, call once.

    :param sources: this rank's training parameters, ``(name, tensor)`` in the
        same order on every rank: DTensors (any ``Shard`` / ``Replicate`` /
        FSDP2 ``_StridedShard`` placements on a 1-D or 2-D mesh whose local
        shards are blocks) or plain full tensors. The plan keeps the tensors and
        reads their current values at every run (FSDP2 updates sharded
        parameters in place), so pass the sharded parameters: FSDP2 leaves
        its root gathered after a forward without backward
        (``hybridflow.workers.fsdp.sharded_parameters`` reshards first).
        Sources without a target are not moved.
    :param targets: this rank's rollout tensors by name, overwritten in place.
    :param slices: for each target, the block of the full tensor it holds.
    :param group: the process group spanning the training and rollout ranks
        (None: the default group).
    :returns: the plan; call :meth:`ReshardPlan.run` after every weight update.
    """
    sources = list(sources)
    names = [name for name, _ in sources]
    by_name = dict(sources)
    missing = [n for n in targets if n not in by_name or n not in slices]
    if missing:
        raise KeyError(f"targets {missing} have no source parameter or no TensorSlice; every target needs both")
    held = {name: _held_box(t) for name, t in sources}
    wanted = {}
    for name, target in targets.items():
        full_shape = tuple(by_name[name].shape)
        want = slices[name].box(full_shape)
        if tuple(target.shape) != want.shape:
            raise ValueError(
                f"target {name} has shape {tuple(target.shape)}, but {slices[name]} of {full_shape} is {want.shape}"
            )
        wanted[name] = want
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    everyone: list = [None] * world
    mine = (names, held, {n: (wanted[n], t.dtype) for n, t in targets.items()})
    dist.all_gather_object(everyone, mine, group=group)
    if any(other[0] != names for other in everyone):
        raise ValueError("every rank must pass the same source names in the same order")
    load = [0] * world
    pieces = []
    for name in names:
        holds = {r: everyone[r][1][name] for r in range(world)}
        _check_tiling(name, tuple(by_name[name].shape), list(dict.fromkeys(holds.values())))
        wants = {r: everyone[r][2][name] for r in range(world) if name in everyone[r][2]}
        pieces.extend(_route(name, holds, wants, load))
    return ReshardPlan(by_name, targets, pieces, held, wanted, rank, world, group)


@torch.no_grad()
def gather_full_state(sources: Sequence[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The naive path (baseline and test oracle): every rank materializes every full tensor.

    DTensors are gathered with ``full_tensor()`` (collective: call on every
    rank, same order); plain tensors are returned detached, not copied. Peak
    memory is the whole model on every rank, which is what
    :func:`plan_reshard` avoids.
    """
    return {name: dtensor.full(t) for name, t in sources}

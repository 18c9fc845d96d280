"""Typed dispatch modes and ``@register``: how one driver call fans out to ranks.

A :class:`DispatchMode` is one frozen object holding two plain functions:

* ``dispatch(layout, args, kwargs) -> DispatchPlan``: the arguments each rank
  receives (plus a ``context`` the collect step gets back, e.g. a pad size),
* ``collect(layout, outputs, context) -> result``: folds the outputs of the
  ranks named by ``collect_ranks(layout)`` (in that order) into one value.

``@register(dispatch=DP_COMPUTE_PROTO)`` wraps a worker method in a
:class:`RegisteredMethod` descriptor that carries this choice as a typed
field; the worker group reads it from the class. A new mode is a new
``DispatchMode(...)`` constant, not a new string in a table::

    def _scale_by_rank(layout, args, kwargs):  # rank r gets r * x
        n = layout.world_size
        return DispatchPlan([(args[0] * r,) for r in range(n)], [kwargs] * n)

    SCALED_SUM = DispatchMode("SCALED_SUM", _scale_by_rank,
                              collect=lambda layout, outs, ctx: sum(outs))

The data-parallel layout (which dp group each rank belongs to, and which rank
of the group is its representative) comes from the workers' device meshes,
see :meth:`hybridflow.core.worker.Worker.init_device_mesh`.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from hybridflow.core.data_proto import DataProto

__all__ = [
    "ALL_TO_ALL",
    "DP_COMPUTE",
    "DP_COMPUTE_METRIC",
    "DP_COMPUTE_PROTO",
    "ONE_TO_ALL",
    "DispatchMode",
    "DispatchPlan",
    "Execute",
    "GroupLayout",
    "Pending",
    "RankLayout",
    "RegisteredMethod",
    "Registration",
    "register",
]


# --------------------------------------------------------------------- layout
DEFAULT_MESH = "default"
"""The name of a worker's mesh when it builds only one (``Worker.init_device_mesh``'s default)."""


@dataclass(frozen=True)
class RankLayout:
    """Where one rank sits in the data-parallel split.

    ``is_collect_rank`` marks the one rank per dp group whose output the
    collect step keeps (the rank whose non-dp mesh coordinates are all 0).
    """

    dp_rank: int
    dp_size: int
    is_collect_rank: bool


@dataclass(frozen=True)
class GroupLayout:
    """The :class:`RankLayout` of every rank of a group, indexed by rank."""

    ranks: tuple[RankLayout, ...]

    def __post_init__(self) -> None:
        sizes = {r.dp_size for r in self.ranks}
        if len(sizes) != 1:
            raise ValueError(f"ranks disagree on the data-parallel size: {sorted(sizes)}")
        dp_size = sizes.pop()
        for dp in range(dp_size):
            reps = [i for i, r in enumerate(self.ranks) if r.dp_rank == dp and r.is_collect_rank]
            if len(reps) != 1:
                raise ValueError(f"dp rank {dp} must have exactly one collect rank, found ranks {reps}")

    @classmethod
    def flat(cls, world_size: int) -> GroupLayout:
        """Every rank is its own dp group (no tensor/pipeline parallelism)."""
        return cls(tuple(RankLayout(r, world_size, True) for r in range(world_size)))

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return len(self.ranks)

    @property
    def dp_size(self) -> int:
        """Number of data-parallel groups."""
        return self.ranks[0].dp_size

    def collect_ranks(self) -> list[int]:
        """The representative rank of each dp group, ordered by dp rank."""
        reps = {r.dp_rank: i for i, r in enumerate(self.ranks) if r.is_collect_rank}
        return [reps[dp] for dp in range(self.dp_size)]


# ---------------------------------------------------------------- the modes
@dataclass(frozen=True)
class DispatchPlan:
    """Per-rank positional and keyword arguments, and what collect gets back."""

    rank_args: Sequence[tuple]
    rank_kwargs: Sequence[dict[str, Any]]
    context: Any = None


def _all_ranks(layout: GroupLayout) -> list[int]:
    return list(range(layout.world_size))


@dataclass(frozen=True)
class DispatchMode:
    """How a call is split across ranks and how the outputs are folded back.

    ``needs_layout`` says that ``dispatch`` reads the data-parallel layout; the
    worker then checks that the layout the driver used is still its own.
    ``collect_copies`` says that ``collect`` copies DataProto outputs into new
    memory (concatenates them) and does not keep them: they may then arrive as
    read-only views of Ray's object store, saving one copy of every byte.
    """

    name: str
    dispatch: Callable[[GroupLayout, tuple, dict[str, Any]], DispatchPlan]
    collect: Callable[[GroupLayout, list[Any], Any], Any]
    collect_ranks: Callable[[GroupLayout], list[int]] = _all_ranks
    needs_layout: bool = False
    collect_copies: bool = False

    def __repr__(self) -> str:
        return f"DispatchMode({self.name})"


class Execute(enum.Enum):
    """Which ranks run a call: all of them, or rank 0 alone (its output is returned as is)."""

    ALL = "all"
    RANK_ZERO = "rank_zero"


def _collect_list(layout: GroupLayout, outputs: list[Any], context: Any) -> list[Any]:
    return list(outputs)


def _dispatch_one_to_all(layout: GroupLayout, args: tuple, kwargs: dict[str, Any]) -> DispatchPlan:
    n = layout.world_size
    return DispatchPlan([args] * n, [kwargs] * n)


def _per_rank(value: Any, n: int, what: str) -> Sequence[Any]:
    if not isinstance(value, (list, tuple)) or len(value) != n:
        got = f"a {type(value).__name__} of length {len(value)}" if hasattr(value, "__len__") else type(value).__name__
        raise ValueError(f"{what} must be a list with one entry per rank ({n}), got {got}")
    return value


def _dispatch_all_to_all(layout: GroupLayout, args: tuple, kwargs: dict[str, Any]) -> DispatchPlan:
    n = layout.world_size
    cols = [_per_rank(a, n, f"positional argument {i}") for i, a in enumerate(args)]
    kcols = {k: _per_rank(v, n, f"keyword argument {k!r}") for k, v in kwargs.items()}
    return DispatchPlan(
        [tuple(c[r] for c in cols) for r in range(n)],
        [{k: c[r] for k, c in kcols.items()} for r in range(n)],
    )


# ------------------------------------------------ data-parallel DataProto split
class Pending(abc.ABC):
    """A result that is not computed yet (the worker group's ``GroupFuture``)."""

    @abc.abstractmethod
    def get(self, timeout_s: float | None = None) -> Any:
        """Wait for the result and return it."""


@dataclass(frozen=True)
class FutureShard:
    """A dp shard of a not-yet-computed batch, cut inside the receiving worker.

    Sent instead of rows when a :class:`~hybridflow.core.worker_group.GroupFuture`
    is passed to a data-parallel call: the worker fetches the batch from the
    object store (worker to worker, never through the driver), pads it to a
    multiple of ``dp_size`` and keeps shard ``dp_rank``.
    """

    future: Pending
    dp_rank: int
    dp_size: int

    def resolve(self) -> tuple[DataProto, int]:
        """The shard and how many of its rows are real (not padding)."""
        data = self.future.get()
        if not isinstance(data, DataProto):
            raise TypeError(f"a data-parallel argument resolved to {type(data).__name__}, expected DataProto")
        padded, _ = data.pad_to_divisor(self.dp_size)
        size = len(padded) // self.dp_size
        real = max(0, min(size, len(data) - self.dp_rank * size))
        return padded[self.dp_rank * size : (self.dp_rank + 1) * size], real


@dataclass(frozen=True)
class Padding:
    """What a data-parallel split added: ``pad_size`` rows at the end, ``shard_rows`` rows per dp shard."""

    pad_size: int
    shard_rows: int


def expansion(output_rows: int, input_rows: int) -> int:
    """How many output rows a method made per input row; an error unless it is a whole number.

    A padded data-parallel call strips the padding rows' outputs by this
    factor, which needs each input row's outputs adjacent and in input order
    (``generate_sequences``' n samples per prompt are).
    """
    if input_rows <= 0 or output_rows % input_rows:
        raise ValueError(
            f"a padded data-parallel call got {output_rows} output rows for an input shard of {input_rows}; it must "
            "return the same whole number of rows (adjacent, in input order) for every input row, or be called with "
            "a batch that divides the data-parallel size so no padding is added"
        )
    return output_rows // input_rows


def _split_dp(layout: GroupLayout, args: tuple, kwargs: dict[str, Any]) -> DispatchPlan:
    """Split every DataProto argument into dp shards; replicate shards inside a dp group."""
    dp = layout.dp_size
    lengths = {len(v) for v in (*args, *kwargs.values()) if isinstance(v, DataProto)}
    if len(lengths) > 1:
        raise ValueError(f"data-parallel arguments must have equal lengths, got {sorted(lengths)}")
    pad_size = 0
    shard_rows = next(iter(lengths)) if lengths else 0

    def shards(value: Any, what: str) -> list[Any]:
        nonlocal pad_size
        if isinstance(value, DataProto):
            padded, pad_size = value.pad_to_divisor(dp)
            return padded.chunk(dp)
        if isinstance(value, Pending):
            return [FutureShard(value, i, dp) for i in range(dp)]
        raise TypeError(
            f"{what} is a {type(value).__name__}; data-parallel modes split DataProto arguments only "
            "(pass settings in DataProto.meta_info, or use ONE_TO_ALL)"
        )

    cols = [shards(a, f"positional argument {i}") for i, a in enumerate(args)]
    kcols = {k: shards(v, f"keyword argument {k!r}") for k, v in kwargs.items()}
    ranks = layout.ranks
    return DispatchPlan(
        [tuple(c[r.dp_rank] for c in cols) for r in ranks],
        [{k: c[r.dp_rank] for k, c in kcols.items()} for r in ranks],
        context=Padding(pad_size, (shard_rows + (-shard_rows % dp)) // dp),
    )


def _collect_dp_proto(layout: GroupLayout, outputs: list[Any], padding: Padding) -> DataProto:
    bad = [type(o).__name__ for o in outputs if not isinstance(o, DataProto)]
    if bad:
        raise TypeError(
            f"DP_COMPUTE_PROTO methods must return a DataProto, got {bad}; use DP_COMPUTE_METRIC for other values"
        )
    if not padding.pad_size:
        return DataProto.concat(outputs)
    factors = {expansion(len(o), padding.shard_rows) for o in outputs}
    if len(factors) > 1:
        raise ValueError(f"the dp ranks made different numbers of output rows per input row: {sorted(factors)}")
    return DataProto.concat(outputs).unpad(padding.pad_size * factors.pop())


def _collect_ranks_dp(layout: GroupLayout) -> list[int]:
    return layout.collect_ranks()


def strip_padding(output: Any, chunk_rows: int, real_rows: int) -> Any:
    """Drop the padding rows from a worker's output for a :class:`FutureShard` input."""
    if real_rows == chunk_rows or not isinstance(output, DataProto):
        return output
    return output[: real_rows * expansion(len(output), chunk_rows)]


ONE_TO_ALL = DispatchMode("ONE_TO_ALL", _dispatch_one_to_all, _collect_list)
"""Every rank gets the same arguments; the result is the list of rank outputs."""

ALL_TO_ALL = DispatchMode("ALL_TO_ALL", _dispatch_all_to_all, _collect_list)
"""Each argument is a list with one entry per rank, passed through; list of outputs."""

DP_COMPUTE = DispatchMode("DP_COMPUTE", _dispatch_all_to_all, _collect_list)
"""Per-rank argument lists of length world size (data-parallel compute on pre-split data); list of outputs."""

DP_COMPUTE_PROTO = DispatchMode(
    "DP_COMPUTE_PROTO",
    _split_dp,
    _collect_dp_proto,
    collect_ranks=_collect_ranks_dp,
    needs_layout=True,
    collect_copies=True,
)
"""Split DataProto arguments across dp groups (padded to a multiple of the dp
size), replicate each shard to every tensor/pipeline rank of its group, keep the
representative output of each dp group, concatenate in order, strip the padding
rows' outputs (a method that returns k rows per input row, adjacent and in order,
loses pad x k rows; any other row count with padding is an error, see :func:`expansion`)."""

DP_COMPUTE_METRIC = DispatchMode("DP_COMPUTE_METRIC", _split_dp, _collect_list, needs_layout=True)
"""Split like DP_COMPUTE_PROTO; the result is the list of every rank's output
(padding rows, if any, are computed on: pass a batch divisible by the dp size)."""


# ------------------------------------------------------------------ register
@dataclass(frozen=True)
class Registration:
    """What ``@register`` recorded for a worker method."""

    dispatch: DispatchMode = ONE_TO_ALL
    execute: Execute = Execute.ALL
    blocking: bool = True
    mesh: str = DEFAULT_MESH
    reads: tuple[str, ...] | None = None

    def select_inputs(self, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        """The call's arguments with every DataProto cut to the columns in :attr:`reads` that it has (all
        of ``meta_info`` kept); unchanged when the method declared none."""
        if self.reads is None:
            return args, kwargs

        def lean(value: Any) -> Any:
            if not isinstance(value, DataProto):
                return value
            return value.select(
                [k for k in self.reads if k in value.batch], [k for k in self.reads if k in value.non_tensor_batch]
            )

        return tuple(lean(a) for a in args), {k: lean(v) for k, v in kwargs.items()}


F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class RegisteredMethod(Generic[F]):
    """A worker method plus its :class:`Registration`; behaves as the method on instances."""

    fn: F
    registration: Registration = field(default_factory=Registration)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return self.fn.__get__(instance, owner)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def register(
    dispatch: DispatchMode = ONE_TO_ALL,
    execute: Execute = Execute.ALL,
    blocking: bool = True,
    mesh: str = DEFAULT_MESH,
    reads: Sequence[str] | None = None,
) -> Callable[[F], RegisteredMethod[F]]:
    """Mark a :class:`~hybridflow.core.worker.Worker` method as callable on the whole group.

    ``dispatch`` is a :class:`DispatchMode` constant, ``execute`` an
    :class:`Execute` member; with ``blocking=False`` the group call returns a
    future instead of the result. ``mesh`` names the worker's device mesh
    whose data-parallel layout splits the data (a worker that generates on
    a tensor-parallel layout and trains on another registers its generate
    method with the rollout mesh's name). ``reads`` names the DataProto
    columns (tensor or not) the method reads: the group ships only those
    (the ones present; optional inputs may be listed), so a call does not
    carry columns its workers never look at. None: every column.
    """
    if not isinstance(dispatch, DispatchMode):
        raise TypeError(f"dispatch must be a DispatchMode (e.g. DP_COMPUTE_PROTO), got {dispatch!r}")
    if not isinstance(execute, Execute):
        raise TypeError(f"execute must be an Execute member (Execute.ALL, Execute.RANK_ZERO), got {execute!r}")

    def wrap(fn: F) -> RegisteredMethod[F]:
        return RegisteredMethod(
            fn, Registration(dispatch, execute, blocking, mesh, None if reads is None else tuple(reads))
        )

    return wrap

"""One rank of an SPMD worker group, and the process that hosts it.

:class:`Worker` is what users subclass (actor, rollout, reference, critic):
it reads its rank from the environment the group sets, initializes
``torch.distributed`` and a named device mesh, and reports its data-parallel
position to the group.

:class:`WorkerHost` is the body of the one Ray actor per bundle. It holds one
worker instance per *role* (several when roles are colocated, see
``core/colocate.py``) and runs the calls the driver sends to a role. It
resolves futures from other groups inside this process, so their data moves
worker to worker through Ray's object store.
"""

from __future__ import annotations

import datetime
import itertools
import logging
import os
import random
import socket
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from hybridflow.core.data_proto import DataProto
from hybridflow.core.dispatch import DEFAULT_MESH, FutureShard, Pending, RankLayout, strip_padding
from hybridflow.core.keys import METRICS
from hybridflow.core.memory import MEMORY_PEAK_GB, map_large_allocations, measure

__all__ = ["RankEnv", "RoleSpec", "Worker", "WorkerHost", "HostInfo", "CallHeader", "ProtoPayload", "timeout_options"]

logger = logging.getLogger(__name__)


_TIMEOUT_VAR = "HYBRIDFLOW_COLLECTIVE_TIMEOUT_S"


@dataclass(frozen=True)
class RankEnv:
    """The environment variables a group sets for one rank before its workers start."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    collective_timeout_s: float = 600.0  # every collective's bound (GroupOptions.collective_timeout_s)

    def as_environ(self) -> dict[str, str]:
        """The variables ``torch.distributed``'s ``env://`` initialization reads, and the collectives' bound."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            _TIMEOUT_VAR: repr(float(self.collective_timeout_s)),
        }

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> RankEnv:
        """Read the variables back; a process outside any group is rank 0 of 1."""
        env = os.environ if environ is None else environ
        return cls(
            rank=int(env.get("RANK", 0)),
            world_size=int(env.get("WORLD_SIZE", 1)),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", 1)),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", 29500)),
            collective_timeout_s=float(env.get(_TIMEOUT_VAR, 600.0)),
        )


class Worker:
    """Base class for one rank of a worker group.

    Subclasses decorate the methods the driver calls with
    :func:`~hybridflow.core.dispatch.register`. Build the device mesh (if any)
    in ``__init__``: the group reads each rank's data-parallel position once,
    right after construction.
    """

    def __init__(self) -> None:
        self.env = RankEnv.from_environ()
        self.device_mesh: Any = None  # the default mesh (see init_device_mesh)
        self._meshes: dict[str, tuple[Any, str]] = {}  # mesh name -> (DeviceMesh, dp dim name)

    # ------------------------------------------------------------- identity
    @property
    def rank(self) -> int:
        """Global rank in the group."""
        return self.env.rank

    @property
    def world_size(self) -> int:
        """Number of ranks in the group."""
        return self.env.world_size

    @property
    def local_rank(self) -> int:
        """Rank among this node's ranks of the group."""
        return self.env.local_rank

    @property
    def device(self) -> torch.device:
        """``cuda:<local device>`` when Ray gave this rank a GPU, else ``cpu``."""
        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    # ---------------------------------------------------------- distributed
    @property
    def backend(self) -> str:
        """The ``torch.distributed`` backend of this rank's device: nccl on CUDA, gloo on CPU."""
        return "nccl" if self.device.type == "cuda" else "gloo"

    def init_process_group(self, backend: str | None = None, timeout_s: float | None = None) -> None:
        """Join the group's ``torch.distributed`` default process group (env://).

        ``backend`` defaults to :attr:`backend`; ``timeout_s`` (the start's and
        every collective's bound) to the group's ``collective_timeout_s``.
        Colocated roles share one process, so a second call in the same
        process is a no-op.
        """
        if dist.is_initialized():
            return
        timeout = datetime.timedelta(seconds=self.env.collective_timeout_s if timeout_s is None else timeout_s)
        dist.init_process_group(
            backend=backend or self.backend,
            init_method="env://",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timeout,
        )
        logger.debug("rank %d/%d joined %s process group", self.rank, self.world_size, backend)

    def init_device_mesh(
        self, shape: Sequence[int], dim_names: Sequence[str], dp_dim: str = "dp", name: str = DEFAULT_MESH
    ) -> Any:
        """Build a named ``DeviceMesh`` (e.g. ``(2, 2), ("dp", "tp")``) over the group.

        ``dp_dim`` names the data-parallel axis: a rank's coordinate on it is
        its dp rank, and the rank whose other coordinates are all 0 is its dp
        group's representative (the one whose output the collect step keeps).
        A worker may hold several meshes over the same ranks under different
        ``name`` s (the actor trains on one layout and generates on another); a
        method registered with ``@register(..., mesh=name)`` is dispatched by
        that mesh's layout. The default mesh is also ``self.device_mesh``.
        Initializes the process group first if needed.
        """
        if dp_dim not in dim_names:
            raise ValueError(f"dp_dim {dp_dim!r} is not one of the mesh dims {tuple(dim_names)}")
        if len(shape) != len(dim_names):
            raise ValueError(f"mesh shape {tuple(shape)} and dim names {tuple(dim_names)} differ in length")
        size = 1
        for s in shape:
            size *= s
        if size != self.world_size:
            raise ValueError(f"mesh shape {tuple(shape)} has {size} ranks but the group has {self.world_size}")
        self.init_process_group()
        # torch gives each sub-group of a mesh its backend's default timeout (30 min), not the default group's
        bound = {name: timeout_options(self.backend, self.env.collective_timeout_s) for name in dim_names}
        mesh = init_device_mesh(self.device.type, tuple(shape), mesh_dim_names=tuple(dim_names), backend_override=bound)
        self._meshes[name] = (mesh, dp_dim)
        if name == DEFAULT_MESH:
            self.device_mesh = mesh
        return mesh

    def mesh_names(self) -> list[str]:
        """The names of the meshes built so far (always including the default one)."""
        return list(dict.fromkeys([DEFAULT_MESH, *self._meshes]))

    def dp_layout(self, mesh: str = DEFAULT_MESH) -> RankLayout:
        """This rank's data-parallel position on mesh ``mesh`` (every rank its own group without a mesh)."""
        if mesh not in self._meshes:
            if mesh != DEFAULT_MESH:
                raise KeyError(f"{type(self).__name__} has no mesh named {mesh!r}; built: {sorted(self._meshes)}")
            return RankLayout(self.rank, self.world_size, True)
        device_mesh, dp_dim = self._meshes[mesh]
        coords = device_mesh.get_coordinate()
        dp_axis = device_mesh.mesh_dim_names.index(dp_dim)
        others_zero = all(c == 0 for i, c in enumerate(coords) if i != dp_axis)
        return RankLayout(coords[dp_axis], device_mesh.size(dp_axis), others_zero)


def timeout_options(backend: str, timeout_s: float) -> tuple[str, Any]:
    """``(backend, options)`` whose process groups time out after ``timeout_s`` (a ``backend_override`` entry)."""
    options = dist.ProcessGroupNCCL.Options() if backend == "nccl" else dist.ProcessGroupGloo._Options()
    options._timeout = datetime.timedelta(seconds=timeout_s)
    return backend, options


def _attach_peak(output: Any, peak: float) -> None:
    """Put a stage's peak memory where its result carries metrics (a DataProto's or a metrics dict)."""
    if isinstance(output, DataProto):
        output.meta_info.setdefault(METRICS, {})[MEMORY_PEAK_GB] = peak
    elif isinstance(output, dict) and all(isinstance(v, (int, float)) for v in output.values()):
        output[MEMORY_PEAK_GB] = peak


# ----------------------------------------------------------------- the host
@dataclass(frozen=True)
class RoleSpec:
    """A worker class and its constructor arguments, for one role of a group."""

    cls: type[Worker]
    args: tuple = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


CallHeader = tuple[str, str, bool, "tuple[int, int, bool] | None", str]
"""``(role, method, keep_output, expected_layout, mesh)`` of one call on one rank.

``keep_output``: the collect step uses this rank's output (other ranks return
``None`` and save the transfer). ``expected_layout``: the ``(dp_rank, dp_size,
is_collect_rank)`` the driver split the data for, checked against the worker's
own on the mesh named ``mesh``; None when the mode ignores the layout. A plain tuple on purpose: Ray
serializes it with msgpack, while an object header would go through
cloudpickle on every call of every rank.
"""


@dataclass(frozen=True)
class ProtoPayload:
    """A DataProto on its way from a worker to the collect step.

    It travels as DataProto's own pickled state (numpy buffers). Unpickling a
    DataProto copies every tensor out of Ray's read-only object store; a collect
    step that concatenates anyway can instead take read-only views
    (``views=True``) and let the concatenation make the one copy.
    """

    state: dict[str, Any]

    @classmethod
    def wrap(cls, data: DataProto) -> ProtoPayload:
        """Carry ``data`` (its tensors as numpy arrays, no copy)."""
        return cls(data.__getstate__())

    def unwrap(self, views: bool = False) -> DataProto:
        """The DataProto: writable copies, or (``views``) read-only views that must not escape."""
        if not views:
            data = DataProto.__new__(DataProto)
            data.__setstate__(self.state)
            return data
        batch = {}
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            for key, (arr, dtype_name) in self.state["batch"].items():
                t, dtype = torch.from_numpy(arr), getattr(torch, dtype_name)
                batch[key] = t if t.dtype == dtype else t.view(dtype)
        return DataProto(batch, self.state["non_tensor_batch"], self.state["meta_info"])


@dataclass(frozen=True)
class HostInfo:
    """Where a host process runs."""

    node_ip: str
    node_id: str
    pid: int


LISTEN_PORTS = range(20_000, 32_000)
"""Where :func:`free_ports` looks: below Linux's ephemeral range (32768-60999), from which every outgoing
connection takes its local port, so a port picked here and bound a moment later is not taken meanwhile by one
(the kernel's ``bind(0)`` picked from that range, and a rank's store once lost its port so: EADDRINUSE)."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on this machine right now (all bound at once, then released), drawn at
    random from :data:`LISTEN_PORTS`."""
    sockets: list[socket.socket] = []
    draw = random.SystemRandom()
    try:
        for _ in range(count + 1000):  # a port in use (or drawn twice) does not bind: draw again
            if len(sockets) == count:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("", draw.choice(LISTEN_PORTS)))
            except OSError:
                s.close()
                continue
            sockets.append(s)
        if len(sockets) < count:
            raise OSError(f"fewer than {count} free TCP ports in {LISTEN_PORTS.start}-{LISTEN_PORTS.stop - 1}")
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


class WorkerHost:
    """The Ray actor body: one process per bundle holding one worker per role."""

    def __init__(self, torch_threads: int | None = 1, mmap_threshold_mb: float | None = None) -> None:
        if torch_threads is not None:
            torch.set_num_threads(torch_threads)
            os.environ["OMP_NUM_THREADS"] = str(torch_threads)
        if mmap_threshold_mb is not None:
            map_large_allocations(mmap_threshold_mb)
        self.workers: dict[str, Worker] = {}
        self._calls: dict[int, tuple[str, float]] = {}  # the calls running now: id -> (role.method, start)
        self._next_call = itertools.count()

    def heartbeat(self) -> list[tuple[str, float]]:
        """The calls this process runs now, ``(role.method, seconds so far)`` each. The driver calls it on the
        ``control`` concurrency group while it waits on a call (``core/rank_wait.py``): an answer says the process
        is alive. It runs beside the calls, so it only reads."""
        now = time.monotonic()
        return [(name, now - start) for name, start in list(self._calls.values())]

    def info(self) -> HostInfo:
        """Node address, node id and pid of this process."""
        # Imported here, not at the top: this module is part of hybridflow.core's
        # eager imports, which must not load Ray (estimators import core).
        import ray

        ctx = ray.get_runtime_context()
        return HostInfo(ray.util.get_node_ip_address(), ctx.get_node_id(), os.getpid())

    def free_port(self) -> int:
        """A TCP port free on this node right now (for MASTER_PORT)."""
        return free_ports(1)[0]

    def start(self, env: RankEnv, roles: Mapping[str, RoleSpec]) -> dict[str, dict[str, RankLayout]]:
        """Set the rank's environment, construct every role's worker, return their dp layouts."""
        os.environ.update(env.as_environ())
        for name, spec in roles.items():
            try:
                self.workers[name] = spec.cls(*spec.args, **dict(spec.kwargs))
            except Exception as err:
                raise RuntimeError(
                    f"role {name!r} ({spec.cls.__name__}) failed to start on rank {env.rank}: {err!r}"
                ) from err
        return self.layouts()

    def layouts(self) -> dict[str, dict[str, RankLayout]]:
        """Each role's current data-parallel position on each of its meshes: ``{role: {mesh: layout}}``."""
        return {name: {m: w.dp_layout(m) for m in w.mesh_names()} for name, w in self.workers.items()}

    def execute(self, header: CallHeader, /, *args: Any, **kwargs: Any) -> Any:
        """Run one call on this rank: ``header`` says which, see :data:`CallHeader`.

        Futures among the arguments are resolved here, in this process. DataProto
        arguments are moved to the worker's device (``Worker.device``: the GPU Ray
        assigned, or the CPU) before the method runs, and a DataProto result goes
        back as CPU tensors: a worker method computes on its device and never
        moves its inputs itself.
        """
        role, method = header[0], header[1]
        call = next(self._next_call)
        self._calls[call] = (f"{role}.{method}", time.monotonic())
        try:
            return self._execute(header, args, kwargs)
        finally:
            del self._calls[call]

    def _execute(self, header: CallHeader, args: tuple, kwargs: dict[str, Any]) -> Any:
        role, method, keep_output, expected_layout, mesh = header
        worker = self.workers[role]
        if expected_layout is not None:
            actual = worker.dp_layout(mesh)
            if (actual.dp_rank, actual.dp_size, actual.is_collect_rank) != tuple(expected_layout):
                raise RuntimeError(
                    f"role {role!r} rank {worker.rank}: the driver split the data for (dp_rank, dp_size, "
                    f"is_collect_rank)={tuple(expected_layout)} but the worker's mesh now says {actual}; build the "
                    "mesh in __init__ or call refresh_layout() on the group after changing it"
                )
        shard_rows: list[tuple[int, int]] = []
        device = worker.device

        def resolve(value: Any) -> Any:
            if isinstance(value, FutureShard):
                shard, real = value.resolve()
                shard_rows.append((len(shard), real))
                value = shard
            elif isinstance(value, Pending):
                value = value.get()
            # every method gets its batch on the worker's device, moved once, here
            return value.to(device) if isinstance(value, DataProto) else value

        args = tuple(resolve(a) for a in args)
        kwargs = {k: resolve(v) for k, v in kwargs.items()}
        with measure(device) as peak:
            output = getattr(worker, method)(*args, **kwargs)
        if expected_layout is not None:  # a data-parallel stage: report its peak memory with its result
            _attach_peak(output, peak[0])
        if shard_rows:
            output = strip_padding(output, *shard_rows[0])
        if not keep_output:
            return None
        # and every batch leaves as CPU tensors (what crosses to the driver is numpy underneath)
        return ProtoPayload.wrap(output.to("cpu")) if isinstance(output, DataProto) else output

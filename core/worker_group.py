"""RayWorkerGroup: one driver call fans out to every rank of an SPMD group.

::

    driver                          Ray actors (one per bundle)
    ------                          ---------------------------
    wg.compute_log_prob(batch)
      mode.dispatch(layout, ...)  -> rank 0: WorkerHost.execute(target, shard 0)
      (one plan, per-rank args)   -> rank 1: WorkerHost.execute(target, shard 0)  (tp peer)
                                  -> rank 2: WorkerHost.execute(target, shard 1)
                                  -> ...
      ray.get(refs, timeout)     <-  outputs (None from ranks the collect skips)
      mode.collect(layout, kept)  -> one DataProto, rows in the caller's order

The group exposes every ``@register``-ed method of its worker class as an
attribute (looked up on the class, nothing is generated or patched). A call
with ``blocking=False`` returns a :class:`GroupFuture`; handing that future to
another group's call makes the receiving workers fetch the data themselves.

Failures never hang (``core/rank_wait.py``): the wait ends as soon as any
rank fails, and the error names the role, method, rank, node and pid with
the worker's own traceback and the ranks still in the call; a rank that
stops answering the heartbeat is named; every call takes an optional
timeout, and every collective among the ranks the group's
``collective_timeout_s``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hybridflow.core.data_proto import DataProto
from hybridflow.core.dispatch import (
    DEFAULT_MESH,
    DispatchMode,
    DispatchPlan,
    Execute,
    GroupLayout,
    Pending,
    RankLayout,
    RegisteredMethod,
    Registration,
)
from hybridflow.core.rank_wait import (
    CONTROL_GROUP,
    Heartbeat,
    RankCall,
    RankLabel,
    Watch,
    WorkerError,
    WorkerStalledError,
    WorkerTimeoutError,
    wait_ranks,
)
from hybridflow.core.resource_pool import ResourcePool
from hybridflow.core.worker import HostInfo, ProtoPayload, RankEnv, RoleSpec, Worker, WorkerHost

__all__ = [
    "GroupFuture",
    "GroupMethod",
    "GroupOptions",
    "HostGroup",
    "RankLabel",
    "RayWorkerGroup",
    "RoleGroup",
    "WorkerError",
    "WorkerStalledError",
    "WorkerTimeoutError",
    "gather",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupOptions:
    """Settings of a worker group (not of its workers).

    Attributes:
        call_timeout_s: default timeout of every call (None: wait as long as
            the workers are alive; a dead worker still fails the call at once).
        start_timeout_s: how long actor start-up and worker construction may take.
        cpu_torch_threads: torch threads per rank on CPU-only pools (one is
            fastest on small machines); GPU pools keep torch's default.
        cpu_mmap_threshold_mb: on CPU-only pools, host blocks of at least this many MiB are mapped apart and
            returned to the system when freed (:func:`~hybridflow.core.memory.map_large_allocations`); None:
            glibc's own threshold.
        name: prefix of the Ray actor names, for logs.
        max_concurrency: calls one rank runs at once, each in a thread of its own (Ray's threaded actors).
            1 runs them one after another, in order. A worker that serves waiting calls beside others (the
            rollout stream: several ``generate_stream`` calls and a weight transfer at once) needs more.
        collective_timeout_s: bound of every ``torch.distributed`` collective among the group's ranks
            (``Worker.init_process_group`` and every sub-group of ``Worker.init_device_mesh``).
        heartbeat: while a call is waited on, ask its ranks this often whether they are alive and name one
            silent for ``stall_s`` (``core/rank_wait.py``); None asks nothing.
    """

    call_timeout_s: float | None = None
    start_timeout_s: float = 120.0
    cpu_torch_threads: int = 1
    cpu_mmap_threshold_mb: float | None = None
    name: str = "hybridflow"
    max_concurrency: int = 1
    collective_timeout_s: float = 600.0
    heartbeat: Heartbeat | None = Heartbeat(interval_s=5.0, stall_s=60.0)


class GroupFuture(Pending):
    """The pending result of a ``blocking=False`` group call.

    ``get()`` on the driver waits and collects. Passed as an argument to
    another group's call, it travels as object references and is resolved
    inside the receiving workers. :func:`gather` waits on several at once.
    """

    def __init__(
        self,
        calls: Sequence[RankCall],
        keep: Sequence[int],
        mode: DispatchMode | None,
        layout: GroupLayout,
        context: Any,
        timeout_s: float | None,
        heartbeat: Heartbeat | None,
        traffic: Traffic | None = None,
    ) -> None:
        self.calls, self.keep = list(calls), list(keep)
        self.mode, self.layout, self.context = mode, layout, context
        self.timeout_s, self.heartbeat, self.traffic = timeout_s, heartbeat, traffic

    @property
    def refs(self) -> list[Any]:
        """One object reference per rank."""
        return [call.ref for call in self.calls]

    def get(self, timeout_s: float | None = None) -> Any:
        """Wait for every rank (at most ``timeout_s``, default the call's) and collect."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        return self.collect(wait_ranks(self.calls, timeout, self.heartbeat))

    def collect(self, values: Sequence[Any]) -> Any:
        """The call's result from every rank's value (what :meth:`get` returns)."""
        views = self.mode is not None and self.mode.collect_copies
        kept = [v.unwrap(views) if isinstance(v, ProtoPayload) else v for v in (values[i] for i in self.keep)]
        if self.traffic is not None:
            self.traffic.received += _proto_bytes(kept)
        if self.mode is None:  # Execute.RANK_ZERO: rank 0's output as is
            return kept[0]
        return self.mode.collect(self.layout, kept, self.context)

    def __repr__(self) -> str:
        return f"GroupFuture({self.calls[0].name}, {len(self.calls)} ranks)"


def gather(*futures: GroupFuture, watches: Sequence[Watch] = ()) -> list[Any]:
    """The results of calls that need each other (a weight sync: the sender and its receivers), waited on as one:
    a rank that fails or stalls in any of them ends the wait at once, named, rather than after the others'
    timeouts. The first future's timeout and heartbeat apply; ``watches`` join the wait (a server process
    receiving what the ranks send, :class:`~hybridflow.core.rank_wait.ServiceWatch`)."""
    calls = [call for future in futures for call in future.calls]
    values = wait_ranks(calls, futures[0].timeout_s, futures[0].heartbeat, watches)
    out, at = [], 0
    for future in futures:
        out.append(future.collect(values[at : at + len(future.calls)]))
        at += len(future.calls)
    return out


@dataclass
class Traffic:
    """Bytes of DataProto columns (:meth:`DataProto.nbytes`) the driver shipped to a group's ranks and
    collected back since the last :meth:`take`; a payload several ranks share counts once (it is put in
    the object store once)."""

    sent: int = 0
    received: int = 0

    def take(self) -> tuple[int, int]:
        """``(sent, received)`` so far, and start counting again from zero."""
        out = (self.sent, self.received)
        self.sent = self.received = 0
        return out


def _plan_values(plan: DispatchPlan) -> list[Any]:
    return [v for args in plan.rank_args for v in args] + [v for kw in plan.rank_kwargs for v in kw.values()]


def _proto_bytes(values: Any) -> int:
    return sum(v.nbytes() for v in values if isinstance(v, DataProto))


# ------------------------------------------------------------------ hosts
class HostGroup:
    """The Ray actors of a group, one :class:`WorkerHost` per bundle, started and labelled."""

    def __init__(self, resource_pool: ResourcePool, roles: Mapping[str, RoleSpec], options: GroupOptions) -> None:
        self.resource_pool, self.options = resource_pool, options
        self.roles = dict(roles)
        self.handles: list[Any] = []
        self.traffic = Traffic()
        bundles = resource_pool.bundles()
        resource_pool.claim()  # fails fast when more groups than max_colocate_count share it
        res = resource_pool.actor_resources()
        threads = None if resource_pool.use_gpu else options.cpu_torch_threads
        mmap_threshold = None if resource_pool.use_gpu else options.cpu_mmap_threshold_mb
        # the heartbeat's own thread: a rank busy in a call still answers (core/rank_wait.py)
        remote_host = ray.remote(concurrency_groups={CONTROL_GROUP: 1})(WorkerHost)
        self.handles = [
            remote_host.options(
                num_cpus=res["num_cpus"],
                num_gpus=res["num_gpus"],
                max_concurrency=options.max_concurrency,
                scheduling_strategy=PlacementGroupSchedulingStrategy(b.placement_group, b.bundle_index),
            ).remote(threads, mmap_threshold)
            for b in bundles
        ]
        role_names = ",".join(self.roles)
        boot = [RankLabel(b.rank, b.node_ip, b.node_id, -1) for b in bundles]
        try:
            self.labels = boot
            infos: list[HostInfo] = self.wait(
                [h.info.remote() for h in self.handles], "<start>", options.start_timeout_s, heartbeat=False
            )
            self.labels = [RankLabel(b.rank, i.node_ip, i.node_id, i.pid) for b, i in zip(bundles, infos)]
            _, port = self.free_port()
            envs = [
                RankEnv(
                    b.rank,
                    len(bundles),
                    b.local_rank,
                    b.local_world_size,
                    self.labels[0].node_ip,
                    port,
                    options.collective_timeout_s,
                )
                for b in bundles
            ]
            # no heartbeat: construction imports and builds models holding Python's lock for seconds on a loaded
            # machine (a 3 s stall bound tripped there); start_timeout_s bounds it
            self._set_layouts(
                self.wait(
                    [h.start.remote(env, self.roles) for h, env in zip(self.handles, envs)],
                    "__init__",
                    options.start_timeout_s,
                    heartbeat=False,
                )
            )
        except BaseException:
            self.shutdown()
            raise
        logger.info("started %d ranks for roles %s", len(self.handles), role_names)

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return len(self.handles)

    def rank_calls(self, refs: Sequence[Any], method: str, role: str | None = None) -> list[RankCall]:
        """The ranks' parts in a call (one ref per rank, from rank 0), for :func:`wait_ranks`."""
        role = ",".join(self.roles) if role is None else role
        return [
            RankCall(ref, label, handle, role, method) for ref, label, handle in zip(refs, self.labels, self.handles)
        ]

    def wait(self, refs: Sequence[Any], method: str, timeout_s: float | None, heartbeat: bool = True) -> list[Any]:
        """The values of a call of the host group's own (start-up, layouts, a port), one ref per rank from rank 0."""
        return wait_ranks(self.rank_calls(refs, method), timeout_s, self.options.heartbeat if heartbeat else None)

    def free_port(self) -> tuple[str, int]:
        """Rank 0's node address and a TCP port free there now (for a process group of the caller's own)."""
        port = self.wait([self.handles[0].free_port.remote()], "<free_port>", 30.0)[0]
        return self.labels[0].node_ip, int(port)

    def _set_layouts(self, rank_layouts: Sequence[Mapping[str, Mapping[str, RankLayout]]]) -> None:
        self.layouts = {
            role: {mesh: GroupLayout(tuple(r[role][mesh] for r in rank_layouts)) for mesh in rank_layouts[0][role]}
            for role in self.roles
        }

    def layout(self, role: str, mesh: str = DEFAULT_MESH) -> GroupLayout:
        """The data-parallel layout of ``role`` on its mesh ``mesh``, as read at start (or the last refresh)."""
        meshes = self.layouts[role]
        if mesh not in meshes:
            raise KeyError(
                f"role {role!r} has no device mesh named {mesh!r} (meshes: {sorted(meshes)}); build it in the "
                "worker's __init__ with init_device_mesh(..., name=...)"
            )
        return meshes[mesh]

    def refresh_layouts(self) -> None:
        """Read every role's data-parallel layout again (after a mesh was rebuilt)."""
        self._set_layouts(
            self.wait([h.layouts.remote() for h in self.handles], "layouts", self.options.start_timeout_s)
        )

    def shutdown(self) -> None:
        """Kill the actors (the pool's bundles stay reserved for other groups)."""
        if not self.handles:
            return
        for h in self.handles:
            ray.kill(h)
        self.handles = []
        self.resource_pool.unclaim()


# ------------------------------------------------------------------ calls
def _layout_tuple(rank: RankLayout) -> tuple[int, int, bool]:
    return (rank.dp_rank, rank.dp_size, rank.is_collect_rank)


class GroupMethod:
    """A registered worker method bound to a group: call it like the method itself.

    ``.options(timeout_s=..., blocking=...)`` returns a copy with other call settings.
    """

    def __init__(self, group: RoleGroup, name: str, registration: Registration, timeout_s: float | None) -> None:
        self.group, self.name, self.registration, self.timeout_s = group, name, registration, timeout_s

    def options(self, *, timeout_s: float | None = None, blocking: bool | None = None) -> GroupMethod:
        """This method with a call timeout and/or blocking setting overridden."""
        reg = self.registration if blocking is None else replace(self.registration, blocking=blocking)
        return GroupMethod(self.group, self.name, reg, self.timeout_s if timeout_s is None else timeout_s)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        future = self.group._submit(self.name, self.registration, args, kwargs, self.timeout_s)
        return future.get() if self.registration.blocking else future

    def __repr__(self) -> str:
        reg = self.registration
        return f"<group method {self.group.role}.{self.name} {reg.dispatch.name} {reg.execute.name}>"


class RoleGroup:
    """The driver's handle on one role of a group of hosts.

    Every ``@register``-ed method of the role's worker class is an attribute:
    ``group.compute_log_prob(batch)``.
    """

    def __init__(self, hosts: HostGroup, role: str, worker_cls: type[Worker]) -> None:
        self.hosts, self.role, self.worker_cls = hosts, role, worker_cls

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return self.hosts.world_size

    @property
    def labels(self) -> list[RankLabel]:
        """Rank, node and pid of every rank."""
        return list(self.hosts.labels)

    @property
    def layout(self) -> GroupLayout:
        """The role's data-parallel layout (on its default mesh)."""
        return self.hosts.layout(self.role)

    def layout_of(self, mesh: str) -> GroupLayout:
        """The role's data-parallel layout on its device mesh named ``mesh``."""
        return self.hosts.layout(self.role, mesh)

    def refresh_layout(self) -> None:
        """Read the data-parallel layout again after workers rebuilt their mesh."""
        self.hosts.refresh_layouts()

    def registered_methods(self) -> list[str]:
        """Names of the methods callable on the group."""
        return sorted(
            name
            for name in dir(self.worker_cls)
            if isinstance(inspect.getattr_static(self.worker_cls, name, None), RegisteredMethod)
        )

    def __getattr__(self, name: str) -> GroupMethod:
        if name.startswith("_"):
            raise AttributeError(name)
        attr = inspect.getattr_static(self.worker_cls, name, None)
        if not isinstance(attr, RegisteredMethod):
            raise AttributeError(
                f"{self.worker_cls.__name__} (role {self.role!r}) has no @register-ed method {name!r}; "
                f"registered: {self.registered_methods()}"
            )
        return GroupMethod(self, name, attr.registration, self.hosts.options.call_timeout_s)

    def _submit(
        self, name: str, reg: Registration, args: tuple, kwargs: dict[str, Any], timeout_s: float | None
    ) -> GroupFuture:
        layout = self.hosts.layout(self.role, reg.mesh)
        mode = reg.dispatch
        plan = self._shared(mode.dispatch(layout, *reg.select_inputs(args, kwargs)))
        handles = self.hosts.handles
        if not handles:
            raise RuntimeError(f"group {self.role!r} was shut down")
        if reg.execute is Execute.RANK_ZERO:
            expected = _layout_tuple(layout.ranks[0]) if mode.needs_layout else None
            ref = handles[0].execute.remote(
                (self.role, name, True, expected, reg.mesh), *plan.rank_args[0], **plan.rank_kwargs[0]
            )
            calls = self.hosts.rank_calls([ref], name, self.role)
            return GroupFuture(
                calls, [0], None, layout, plan.context, timeout_s, self.hosts.options.heartbeat, self.hosts.traffic
            )
        keep = mode.collect_ranks(layout)
        kept = set(keep)
        refs = [
            h.execute.remote(
                (self.role, name, r in kept, _layout_tuple(layout.ranks[r]) if mode.needs_layout else None, reg.mesh),
                *plan.rank_args[r],
                **plan.rank_kwargs[r],
            )
            for r, h in enumerate(handles)
        ]
        return GroupFuture(
            self.hosts.rank_calls(refs, name, self.role),
            keep,
            mode,
            layout,
            plan.context,
            timeout_s,
            self.hosts.options.heartbeat,
            self.hosts.traffic,
        )

    def _shared(self, plan: DispatchPlan) -> DispatchPlan:
        """The plan with each DataProto that several ranks receive (a dp shard and its tensor-parallel
        peers, a ONE_TO_ALL argument) put in Ray's object store once and passed by reference (Ray hands
        the workers the value); the traffic counter counts each payload once."""
        uses: dict[int, int] = {}
        for value in _plan_values(plan):
            if isinstance(value, DataProto):
                uses[id(value)] = uses.get(id(value), 0) + 1
        refs: dict[int, Any] = {}

        def ship(value: Any) -> Any:
            if not isinstance(value, DataProto):
                return value
            key = id(value)
            if key not in refs:
                self.hosts.traffic.sent += value.nbytes()
                refs[key] = ray.put(value) if uses[key] > 1 else value
            return refs[key]

        return replace(
            plan,
            rank_args=[tuple(ship(a) for a in args) for args in plan.rank_args],
            rank_kwargs=[{k: ship(v) for k, v in kw.items()} for kw in plan.rank_kwargs],
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} role={self.role!r} cls={self.worker_cls.__name__} world_size={self.world_size}>"


class RayWorkerGroup(RoleGroup):
    """One worker class on a resource pool: one Ray actor per bundle.

    ``RayWorkerGroup(pool, MyWorker, *args, **kwargs)`` starts ``MyWorker(*args,
    **kwargs)`` on every rank with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
    MASTER_PORT set. For group settings (timeouts) or several roles in one
    process, use :class:`~hybridflow.core.colocate.ColocatedWorkerGroup`.
    """

    def __init__(self, resource_pool: ResourcePool, worker_cls: type[Worker], *args: Any, **kwargs: Any) -> None:
        role = worker_cls.__name__
        hosts = HostGroup(resource_pool, {role: RoleSpec(worker_cls, args, kwargs)}, GroupOptions())
        super().__init__(hosts, role, worker_cls)

    def shutdown(self) -> None:
        """Kill the group's actors."""
        self.hosts.shutdown()

    def __enter__(self) -> RayWorkerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

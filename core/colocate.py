"""Colocated roles: several worker classes in one process per bundle.

HybridFlow time-slices one set of devices between the stages of an RL step
(rollout, actor, reference, critic). Here that is plain composition:

* every bundle runs one Ray actor, a :class:`~hybridflow.core.worker.WorkerHost`;
* the host holds one ordinary instance of each role's worker class in a dict
  keyed by role name (``{"actor": ActorWorker(...), "ref": RefWorker(...)}``);
  the roles share the process, its device, and its ``torch.distributed``
  process group (the first role to initialize it creates it, later ones reuse
  it);
* on the driver, :class:`ColocatedWorkerGroup` gives one
  :class:`~hybridflow.core.worker_group.RoleGroup` per role
  (``wg.actor.compute_log_prob(batch)``, ``wg.ref.compute_ref_log_prob(batch)``);
  a call names its role in the message to the host, which runs that role's
  method.

No class is generated at run time and nothing is patched onto a class: the
worker classes stay exactly as written, so readers and type checkers see what
runs. Two roles may define methods of the same name without clashing.
Offloading an idle role's state is the role's own business: each worker's
:class:`~hybridflow.workers.offload.StateOffloader` brings its parameters or
optimizer state back for the stages that need them and sends them away
afterwards; the driver makes no call for it.
"""

from __future__ import annotations

import keyword
from collections.abc import Mapping
from typing import Any

from hybridflow.core.resource_pool import ResourcePool
from hybridflow.core.worker import RoleSpec
from hybridflow.core.worker_group import GroupOptions, HostGroup, RoleGroup

__all__ = ["ColocatedWorkerGroup", "RoleSpec"]

_OWN_ATTRIBUTES = frozenset({"hosts", "roles"})


class ColocatedWorkerGroup:
    """Several roles fused into one Ray actor per bundle, one handle per role.

    Example::

        pool = ResourcePool([4])
        wg = ColocatedWorkerGroup(pool, {
            "actor": RoleSpec(ActorWorker, kwargs={"config": actor_cfg}),
            "ref": RoleSpec(RefWorker, kwargs={"config": ref_cfg}),
        })
        batch = wg.actor.compute_log_prob(batch)
        ref = wg.ref.compute_ref_log_prob(batch)

    A single role with :class:`GroupOptions` (timeouts) is this class with one entry.
    """

    def __init__(
        self, resource_pool: ResourcePool, roles: Mapping[str, RoleSpec], options: GroupOptions | None = None
    ) -> None:
        if not roles:
            raise ValueError("ColocatedWorkerGroup needs at least one role")
        for name, spec in roles.items():
            taken = name in _OWN_ATTRIBUTES or hasattr(type(self), name)
            if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_") or taken:
                reserved = sorted({*_OWN_ATTRIBUTES, *(n for n in dir(type(self)) if not n.startswith("_"))})
                raise ValueError(
                    f"role name {name!r} must be a public Python identifier other than ColocatedWorkerGroup's "
                    f"own attributes {reserved}"
                )
            if not isinstance(spec, RoleSpec):
                raise TypeError(
                    f"role {name!r} must be a RoleSpec(worker_cls, args, kwargs), got {type(spec).__name__}"
                )
        self.hosts = HostGroup(resource_pool, roles, options or GroupOptions())
        self.roles: dict[str, RoleGroup] = {name: RoleGroup(self.hosts, name, spec.cls) for name, spec in roles.items()}

    def __getattr__(self, role: str) -> RoleGroup:
        roles = self.__dict__.get("roles", {})
        if role in roles:
            return roles[role]
        raise AttributeError(f"no role {role!r} in this group; roles: {sorted(roles)}")

    def __getitem__(self, role: str) -> RoleGroup:
        return self.__getattr__(role)

    @property
    def world_size(self) -> int:
        """Number of ranks (processes)."""
        return self.hosts.world_size

    def shutdown(self) -> None:
        """Kill the group's actors."""
        self.hosts.shutdown()

    def __enter__(self) -> ColocatedWorkerGroup:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

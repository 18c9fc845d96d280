"""The runtime: the batch container, workers, dispatch modes and Ray worker groups.

``core`` imports torch, numpy and Ray only; nothing above it. Every name here
is imported on first use: ``from hybridflow.core import DataProto`` (all an
estimator needs) does not load Ray, and ``hybridflow.core.keys`` (all a reward
verifier's plugin registration needs) loads neither torch nor Ray, so a
reward pool worker starts without them.

The driver builds a colocated group and calls it like this::

    from hybridflow.core import ColocatedWorkerGroup, ResourcePool, RoleSpec, init_ray

    init_ray()                                   # local Ray, or RAY_ADDRESS / address=
    pool = ResourcePool(process_on_nodes=[4])    # one placement group per node
    wg = ColocatedWorkerGroup(pool, {"actor": RoleSpec(ActorWorker), "ref": RoleSpec(RefWorker)})
    batch = wg.actor.compute_log_prob(batch)     # DP_COMPUTE_PROTO: split, run, fold back
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "DataProto": "hybridflow.core.data_proto",
    **{
        name: "hybridflow.core.dispatch"
        for name in (
            "ALL_TO_ALL",
            "DEFAULT_MESH",
            "DP_COMPUTE",
            "DP_COMPUTE_METRIC",
            "DP_COMPUTE_PROTO",
            "ONE_TO_ALL",
            "DispatchMode",
            "DispatchPlan",
            "Execute",
            "GroupLayout",
            "RankLayout",
            "register",
        )
    },
    "RoleSpec": "hybridflow.core.worker",
    "Worker": "hybridflow.core.worker",
    "ResourcePool": "hybridflow.core.resource_pool",
    "ResourceUnavailableError": "hybridflow.core.resource_pool",
    "RayWorkerGroup": "hybridflow.core.worker_group",
    "GroupFuture": "hybridflow.core.worker_group",
    "GroupOptions": "hybridflow.core.worker_group",
    "WorkerError": "hybridflow.core.worker_group",
    "WorkerTimeoutError": "hybridflow.core.worker_group",
    "WorkerStalledError": "hybridflow.core.rank_wait",
    "Heartbeat": "hybridflow.core.rank_wait",
    "ColocatedWorkerGroup": "hybridflow.core.colocate",
    "init_ray": "hybridflow.core.ray_runtime",
    "shutdown": "hybridflow.core.ray_runtime",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    """Import each name on first use (PEP 562)."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hybridflow.core' has no attribute {name!r}")

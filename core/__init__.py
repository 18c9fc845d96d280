"""The runtime: the batch container, workers, dispatch modes and Ray worker groups.

``core`` imports torch, numpy and Ray only; nothing above it. The Ray-backed
names (``ResourcePool``, ``RayWorkerGroup``, ``ColocatedWorkerGroup``,
``init_ray``, ...) are imported on first use, so ``from hybridflow.core import
DataProto`` (all an estimator or reward needs) does not load Ray.

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

from hybridflow.core.data_proto import DataProto
from hybridflow.core.dispatch import (
    ALL_TO_ALL,
    DEFAULT_MESH,
    DP_COMPUTE,
    DP_COMPUTE_METRIC,
    DP_COMPUTE_PROTO,
    ONE_TO_ALL,
    DispatchMode,
    DispatchPlan,
    Execute,
    GroupLayout,
    RankLayout,
    register,
)
from hybridflow.core.worker import RoleSpec, Worker

_LAZY = {
    "ResourcePool": "hybridflow.core.resource_pool",
    "ResourceUnavailableError": "hybridflow.core.resource_pool",
    "RayWorkerGroup": "hybridflow.core.worker_group",
    "GroupFuture": "hybridflow.core.worker_group",
    "GroupOptions": "hybridflow.core.worker_group",
    "WorkerError": "hybridflow.core.worker_group",
    "WorkerTimeoutError": "hybridflow.core.worker_group",
    "ColocatedWorkerGroup": "hybridflow.core.colocate",
    "init_ray": "hybridflow.core.ray_runtime",
    "shutdown": "hybridflow.core.ray_runtime",
}

__all__ = [
    "DEFAULT_MESH",
    "ALL_TO_ALL",
    "DP_COMPUTE",
    "DP_COMPUTE_METRIC",
    "DP_COMPUTE_PROTO",
    "ONE_TO_ALL",
    "DataProto",
    "DispatchMode",
    "DispatchPlan",
    "Execute",
    "GroupLayout",
    "RankLayout",
    "RoleSpec",
    "Worker",
    "register",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    """Import the Ray-backed names on first use (PEP 562)."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hybridflow.core' has no attribute {name!r}")

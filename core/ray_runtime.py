"""Ray start-up: join a cluster, or start a local instance fit for a laptop.

``init_ray()`` with no address (and no ``RAY_ADDRESS``) starts a fresh local
Ray instance (``address="local"``), even when another cluster runs on the
machine: plain ``ray.init()`` would join whatever cluster ``ray start``
recorded under ``/tmp/ray``, someone else's included. The local instance has
the dashboard off and token authentication off (a new local cluster would
otherwise write a token file under ``~/.ray``); pass ``include_dashboard=True``
/ ``token_auth=True`` to keep them. With an address (``"auto"`` joins the
recorded cluster; ``"ray://..."``, ``host:port``), or ``RAY_ADDRESS`` set, it
joins that cluster as a driver and changes nothing about it.

A local instance's processes ask glibc's malloc for transparent huge pages
(``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``, :func:`~hybridflow.core.memory.huge_page_environment`; set
``glibc.malloc.hugetlb=0`` in the environment to keep 4 KiB pages). A cluster joined by address keeps the
environment it was started with: export the tunable before ``ray start`` there.

Local instances work with more ranks than cores: CPU bundles ask for a
fraction of a CPU (see :mod:`hybridflow.core.resource_pool`) and each rank
runs one torch thread. A local instance comes with a reaper
(:mod:`hybridflow.core.reaper`): if the driver dies without shutting down
(SIGKILL), its processes (Ray's, the reward pool's, a ``vllm serve``) go
within about a second instead of outliving it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import ray

from hybridflow.core.memory import huge_page_environment
from hybridflow.core.reaper import Reaper, start_reaper

__all__ = ["init_ray", "shutdown"]

logger = logging.getLogger(__name__)

_AUTH_MODE_ENV = "RAY_AUTH_MODE"
_reaper: Reaper | None = None


def init_ray(
    address: str | None = None,
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    include_dashboard: bool = False,
    token_auth: bool = False,
    namespace: str | None = None,
    log_to_driver: bool = True,
    object_store_memory: int | None = None,
) -> dict[str, Any]:
    """Connect this process to Ray (idempotent) and return the cluster's resources.

    Args:
        address: cluster to join (``"auto"``: the one ``ray start`` recorded on
            this machine); falls back to ``RAY_ADDRESS``; None starts a fresh
            local instance.
        num_cpus, num_gpus, object_store_memory: local instance only
            (defaults: what the machine has).
        include_dashboard, token_auth: local instance only; both off by default.
        namespace: Ray namespace for named actors.
        log_to_driver: forward workers' stdout/stderr to this process.
    """
    if ray.is_initialized():
        logger.debug("Ray already initialized; reusing it")
        return ray.cluster_resources()
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is not None:
        logger.info("joining Ray cluster at %s", address)
        ray.init(address=address, namespace=namespace, log_to_driver=log_to_driver)
    else:
        if not token_auth:
            # Ray reads the mode from the environment only (not from ray.init).
            os.environ.setdefault(_AUTH_MODE_ENV, "disabled")
        # the workers inherit the raylet's environment, so the tunable costs no start-up (a runtime_env would)
        os.environ.update(huge_page_environment(os.environ))
        ray.init(
            address="local",
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            include_dashboard=include_dashboard,
            namespace=namespace,
            log_to_driver=log_to_driver,
            object_store_memory=object_store_memory,
        )
        logger.info("started a local Ray instance: %s", ray.cluster_resources())
        global _reaper
        if _reaper is None:
            _reaper = start_reaper()
    return ray.cluster_resources()


def shutdown() -> None:
    """Disconnect from Ray (and stop the local instance if this process started it)."""
    global _reaper
    if ray.is_initialized():
        ray.shutdown()
    if _reaper is not None:
        _reaper.stop()
        _reaper = None

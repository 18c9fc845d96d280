"""Shared fixtures. Tests import the package as ``hybridflow.*``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

# One torch thread per process is fastest on the 2-core machines this suite
# targets, and keeps Ray workers from oversubscribing the cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Logical CPUs of the test session's Ray instance. CPU ranks ask for a quarter
# CPU each (core.resource_pool.DEFAULT_CPUS_PER_CPU_BUNDLE), so this admits
# 16 live ranks at once whatever the machine has; Ray only uses the number for
# scheduling, the processes still share the real cores.
RAY_TEST_CPUS = 4


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """One local Ray instance for the whole test session, shared by every Ray test.

    Start-up costs seconds, so tests never start their own instance: request
    this fixture, build worker groups on it, and shut your groups down (or use
    them as context managers) so the next test finds the CPUs free. Yields the
    ``ray`` module.
    """
    import ray

    from hybridflow.core.ray_runtime import init_ray, shutdown

    started_here = not ray.is_initialized()
    init_ray(num_cpus=RAY_TEST_CPUS, log_to_driver=False)
    yield ray
    if started_here:
        shutdown()

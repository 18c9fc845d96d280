"""ResourcePool: fail fast on impossible asks; one placement group per node, ranks by node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from hybridflow.core import ResourcePool, ResourceUnavailableError

pytestmark = pytest.mark.timeout(180)


def test_missing_gpus_fail_fast_with_ask_and_cluster(ray_session) -> None:
    start = time.monotonic()
    with pytest.raises(
        ResourceUnavailableError, match=r"(?s)asked for 1 node\(s\) with \[2\] bundles of \{CPU=1, GPU=1\}.*GPU=0"
    ):
        ResourcePool([2], use_gpu=True).bundles()
    assert time.monotonic() - start < 5


def test_too_many_cpu_bundles_fail_fast(ray_session) -> None:
    with pytest.raises(ResourceUnavailableError, match=r"no remaining node has \{'CPU': 25.0\}"):
        ResourcePool([100]).bundles()  # 100 x 0.25 CPU on a 4-CPU test instance
    with pytest.raises(ResourceUnavailableError, match=r"2 node\(s\)"):
        ResourcePool([1, 1]).bundles()  # one placement group per node, and there is one node


def test_resources_held_elsewhere_time_out_with_what_is_free(ray_session) -> None:
    holder = ResourcePool([4], cpus_per_bundle=1.0)  # the whole 4-CPU test instance
    holder.bundles()
    try:
        start = time.monotonic()
        with pytest.raises(ResourceUnavailableError, match=r"after 1 s only 0 of 1 placement groups.*Free now"):
            ResourcePool([1], ready_timeout_s=1.0).bundles()
        assert time.monotonic() - start < 5
    finally:
        holder.release()


def _free_cpus_settled(ray, target: float, timeout_s: float = 10.0) -> float:
    """Ray's view of free resources lags placement by a moment: poll until it reaches ``target``."""
    deadline = time.monotonic() + timeout_s
    while abs(ray.available_resources().get("CPU", 0.0) - target) > 1e-6 and time.monotonic() < deadline:
        time.sleep(0.1)
    return ray.available_resources().get("CPU", 0.0)


def test_bundles_are_ranked_and_release_frees_them(ray_session) -> None:
    free_before = _free_cpus_settled(ray_session, ray_session.cluster_resources()["CPU"])
    pool = ResourcePool([3], max_colocate_count=2)
    bundles = pool.bundles()
    assert _free_cpus_settled(ray_session, free_before - 0.75) == pytest.approx(free_before - 0.75)
    assert [(b.rank, b.bundle_index, b.local_rank, b.local_world_size) for b in bundles] == [
        (0, 0, 0, 3),
        (1, 1, 1, 3),
        (2, 2, 2, 3),
    ]
    assert pool.actor_resources() == {"num_cpus": 0.125, "num_gpus": 0.0}
    pool.release()
    assert _free_cpus_settled(ray_session, free_before) == pytest.approx(free_before)


TWO_NODE_SCRIPT = textwrap.dedent(
    """
    import json, os
    os.environ["RAY_AUTH_MODE"] = "disabled"
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.placement_group import placement_group_table
    from hybridflow.core import ONE_TO_ALL, RayWorkerGroup, ResourcePool, Worker, init_ray, register

    class NodeWorker(Worker):
        @register(dispatch=ONE_TO_ALL)
        def where(self):
            return [self.rank, self.local_rank, ray.get_runtime_context().get_node_id()]

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    os.environ["RAY_ADDRESS"] = cluster.address
    init_ray()  # joins the cluster through RAY_ADDRESS
    pool = ResourcePool([2, 2])
    wg = RayWorkerGroup(pool, NodeWorker)
    pgs = {}
    for b in pool.bundles():
        table = placement_group_table(b.placement_group)
        pgs[table["placement_group_id"]] = sorted(set(table["bundles_to_node_id"].values()))
    print("RESULT " + json.dumps({
        "where": wg.where(),
        "pg_nodes": list(pgs.values()),
        "node_ids": sorted(n["NodeID"] for n in ray.nodes() if n["Alive"]),
    }))
    wg.shutdown(); pool.release(); ray.shutdown(); cluster.shutdown()
    """
)


@pytest.mark.slow
def test_two_node_cluster_one_placement_group_per_node() -> None:
    # ray.cluster_utils.Cluster needs its own Ray: run it in a fresh interpreter.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", TWO_NODE_SCRIPT], capture_output=True, text=True, timeout=150, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result = json.loads(lines[0].removeprefix("RESULT "))
    first, second = result["node_ids"]  # both nodes share one IP here, so node id orders them
    assert result["pg_nodes"] == [[first], [second]]  # one placement group per node
    assert result["where"] == [[0, 0, first], [1, 1, first], [2, 0, second], [3, 1, second]]


def test_more_groups_than_max_colocate_count_fail_fast(ray_session) -> None:
    from hybridflow.core import ONE_TO_ALL, RayWorkerGroup, Worker, register

    class Tiny(Worker):
        @register(dispatch=ONE_TO_ALL)
        def rank_of(self) -> int:
            return self.rank

    pool = ResourcePool([1], max_colocate_count=2)
    try:
        with RayWorkerGroup(pool, Tiny) as a, RayWorkerGroup(pool, Tiny) as b:
            assert a.rank_of() == [0] and b.rank_of() == [0]  # two actors share the bundle
            with pytest.raises(ResourceUnavailableError, match="already hosts 2 worker group.*max_colocate_count=2"):
                RayWorkerGroup(pool, Tiny)
    finally:
        pool.release()

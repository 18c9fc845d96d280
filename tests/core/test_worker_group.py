"""RayWorkerGroup with real Ray actors and real torch.distributed (gloo) on CPU.

One 4-rank group with a dp=2 x tp=2 mesh is shared by the tests of this module
(start-up costs seconds on 2 cores); tests that need other groups build and
shut down their own.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch
import torch.distributed as dist

from hybridflow.core import (
    ALL_TO_ALL,
    DP_COMPUTE_METRIC,
    DP_COMPUTE_PROTO,
    ONE_TO_ALL,
    ColocatedWorkerGroup,
    DataProto,
    DispatchMode,
    Execute,
    GroupFuture,
    GroupOptions,
    RayWorkerGroup,
    ResourcePool,
    RoleSpec,
    Worker,
    WorkerError,
    WorkerTimeoutError,
    register,
)

pytestmark = pytest.mark.timeout(180)

# A user-defined mode: every rank gets the same arguments, the outputs are summed.
SUM_OVER_RANKS = DispatchMode("SUM_OVER_RANKS", ONE_TO_ALL.dispatch, lambda layout, outs, ctx: sum(outs))


class MeshWorker(Worker):
    """A dp x tp worker that tags every row it sees with its ranks."""

    def __init__(self, dp: int, tp: int, scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale
        self.calls = 0
        if tp > 1:
            self.init_device_mesh((dp, tp), ("dp", "tp"))
        else:
            self.init_process_group()

    @register(dispatch=DP_COMPUTE_PROTO)
    def tag(self, data: DataProto) -> DataProto:
        """x -> scale * x; record which rank (and process) computed each row."""
        n = len(data)
        return DataProto.from_dict(
            {"x": data.batch["x"] * self.scale, "rank": torch.full((n,), self.rank)},
            {"id": data.non_tensor_batch["id"], "pid": [os.getpid()] * n},
        )

    @register(dispatch=DP_COMPUTE_METRIC)
    def seen_ids(self, data: DataProto) -> list[str]:
        return list(data.non_tensor_batch["id"])

    @register(dispatch=DP_COMPUTE_METRIC, reads=("x", "id", "absent"))
    def seen_columns(self, data: DataProto) -> list[str]:
        return sorted([*data.batch, *data.non_tensor_batch, *data.meta_info])

    @register(dispatch=ONE_TO_ALL)
    def whoami(self) -> tuple[int, int, int]:
        layout = self.dp_layout()
        return (self.rank, layout.dp_rank, int(layout.is_collect_rank))

    @register(dispatch=ALL_TO_ALL)
    def add(self, a: int, b: int = 0) -> int:
        return self.rank * 100 + a + b

    @register(dispatch=ONE_TO_ALL, execute=Execute.RANK_ZERO)
    def bump(self) -> int:
        self.calls += 1
        return self.rank

    @register(dispatch=ONE_TO_ALL)
    def call_count(self) -> int:
        return self.calls

    @register(dispatch=ONE_TO_ALL)
    def all_reduce(self) -> list[float]:
        """Sum of (rank + 1) over the group, and of rank over the tp group."""
        total = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(total)
        tp_sum = torch.tensor([float(self.rank)])
        if self.device_mesh is not None:
            dist.all_reduce(tp_sum, group=self.device_mesh.get_group("tp"))
        return [total.item(), tp_sum.item()]

    @register(dispatch=SUM_OVER_RANKS)
    def rank_times(self, k: int) -> int:
        return self.rank * k

    @register(dispatch=ONE_TO_ALL)
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    @register(dispatch=ONE_TO_ALL)
    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"bad input on rank {self.rank}")
        return self.rank

    @register(dispatch=ONE_TO_ALL)
    def die_on(self, rank: int) -> int:
        if self.rank == rank:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
        return self.rank


class BrokenWorker(Worker):
    def __init__(self) -> None:
        super().__init__()
        if self.rank == 1:
            raise RuntimeError("cannot load checkpoint /nowhere")


def _rows(n: int) -> DataProto:
    return DataProto.from_dict(
        {"x": torch.arange(n, dtype=torch.float32)}, {"id": np.array([f"r{i}" for i in range(n)], dtype=object)}
    )


@pytest.fixture(scope="module")
def mesh_group(ray_session) -> Iterator[RayWorkerGroup]:
    with RayWorkerGroup(ResourcePool([4]), MeshWorker, 2, 2, scale=3.0) as wg:
        yield wg
    wg.hosts.resource_pool.release()


def test_mesh_layout_and_ranks(mesh_group: RayWorkerGroup) -> None:
    assert mesh_group.world_size == 4
    # (rank, dp rank, representative): row-major mesh, tp coordinate 0 represents.
    assert mesh_group.whoami() == [(0, 0, 1), (1, 0, 0), (2, 1, 1), (3, 1, 0)]
    assert len({label.pid for label in mesh_group.labels}) == 4


def test_dp_compute_proto_gives_tp_ranks_the_same_half(mesh_group: RayWorkerGroup) -> None:
    data = _rows(8)
    first, second = [f"r{i}" for i in range(4)], [f"r{i}" for i in range(4, 8)]
    assert mesh_group.seen_ids(data) == [first, first, second, second]
    out = mesh_group.tag(data)
    assert list(out.non_tensor_batch["id"]) == [f"r{i}" for i in range(8)]
    assert torch.equal(out.batch["x"], 3.0 * torch.arange(8, dtype=torch.float32))
    # Rows come from the representatives (ranks 0 and 2) only.
    assert out.batch["rank"].tolist() == [0, 0, 0, 0, 2, 2, 2, 2]


def test_five_rows_over_dp2_are_padded_and_unpadded(mesh_group: RayWorkerGroup) -> None:
    seen = mesh_group.seen_ids(_rows(5))
    assert seen == [["r0", "r1", "r2"]] * 2 + [["r3", "r4", "r0"]] * 2  # row 0 repeated as padding
    out = mesh_group.tag(_rows(5))
    assert len(out) == 5
    assert list(out.non_tensor_batch["id"]) == ["r0", "r1", "r2", "r3", "r4"]
    assert out.batch["x"].tolist() == [0.0, 3.0, 6.0, 9.0, 12.0]


def test_a_call_ships_only_the_columns_the_method_reads_once_per_dp_shard(mesh_group: RayWorkerGroup) -> None:
    data = _rows(8)
    data.batch["unread"] = torch.zeros(8, 1000)
    data.meta_info["step"] = 3
    mesh_group.hosts.traffic.take()
    assert mesh_group.seen_columns(data) == [["id", "step", "x"]] * 4  # "absent" is optional
    sent, received = mesh_group.hosts.traffic.take()
    # two dp shards of 4 rows, each put once for its two tp ranks: x (float32) and the pickled ids
    shard = data.select(["x"], ["id"])[:4]
    assert sent == 2 * shard.nbytes() and received == 0
    assert 16 < shard.nbytes() < 8 * 1000 * 4


def test_one_to_all_all_to_all_rank_zero_and_custom_mode(mesh_group: RayWorkerGroup) -> None:
    assert mesh_group.add([1, 2, 3, 4], b=[10, 20, 30, 40]) == [11, 122, 233, 344]
    before = mesh_group.call_count()
    assert mesh_group.bump() == 0  # rank 0's own output, not a list
    after = mesh_group.call_count()
    assert [a - b for a, b in zip(after, before)] == [1, 0, 0, 0]
    assert mesh_group.rank_times(5) == 5 * (0 + 1 + 2 + 3)


def test_all_reduce_inside_the_group(mesh_group: RayWorkerGroup) -> None:
    # world: 1+2+3+4 = 10 everywhere; tp groups {0,1} and {2,3}: 0+1 and 2+3.
    assert mesh_group.all_reduce() == [[10.0, 1.0], [10.0, 1.0], [10.0, 5.0], [10.0, 5.0]]


def test_future_from_one_group_feeds_another(mesh_group: RayWorkerGroup) -> None:
    with RayWorkerGroup(ResourcePool([2]), MeshWorker, 2, 1, scale=2.0) as producer:
        future = producer.tag.options(blocking=False)(_rows(5))
        assert isinstance(future, GroupFuture)
        # The consumer's workers fetch the producer's output themselves.
        out = mesh_group.tag(future)
        assert list(out.non_tensor_batch["id"]) == ["r0", "r1", "r2", "r3", "r4"]
        assert out.batch["x"].tolist() == [3.0 * 2.0 * i for i in range(5)]  # producer: 2*i, then consumer: 3*(2*i)
        consumer_pids = {label.pid for label in mesh_group.labels}
        assert set(out.non_tensor_batch["pid"]) <= consumer_pids
        # The same future still resolves on the driver.
        assert future.get().batch["x"].tolist() == [2.0 * i for i in range(5)]
    producer.hosts.resource_pool.release()


def test_timeout_names_the_slow_ranks(mesh_group: RayWorkerGroup) -> None:
    start = time.monotonic()
    with pytest.raises(WorkerTimeoutError, match=r"MeshWorker.sleep did not finish within 0.5 s on rank 0 \(node"):
        mesh_group.sleep.options(timeout_s=0.5)(1.5)
    assert time.monotonic() - start < 1.5
    time.sleep(1.2)  # let the sleeping calls drain before the next test


def test_worker_exception_names_rank_and_cause(mesh_group: RayWorkerGroup) -> None:
    with pytest.raises(
        WorkerError, match=r"(?s)MeshWorker.fail_on failed on rank 2 \(node .*pid \d+\).*bad input on rank 2"
    ) as info:
        mesh_group.fail_on(2)
    assert info.value.rank == 2 and info.value.role == "MeshWorker"


def test_killed_worker_surfaces_fast_with_its_rank(ray_session) -> None:
    pool = ResourcePool([2])
    wg = ColocatedWorkerGroup(pool, {"victim": RoleSpec(MeshWorker, (2, 1))}, GroupOptions(call_timeout_s=60))
    try:
        start = time.monotonic()
        with pytest.raises(
            WorkerError, match=r"(?s)victim.die_on failed on rank 1 \(node [\d.]+ \w+, pid \d+\)"
        ) as info:
            wg.victim.die_on(1)
        assert time.monotonic() - start < 20  # the other rank sleeps 60 s: no waiting for it
        assert info.value.rank == 1
        assert "died" in str(info.value).lower()
    finally:
        wg.shutdown()
        pool.release()


def test_constructor_error_names_rank(ray_session) -> None:
    pool = ResourcePool([2])
    try:
        with pytest.raises(
            WorkerError,
            match=(
                r"(?s)BrokenWorker.__init__ failed on rank 1 .*role 'BrokenWorker' \(BrokenWorker\) failed to start"
                r".*cannot load checkpoint"
            ),
        ):
            RayWorkerGroup(pool, BrokenWorker)
    finally:
        pool.release()


def test_unknown_method_lists_registered_ones(mesh_group: RayWorkerGroup) -> None:
    with pytest.raises(AttributeError, match=r"no @register-ed method 'tagg'; registered: \['add', 'all_reduce'"):
        mesh_group.tagg


class RemeshWorker(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.init_device_mesh((2, 1), ("dp", "tp"))

    @register(dispatch=ONE_TO_ALL)
    def remesh(self, dp: int, tp: int) -> None:
        self.init_device_mesh((dp, tp), ("dp", "tp"))

    @register(dispatch=DP_COMPUTE_PROTO)
    def tag(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"rank": torch.full((len(data),), self.rank)})


def test_mesh_changed_after_start_is_caught_then_refreshed(ray_session) -> None:
    pool = ResourcePool([2])
    try:
        with RayWorkerGroup(pool, RemeshWorker) as wg:
            assert wg.tag(_rows(4)).batch["rank"].tolist() == [0, 0, 1, 1]
            wg.remesh(1, 2)  # now one dp group of two tp ranks
            with pytest.raises(WorkerError, match=r"(?s)mesh now says.*refresh_layout\(\)"):
                wg.tag(_rows(4))
            wg.refresh_layout()
            assert wg.layout.dp_size == 1
            assert wg.tag(_rows(4)).batch["rank"].tolist() == [0, 0, 0, 0]
    finally:
        pool.release()


class TwoMeshWorker(Worker):
    """Trains on a 4-way dp mesh, generates on a (2 dp x 2 tp) mesh named "rollout"."""

    def __init__(self) -> None:
        super().__init__()
        self.init_device_mesh((4,), ("dp",))
        self.init_device_mesh((2, 2), ("dp", "tp"), name="rollout")

    @register(dispatch=DP_COMPUTE_PROTO)
    def train_rows(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"rank": torch.full((len(data),), self.rank)})

    @register(dispatch=DP_COMPUTE_PROTO, mesh="rollout")
    def rollout_rows(self, data: DataProto) -> DataProto:
        # tp peers see the same rows; prove it by summing their ids over the tp group
        ids = data.batch["x"].clone()
        dist.all_reduce(ids, group=self._meshes["rollout"][0].get_group("tp"))
        return DataProto.from_dict({"rank": torch.full((len(data),), self.rank), "tp_sum": ids})


def test_methods_dispatch_by_their_own_mesh(ray_session) -> None:
    pool = ResourcePool([4])
    try:
        with RayWorkerGroup(pool, TwoMeshWorker) as wg:
            data = DataProto.from_dict({"x": torch.arange(8.0)})
            assert wg.train_rows(data).batch["rank"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
            out = wg.rollout_rows(data)
            # 2 dp groups ({0,1}, {2,3}); the collect step keeps tp rank 0 of each
            assert out.batch["rank"].tolist() == [0, 0, 0, 0, 2, 2, 2, 2]
            assert out.batch["tp_sum"].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0]
            assert wg.layout.dp_size == 4 and wg.layout_of("rollout").dp_size == 2
            with pytest.raises(KeyError, match=r"no device mesh named 'decode'.*meshes: \['default', 'rollout'\]"):
                wg.layout_of("decode")
    finally:
        pool.release()

"""Bounded waits on real Ray actors and gloo: a stopped rank is named by the heartbeat, a rank that never reaches a
collective by its peers' timeout, and a rank that is only busy is left alone (``core/rank_wait.py``)."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
import torch
import torch.distributed as dist

from hybridflow.core import (
    ONE_TO_ALL,
    ColocatedWorkerGroup,
    GroupOptions,
    Heartbeat,
    ResourcePool,
    RoleSpec,
    Worker,
    WorkerError,
    WorkerStalledError,
    register,
)

pytestmark = pytest.mark.timeout(180)

BEAT = Heartbeat(interval_s=0.5, stall_s=2.0)


class Ranks(Worker):
    """Ranks on a dp x tp mesh (tp > 1) or on the default group alone."""

    def __init__(self, dp: int, tp: int) -> None:
        super().__init__()
        if tp > 1:
            self.init_device_mesh((dp, tp), ("dp", "tp"))
        else:
            self.init_process_group()

    @register(dispatch=ONE_TO_ALL)
    def busy(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    @register(dispatch=ONE_TO_ALL)
    def stop_on(self, rank: int) -> int:
        if self.rank == rank:
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(30)
        return self.rank

    @register(dispatch=ONE_TO_ALL)
    def late_tp_all_reduce(self, late_rank: int, seconds: float) -> float:
        """An all-reduce over the tp sub-group that ``late_rank`` reaches only after ``seconds``."""
        if self.rank == late_rank:
            time.sleep(seconds)
        total = torch.ones(1)
        dist.all_reduce(total, group=self.device_mesh.get_group("tp"))
        return total.item()


def _group(ranks: int, options: GroupOptions, tp: int = 1) -> ColocatedWorkerGroup:
    return ColocatedWorkerGroup(ResourcePool([ranks]), {"w": RoleSpec(Ranks, (ranks // tp, tp))}, options)


def _close(group: ColocatedWorkerGroup) -> None:
    for label in group.w.labels:  # a stopped process ignores Ray's kill for seconds: end it here
        try:
            os.kill(label.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    group.shutdown()
    group.hosts.resource_pool.release()


def test_a_stopped_rank_is_named_within_the_heartbeats_bound_and_a_busy_one_is_not(ray_session) -> None:
    group = _group(2, GroupOptions(heartbeat=BEAT))
    try:
        # busy for twice stall_s: the heartbeat runs on a thread of its own, so the call is left alone
        assert group.w.busy(2 * BEAT.stall_s) == [0, 1]
        start = time.monotonic()
        with pytest.raises(WorkerStalledError) as info:
            group.w.stop_on(1)
        waited = time.monotonic() - start
        pid = group.w.labels[1].pid
        message = str(info.value)
        assert info.value.rank == 1 and info.value.method == "stop_on"
        assert re.search(
            rf"w\.stop_on: rank 1 \(node [\d.]+ \w+, pid {pid}\) stopped answering the heartbeat: "
            r"no answer for 2 s",
            message,
        ), message
        assert waited < BEAT.interval_s + BEAT.stall_s + 2.0, waited  # the documented bound, plus Ray's latency
        assert open(f"/proc/{pid}/stat").read().split()[2] == "T"  # it was the stopped one, not a guess
    finally:
        _close(group)


def test_a_rank_that_never_reaches_a_collective_is_named_once_its_peers_time_out(ray_session) -> None:
    group = _group(4, GroupOptions(heartbeat=BEAT, collective_timeout_s=3.0), tp=2)
    try:
        start = time.monotonic()
        with pytest.raises(WorkerError) as info:
            group.w.late_tp_all_reduce(1, 25.0)  # rank 1's tp peer is rank 0, on a sub-group of the mesh
        waited = time.monotonic() - start
        message = str(info.value)
        assert info.value.rank == 0 and "Timed out" in message, message
        still = message.split("still in the call when it failed", 1)[1]
        assert re.search(
            rf"rank 1 \(node [\d.]+ \w+, pid {group.w.labels[1].pid}\): in w\.late_tp_all_reduce for "
            r"[\d.]+ s",
            still,
        ), still
        assert "rank 0 " not in still and "rank 2 " not in still and "rank 3 " not in still  # the others finished
        assert waited < 3.0 + 6.0, waited  # the collective's bound; torch's own for a sub-group is 30 min
    finally:
        _close(group)


class Crashing(Worker):
    """A rank whose process ends abruptly inside a call."""

    def __init__(self) -> None:
        super().__init__()
        self.init_process_group()

    @register(dispatch=ONE_TO_ALL)
    def crash(self, rank: int, how: str) -> int:
        if self.rank == rank:
            if how == "segfault":
                import ctypes

                ctypes.string_at(0)  # a read of address 0: the C-level crash of a broken extension
            os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer ends a process
        time.sleep(30)
        return self.rank


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("segfault", "the last lines its process wrote to stderr:\n  Fatal Python error: Segmentation fault"),
        ("kill", "its process wrote nothing to stderr before it ended: something outside it killed it"),
    ],
)
def test_a_rank_whose_process_dies_is_named_with_what_it_last_wrote(ray_session, how, said) -> None:
    """Ray says only that the actor died; the error adds the end of the dead process's stderr (Python's fault
    handler writes a segfault's stack there), or says it wrote nothing: the mark of a kill from outside."""
    group = ColocatedWorkerGroup(ResourcePool([2]), {"w": RoleSpec(Crashing)}, GroupOptions(heartbeat=BEAT))
    try:
        with pytest.raises(WorkerError) as raised:
            group.w.crash(1, how)
        message = str(raised.value)
        assert message.startswith("w.crash failed on rank 1"), message
        assert said in message, message
    finally:
        _close(group)

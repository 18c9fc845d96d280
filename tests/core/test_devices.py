"""``trainer.device=auto`` (core/devices.py): the device torch finds on this machine, said in one line."""

import pytest
import torch

from hybridflow.core.devices import resolve_device


def test_auto_is_the_cpu_on_a_machine_without_gpus_and_says_so():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert resolve_device("auto") == (
        "cpu",
        "trainer.device=auto: cpu (no GPU visible to torch on this machine; trainer=gpu forces cuda)",
    )


def test_auto_is_cuda_where_torch_sees_gpus(monkeypatch):
    # torch's answer stands in for a GPU machine's (unit test: no GPU here)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert resolve_device("auto") == ("cuda", "trainer.device=auto: cuda (8 GPU(s) visible to torch on this machine)")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_named_device_is_kept_without_a_line(monkeypatch, device):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: device == "cpu")  # the machine does not decide
    assert resolve_device(device) == (device, "")


def test_threads_per_rank_split_the_free_cores_among_the_ranks():
    from hybridflow.core.devices import cpu_threads_per_rank

    assert cpu_threads_per_rank(2, 1, lambda: 0.1)[0] == 2  # a quiet 2-core machine, one rank: both cores
    assert cpu_threads_per_rank(2, 1, lambda: 1.05)[0] == 1  # one busy process beside it: the one core left
    assert cpu_threads_per_rank(16, 2, lambda: 3.4)[0] == 6  # 13 free cores (rounded) between 2 ranks
    assert cpu_threads_per_rank(4, 1, lambda: 4.0)[0] == 1  # nothing free: still one
    threads, why = cpu_threads_per_rank(16, 1, lambda: 0.0, cap=4)
    assert threads == 4 and why.endswith("(16 of 16 CPUs free at start, 1 rank(s) on this machine, OMP_NUM_THREADS=4)")


def test_threads_per_rank_sample_nothing_where_one_thread_each_is_all_there_can_be():
    from hybridflow.core.devices import cpu_threads_per_rank

    def no_sample() -> float:
        raise AssertionError("sampled")

    assert cpu_threads_per_rank(2, 2, no_sample) == (
        1,
        "trainer.cpu_threads_per_rank=auto: 1 (2 rank(s) on this machine's 2 CPUs)",
    )
    assert cpu_threads_per_rank(16, 1, no_sample, cap=1)[0] == 1


def fake_machine(monkeypatch, snapshots, own_cpu_s):
    """``/proc/stat`` snapshots and this process's CPU clock stand in for a machine (unit tests): each sample
    reads two snapshots and two clock values; a tick is 1/100 s."""
    import os

    import hybridflow.core.devices as devices

    snapshots, clock = iter(snapshots), iter(own_cpu_s)
    monkeypatch.setattr(devices, "_cpu_ticks", lambda cpus: next(snapshots))
    monkeypatch.setattr(devices, "_own_cpu_seconds", lambda: next(clock))
    monkeypatch.setattr(devices.os, "sysconf", lambda name: 100 if name == "SC_CLK_TCK" else os.sysconf(name))
    monkeypatch.setattr(devices.time, "sleep", lambda s: None)
    return devices


def test_busy_cores_is_the_non_idle_share_of_each_cpu_s_ticks(monkeypatch):
    # cpu0 100 ticks, 25 idle; cpu1 100 ticks, 90 idle; this process idle
    devices = fake_machine(monkeypatch, [{0: (1000, 500), 1: (2000, 1000)}, {0: (1100, 525), 1: (2100, 1090)}], [0, 0])
    assert devices.busy_cores(samples=1) == pytest.approx(0.75 + 0.10)


def sample(cpu0_busy_ticks: int) -> list[dict[int, tuple[int, int]]]:
    """One sample's two snapshots of a 2-CPU machine: 100 ticks pass on each CPU, cpu1 idle throughout."""
    return [{0: (0, 0), 1: (0, 0)}, {0: (100, 100 - cpu0_busy_ticks), 1: (100, 100)}]


def test_busy_cores_leaves_out_this_process_and_work_that_does_not_last(monkeypatch):
    # cpu0 busy for the whole 1 s (100 ticks) sample, all of it this process's own threads: nothing else is
    devices = fake_machine(monkeypatch, sample(100), [5.0, 6.0])
    assert devices.busy_cores(samples=1) == pytest.approx(0.0)
    # another process busy in one of three samples (starting up, exiting): it does not hold a core
    devices = fake_machine(monkeypatch, sample(100) + sample(0) + sample(0), [0] * 6)
    assert devices.busy_cores(samples=3) == pytest.approx(0.0)
    devices = fake_machine(monkeypatch, sample(100) + sample(90) + sample(100), [0] * 6)
    assert devices.busy_cores(samples=3) == pytest.approx(0.9)  # in every sample: it does


def test_busy_cores_sees_a_busy_process_on_the_same_cpu():
    import os
    import subprocess
    import sys

    cpu = min(os.sched_getaffinity(0))
    pinned = f"import os; os.sched_setaffinity(0, {{{cpu}}})\n"
    hog = subprocess.Popen([sys.executable, "-c", pinned + "while True: pass"])
    try:
        probe = (
            pinned
            + "import time; time.sleep(0.3); from hybridflow.core.devices import busy_cores; print(busy_cores(0.5))"
        )
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
        assert hog.poll() is None  # the hog was busy throughout (a hog that failed to start would prove nothing)
    finally:
        hog.kill()
        hog.wait()
    assert float(out.stdout) > 0.85  # the one CPU it may run on is the hog's (other load only adds to it)

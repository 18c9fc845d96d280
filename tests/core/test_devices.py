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


def test_busy_cores_is_the_non_idle_share_of_each_cpu_s_ticks(monkeypatch):
    import hybridflow.core.devices as devices

    # two /proc/stat snapshots stand in for a machine (unit test): cpu0 100 ticks, 25 idle; cpu1 100 ticks, 90 idle
    snapshots = iter([{0: (1000, 500), 1: (2000, 1000)}, {0: (1100, 525), 1: (2100, 1090)}])
    monkeypatch.setattr(devices, "_cpu_ticks", lambda cpus: next(snapshots))
    monkeypatch.setattr(devices.time, "sleep", lambda s: None)
    assert devices.busy_cores() == pytest.approx(0.75 + 0.10)


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

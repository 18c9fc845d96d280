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
    assert cpu_threads_per_rank(16, 1, no_sample, cap=1) == (
        1,
        "trainer.cpu_threads_per_rank=auto: 1 (1 rank(s) on this machine's 16 CPUs, OMP_NUM_THREADS=1)",
    )
    assert cpu_threads_per_rank(4, 4, no_sample, cap=2)[1].endswith("(4 rank(s) on this machine's 4 CPUs)")


def test_a_cap_the_free_cores_already_meet_is_not_named():
    from hybridflow.core.devices import cpu_threads_per_rank

    assert cpu_threads_per_rank(4, 2, lambda: 0.0, cap=2) == (
        2,
        "trainer.cpu_threads_per_rank=auto: 2 (4 of 4 CPUs free at start, 2 rank(s) on this machine)",
    )


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


def test_own_time_is_taken_over_the_sample_as_proc_stat_counted_it(monkeypatch):
    # a 0.1 s sample (10 ticks at 100 a second): cpu0 busy throughout, 0.05 s of it this process's: half a core else
    snapshots = [{0: (5000, 2000), 1: (5000, 3000)}, {0: (5010, 2000), 1: (5010, 3010)}]
    devices = fake_machine(monkeypatch, snapshots, [2.0, 2.05])
    assert devices.busy_cores(samples=1) == pytest.approx(0.5)


def test_busy_cores_takes_the_least_of_three_samples_and_never_less_than_none(monkeypatch):
    # busy in the first two samples only: by default three are taken, and the third shows it gone
    devices = fake_machine(monkeypatch, sample(100) + sample(100) + sample(0), [0] * 6)
    assert devices.busy_cores() == pytest.approx(0.0)
    # this process's two threads used 1.5 s of a 1 s sample in which one CPU shows busy: no other work, not -0.5
    devices = fake_machine(monkeypatch, sample(100), [0.0, 1.5])
    assert devices.busy_cores(samples=1) == 0.0


def test_busy_cores_is_none_where_proc_stat_cannot_be_read(monkeypatch):
    import hybridflow.core.devices as devices

    def unreadable(cpus):
        raise OSError("no /proc here")

    monkeypatch.setattr(devices, "_cpu_ticks", unreadable)
    assert devices.busy_cores() == 0.0


def test_proc_stat_s_idle_is_idle_plus_iowait_of_the_first_eight_fields(monkeypatch):
    import io

    import hybridflow.core.devices as devices

    # user nice system idle iowait irq softirq steal, then guest and guest_nice (already counted in user and nice)
    stat = (
        "cpu  100 200 300 400 500 600 700 800 900 1000\n"
        "cpu0 1 2 3 40 50 6 7 8 90 100\n"
        "cpu1 10 20 30 400 5 60 70 80 900 1000\n"
        "cpu2 1 1 1 1 1 1 1 1 0 0\n"
        "intr 12345 1 2 3\n"
    )
    monkeypatch.setattr(devices, "open", lambda path: io.StringIO(stat), raising=False)
    assert devices._cpu_ticks({0, 1}) == {0: (117, 90), 1: (675, 405)}


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

"""``trainer.device=auto``: the device a run trains on, found on the machine that starts it.

veRL's scripts assume GPUs and hybridflow's tiny default job runs on CPUs; ``auto`` lets either run as written
where it is started. It is resolved once, by the command that reads the config, before anything checks or
builds from it: everything past that point sees ``cpu`` or ``cuda``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

__all__ = ["AUTO", "DEVICES", "busy_cores", "cpu_threads_per_rank", "resolve_device"]

AUTO = "auto"
DEVICES = ("cpu", "cuda")
"""What a run trains on: ``cpu`` (gloo between ranks) or ``cuda`` (nccl)."""


def resolve_device(asked: str) -> tuple[str, str]:
    """``(device, why)``: ``asked`` itself when it names a device; for ``auto``, ``cuda`` when torch sees a GPU
    on this machine, else ``cpu``, with the line a run prints to say which it took. (The workers of a Ray
    cluster started elsewhere may have what this machine lacks: name the device there.)"""
    if asked != AUTO:
        return asked, ""
    import torch  # noqa: PLC0415 - only an auto device needs it, and a bad config is refused without it

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus:
        return "cuda", f"trainer.device=auto: cuda ({gpus} GPU(s) visible to torch on this machine)"
    return "cpu", "trainer.device=auto: cpu (no GPU visible to torch on this machine; trainer=gpu forces cuda)"


def busy_cores(sample_s: float = 0.1, samples: int = 3) -> float:
    """How many of this process's CPUs (its affinity mask) other work keeps busy: the least, over ``samples``
    samples of ``sample_s`` each, of the CPUs' non-idle ``/proc/stat`` ticks less this process's own CPU time
    (0.0 where ``/proc/stat`` cannot be read).

    The least, because a process that holds a core shows in every sample and one starting up or exiting does not;
    less this process's own time, because its threads finishing a parallel operator are not other work (a
    2-core machine that counted either would give a rank one thread for a whole run)."""
    cpus = os.sched_getaffinity(0)
    try:
        return min(_busy_once(cpus, sample_s) for _ in range(samples))
    except OSError:
        return 0.0


def _busy_once(cpus: set[int], sample_s: float) -> float:
    """Other work's busy CPUs over one sample of ``sample_s``."""
    before, own_before = _cpu_ticks(cpus), _own_cpu_seconds()
    time.sleep(sample_s)
    after, own = _cpu_ticks(cpus), _own_cpu_seconds() - own_before
    busy, ticks = 0.0, 0
    for cpu, (total, idle) in after.items():
        total_before, idle_before = before.get(cpu, (total, idle))
        busy += 1.0 - (idle - idle_before) / max(total - total_before, 1)
        ticks = max(ticks, total - total_before)
    elapsed = max(ticks, 1) / os.sysconf("SC_CLK_TCK")  # the sample as /proc/stat counted it
    return max(busy - own / elapsed, 0.0)


def _own_cpu_seconds() -> float:
    """CPU seconds this process (all its threads) has used."""
    return time.process_time()


def _cpu_ticks(cpus: set[int]) -> dict[int, tuple[int, int]]:
    """``cpu -> (all ticks, idle + iowait ticks)`` from ``/proc/stat``, for the CPUs in ``cpus``."""
    ticks = {}
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                values = [int(x) for x in fields[:8]]
                ticks[int(name[3:])] = (sum(values), values[3] + values[4])
    return ticks


def cpu_threads_per_rank(
    cores: int, ranks: int, busy: Callable[[], float] = busy_cores, cap: int | None = None
) -> tuple[int, str]:
    """``(threads, why)``: torch threads for each of ``ranks`` CPU ranks on a machine of ``cores`` CPUs, ``busy()``
    of them taken by other work (:func:`busy_cores`): the free cores (rounded) split among the ranks, at least one
    each, and no more than ``cap`` (an ``OMP_NUM_THREADS`` the environment sets: a statement of threads per
    process). Where one thread each is all there can be (``ranks >= cores``, ``cap=1``) nothing is sampled.

    Why not all cores: torch's OpenMP threads wait for each other at the end of every operator, so a thread on a
    core another process holds stalls all of its rank's (a ~3M model's 128-token GRPO step, 1 rank beside one
    busy-loop process on 2 cores: 54.8 s with 2 threads, 4.6-5.8 s with 1; docs/benchmarks.md, "Scaling")."""
    line = "trainer.cpu_threads_per_rank=auto: {} ({})"
    if ranks >= cores or cap == 1:
        why = f"{ranks} rank(s) on this machine's {cores} CPUs" + (", OMP_NUM_THREADS=1" if cap == 1 else "")
        return 1, line.format(1, why)
    free = max(round(cores - busy()), 0)
    threads = max(1, free // ranks)
    capped = cap is not None and threads > cap
    threads = min(threads, cap) if capped else threads
    why = f"{free} of {cores} CPUs free at start, {ranks} rank(s) on this machine" + (
        f", OMP_NUM_THREADS={cap}" if capped else ""
    )
    return threads, line.format(threads, why)

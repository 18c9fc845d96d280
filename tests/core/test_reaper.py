"""A driver killed with SIGKILL leaves no process behind: its reaper (``core/reaper.py``) takes them down."""

import os
import signal
import subprocess
import sys
import time

import pytest

from hybridflow.core.reaper import _stat, descendants

DRIVER = """
import os, subprocess, sys, time
import ray
from hybridflow.core import init_ray

init_ray(num_cpus=1)

@ray.remote(num_cpus=0.1)
class Worker:
    def pid(self):
        return os.getpid()

worker = Worker.remote()
ray.get(worker.pid.remote())
pool = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # as the reward pool's processes
time.sleep(1.5)  # two of the reaper's rounds
print("ready", flush=True)
time.sleep(600)
"""


def _alive(pid: int, start: int) -> bool:
    return (_stat(pid) or (None, None))[1] == start


def _is_reaper(pid: int) -> bool:
    try:
        return b"reaper.py" in open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return False


@pytest.mark.slow
def test_a_sigkilled_driver_leaves_no_process_of_its_run_after_10_s():
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert driver.stdout.readline().strip() == "ready"
        run = descendants(driver.pid)
        names = {pid: open(f"/proc/{pid}/cmdline", "rb").read()[:200] for pid in run if _alive(pid, run[pid])}
        assert any(b"raylet" in n for n in names.values()) and any(b"ray::" in n for n in names.values()), names
        reapers = [pid for pid in run if _is_reaper(pid)]
        assert len(reapers) == 1
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid, start) for pid, start in run.items()):
        time.sleep(0.2)
    left = {pid: names.get(pid) for pid, start in run.items() if _alive(pid, start)}
    for pid in left:  # do not leave them to the rest of the suite
        os.kill(pid, signal.SIGKILL)
    assert left == {}, left

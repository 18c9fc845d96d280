"""A watchdog that takes a driver's processes down with it, however the driver died.

A local Ray instance is a tree of processes under the driver (the GCS, the
raylet, its agents, the workers), beside the reward pool and a ``vllm
serve``. When the driver is SIGKILLed, nothing runs its shutdown: the raylet
and the GCS notice and exit, but their children are orphaned, and a
``ray::DashboardAgent`` and a ``ray::RuntimeEnvAgent`` were still alive 10 s
later. :func:`start_reaper` starts a small process of its own (a new session,
so a Ctrl-C to the driver's terminal leaves it alone) that holds the read end
of a pipe whose write end only the driver holds: the driver's death closes
it (or, if a child it forked holds a copy, the driver's pid is gone). Until then the reaper records the
driver's descendants every
``REFRESH_S``; on that end of file it SIGKILLs every process it recorded
that is still the same process (same start time), and their descendants,
unless the driver said ``stop`` first (:meth:`Reaper.stop`, an orderly
shutdown).

Run as ``python -I -S reaper.py DRIVER_PID FD``; standard library only.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from dataclasses import dataclass

__all__ = ["Reaper", "descendants", "process_tree", "start_reaper"]

REFRESH_S = 0.5
"""How often the reaper records the driver's descendants (a process started and orphaned in less escapes it)."""

STOP = b"stop"


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of ``pid``, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[19])


def process_tree(root: int, column: int, *, with_root: bool = True) -> dict[int, int]:
    """``root`` (with ``with_root``) and its live descendants, each with column ``column`` of its
    ``/proc/PID/stat`` counted after the command name (1: the parent pid, 19: the start time, 21: the
    resident pages), from one pass over ``/proc``."""
    children: dict[int, list[int]] = {}
    values: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()  # the command name may hold spaces and parentheses
        except (OSError, IndexError):  # exited meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        values[int(entry)] = int(fields[column])
    found: dict[int, int] = {}
    todo = [root] if with_root else list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid in values and pid not in found:
            found[pid] = values[pid]
            todo.extend(children.get(pid, ()))
    return found


def descendants(root: int) -> dict[int, int]:
    """Every live descendant of ``root``: pid -> its start time."""
    return process_tree(root, 19, with_root=False)


def _kill(recorded: dict[int, int]) -> int:
    """SIGKILL each recorded process that is still the same process, and its descendants; how many."""
    alive = {pid for pid, start in recorded.items() if (_stat(pid) or (None, None))[1] == start}
    for pid in list(alive):
        alive.update(descendants(pid))
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return len(alive)


def _watch(driver: int, fd: int) -> None:
    recorded: dict[int, int] = {}
    me, born = os.getpid(), (_stat(driver) or (None, None))[1]
    while True:
        ready, _, _ = select.select([fd], [], [], REFRESH_S)
        if ready:
            if os.read(fd, len(STOP)) == STOP:
                return  # an orderly shutdown: the driver stops its own processes
            break  # end of file: the driver is gone
        if (_stat(driver) or (None, None))[1] != born:
            break  # gone, while a child it forked still holds the pipe
        recorded.update({pid: start for pid, start in descendants(driver).items() if pid != me})
        recorded = {pid: start for pid, start in recorded.items() if (_stat(pid) or (None, None))[1] == start}
    recorded.pop(me, None)
    _kill(recorded)


@dataclass
class Reaper:
    """The driver's handle on its reaper: :meth:`stop` before an orderly exit."""

    process: subprocess.Popen
    fd: int

    def stop(self) -> None:
        """Tell the reaper the driver shuts down by itself, and let it go."""
        if self.fd < 0:
            return
        try:
            os.write(self.fd, STOP)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = -1
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start_reaper() -> Reaper:
    """A reaper for this process (the driver): its descendants die with it (module docstring)."""
    read_end, write_end = os.pipe()
    os.set_inheritable(write_end, False)  # only the driver holds it: its death is the end of file
    # by its path, isolated and without site: the standard library only, no package import (no torch)
    process = subprocess.Popen(
        [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()), str(read_end)],
        pass_fds=(read_end,),
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    os.close(read_end)
    return Reaper(process, write_end)


if __name__ == "__main__":
    _watch(int(sys.argv[1]), int(sys.argv[2]))

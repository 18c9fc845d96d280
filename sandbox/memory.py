"""The sandbox's aggregate memory bound: :func:`memory_guard`.

``RLIMIT_AS`` bounds each process, but a program may fork up to
``max_processes`` of them: before this bound, 15 children touching 300 MiB
each held 4.5 GiB under a 512 MB per-process limit. A guard bounds the sum,
with the first of these the machine allows:

* a **memory cgroup**, made under the verifier's own cgroup (cgroup v2
  ``memory.max`` with swap off and ``memory.oom.group``, or the v1 memory
  controller's ``memory.limit_in_bytes`` and ``memory.memsw.limit_in_bytes``).
  The launcher joins it before it forks, so the kernel charges every page
  of the tree to it and OOM-kills inside it at the bound. Needs the right
  to create cgroups (root, or a delegated subtree).
* else a **watchdog** thread of the verifier that sums the resident memory of
  the launcher's process tree, read from ``/proc`` every ``poll_s``, and kills
  the tree when the sum passes the bound. It overcounts pages shared since a
  fork (so it errs towards killing), and it misses what the tree allocates
  between two reads (see docs/reliability.md for the measured overshoot).

A cgroup left by a killed verifier is removed by the next guard made under
the same parent (its name holds the creator's pid).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import secrets
import signal
import threading
import time

from hybridflow.core.reaper import process_tree as proc_tree

logger = logging.getLogger(__name__)

_MIB = 1 << 20
_NAME = "hybridflow-sandbox-{pid}-{tag}"
_STALE = re.compile(r"hybridflow-sandbox-(\d+)-[0-9a-f]+$")


class CgroupGuard:
    """A fresh memory cgroup the launcher joins; the kernel enforces the bound."""

    def __init__(self, path: str, version: int, limit_bytes: int):
        self.path, self.version = path, version
        self.mechanism = f"cgroup v{version}"
        self.peak_mb: float | None = None
        self.exceeded = False
        os.mkdir(path)
        try:
            if version == 2:
                self._write("memory.max", limit_bytes)
                self._write("memory.swap.max", 0, optional=True)
                self._write("memory.oom.group", 1, optional=True)  # an OOM kills the whole tree
            else:  # the swap limit must not be below the memory limit, so it goes second
                self._write("memory.limit_in_bytes", limit_bytes)
                self._write("memory.memsw.limit_in_bytes", limit_bytes, optional=True)
        except OSError:
            os.rmdir(path)
            raise

    def launcher_config(self) -> dict:
        """What the launcher needs: the ``cgroup.procs`` file it writes its pid to, first thing."""
        return {"cgroup_procs": os.path.join(self.path, "cgroup.procs")}

    def start(self, pid: int) -> None:
        """Nothing to do: the launcher joined by itself, before it could fork."""

    def finish(self) -> None:
        """Kill what is left in the cgroup, read its peak and whether it OOM-killed, remove it."""
        self._kill_members()
        peak = self._read("memory.peak" if self.version == 2 else "memory.max_usage_in_bytes")
        self.peak_mb = int(peak) / _MIB if peak else None
        events = self._read("memory.events" if self.version == 2 else "memory.oom_control") or ""
        kills = re.search(r"^oom_kill (\d+)", events, re.MULTILINE)
        self.exceeded = bool(kills and int(kills[1]) > 0)
        deadline = time.monotonic() + 2.0
        while True:  # busy until the last killed member has exited
            try:
                os.rmdir(self.path)
                return
            except OSError:
                if time.monotonic() > deadline:
                    logger.warning("could not remove the sandbox cgroup %s", self.path)
                    return
                time.sleep(0.01)

    def _kill_members(self) -> None:
        for pid in (self._read("cgroup.procs") or "").split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _write(self, name: str, value: int, optional: bool = False) -> None:
        if optional and not os.path.exists(os.path.join(self.path, name)):
            return
        with open(os.path.join(self.path, name), "w") as f:
            f.write(str(value))

    def _read(self, name: str) -> str | None:
        try:
            with open(os.path.join(self.path, name)) as f:
                return f.read()
        except OSError:
            return None


class WatchdogGuard:
    """Sums the resident memory of the launcher's process tree from ``/proc``; kills the tree past the bound."""

    mechanism = "watchdog"

    def __init__(self, limit_bytes: int, poll_s: float = 0.02):
        self.limit_bytes, self.poll_s = limit_bytes, poll_s
        self.peak_mb: float | None = 0.0
        self.exceeded = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def launcher_config(self) -> dict:
        return {}

    def start(self, pid: int) -> None:
        """Watch the tree under ``pid`` (the launcher) until :meth:`finish`."""
        self._thread = threading.Thread(target=self._watch, args=(pid,), name="sandbox-memory-watchdog", daemon=True)
        self._thread.start()

    def finish(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _watch(self, root: int) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.is_set():
            members = process_tree(root)
            resident = sum(rss for rss in members.values()) * page
            self.peak_mb = max(self.peak_mb or 0.0, resident / _MIB)
            if resident > self.limit_bytes:
                self.exceeded = True
                for pid in members:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                return
            self._stop.wait(self.poll_s)


def process_tree(root: int) -> dict[int, int]:
    """``root`` and its descendants, each with its resident pages, from one pass over ``/proc/*/stat``."""
    return proc_tree(root, 21)


def memory_guard(limit_mb: int) -> CgroupGuard | WatchdogGuard:
    """A guard for one run: a fresh memory cgroup where one can be made, else a watchdog."""
    parent = _cgroup_parent()
    if parent is not None:
        base, version = parent
        _remove_stale(base)
        try:
            name = _NAME.format(pid=os.getpid(), tag=secrets.token_hex(4))
            return CgroupGuard(os.path.join(base, name), version, limit_mb * _MIB)
        except OSError as exc:
            logger.warning("cannot make a sandbox memory cgroup under %s (%s); using the watchdog", base, exc)
    return WatchdogGuard(limit_mb * _MIB)


@functools.lru_cache(maxsize=1)
def _cgroup_parent() -> tuple[str, int] | None:
    """The directory of this process's memory cgroup and its version, if this process may make children there."""
    try:
        return _find_cgroup_parent()
    except (OSError, ValueError) as exc:
        logger.warning("cannot read this process's cgroups (%s); the sandbox memory bound uses the watchdog", exc)
        return None


def _find_cgroup_parent() -> tuple[str, int] | None:
    mounts = {}  # "memory" (v1) or "" (v2) -> (mount root, mount point)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            fields, (fstype, _source, options) = left.split(), right.split()[:3]
            if fstype == "cgroup2":
                mounts.setdefault("", (fields[3], fields[4]))
            elif fstype == "cgroup" and "memory" in options.split(","):
                mounts.setdefault("memory", (fields[3], fields[4]))
    with open("/proc/self/cgroup") as f:
        own = dict(line.rstrip("\n").split(":", 2)[1:] for line in f)
    candidates = []
    for controllers, path in own.items():
        key = "memory" if "memory" in controllers.split(",") else controllers
        if key in mounts:
            root, point = mounts[key]
            if path == root or path.startswith(root.rstrip("/") + "/"):
                candidates.append((os.path.join(point, os.path.relpath(path, root)), 2 if key == "" else 1))
    for directory, version in sorted(candidates, key=lambda c: -c[1]):
        if version == 1 and os.access(directory, os.W_OK):
            return directory, 1
        if version == 2 and _enable_v2_memory(directory):
            return directory, 2
    return None


def _enable_v2_memory(directory: str) -> bool:
    try:
        with open(os.path.join(directory, "cgroup.controllers")) as f:
            if "memory" not in f.read().split():
                return False
        with open(os.path.join(directory, "cgroup.subtree_control"), "w") as f:
            f.write("+memory")  # refused (EBUSY) where this cgroup holds processes and is not the root
        return True
    except OSError:
        return False


def _remove_stale(base: str) -> None:
    """Remove sandbox cgroups whose creator died (rmdir fails on a cgroup still in use)."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        match = _STALE.match(name)
        if match and not os.path.exists(f"/proc/{match[1]}"):
            try:
                os.rmdir(os.path.join(base, name))
            except OSError:
                pass

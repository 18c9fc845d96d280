"""A process pool with a hard wall-clock timeout per task.

``concurrent.futures.ProcessPoolExecutor`` cannot stop one running task: a
task stuck in C code (sympy on an adversarial answer) holds its worker for
good. This pool gives each worker one task at a time and kills the worker
(SIGKILL to its process group, so anything it started goes too) when its
task passes the deadline, then starts a replacement. Everything happens in
the calling thread with blocking waits on pipes, so it works the same from
the driver's main thread, another thread, or a Ray actor (sync or async);
no signals, no helper threads.

::

    driver thread                     worker processes (python -m ...pool_worker)
    ─────────────                     ───────────────────────────────────────────
    run(tasks) ──(task_id, fn, args)──> fn(*args)
       wait(pipes, next deadline)  <──("ok"|"error", task_id, result)
       deadline passed: killpg(worker), outcome "timeout", start a new worker

Workers are separate interpreters started with ``subprocess`` (not
``multiprocessing``), so they never re-import the caller's ``__main__``
(a Ray worker, a script) and inherit no threads or locks. Functions travel
pickled by reference: they must be module-level functions importable in a
fresh interpreter with the caller's ``sys.path``.
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 120.0
"""How long a new worker may take to import its preload modules."""


@dataclass
class Outcome:
    """What became of one task: ``status`` is ``"ok"``, ``"timeout"`` or ``"error"``."""

    status: str
    value: Any = None
    error: str = ""
    seconds: float = 0.0


_TMP_PREFIX = "hybridflow-reward-worker-"


def remove_stale_worker_folders() -> None:
    """Remove the temporary folders of workers whose pool's process is gone.

    A pool removes its workers' folders itself, unless its process was
    killed (a Ray actor killed, say); its workers then die with it (SIGKILL
    on the parent's death) and this sweep, run when a pool starts, removes
    what they left.
    """
    root = tempfile.gettempdir()
    for name in os.listdir(root):
        if not name.startswith(_TMP_PREFIX):
            continue
        owner = name[len(_TMP_PREFIX) :].split("-", 1)[0]
        if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


class WorkerStartError(RuntimeError):
    """A pool worker could not start (bad preload module, no memory, ...)."""


class _Worker:
    """One worker process and the two pipe ends the pool talks through."""

    def __init__(self, setup: dict[str, Any]) -> None:
        # Its own temporary folder, removed when the worker goes: a killed worker
        # leaves nothing behind (a code sandbox's directory, say).
        self.tmp = tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{os.getpid()}-")
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), TMPDIR=self.tmp)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hybridflow.rewards.pool_worker", str(to_worker_r), str(from_worker_w)],
                pass_fds=(to_worker_r, from_worker_w),
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # its own process group: killpg reaches what it starts
            )
        finally:
            os.close(to_worker_r)
            os.close(from_worker_w)
        self.inbox = Connection(from_worker_r, writable=False)
        self.outbox = Connection(to_worker_w, readable=False)
        self.outbox.send(setup)
        self.ready = False
        self.started = time.monotonic()
        self.task: int | None = None  # index of the task it runs
        self.deadline = 0.0

    def assign(self, index: int, fn: Callable[..., Any], args: tuple, timeout_s: float) -> None:
        self.task, self.deadline = index, time.monotonic() + timeout_s
        self.outbox.send((index, fn, args))

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.inbox.close()
        self.outbox.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def stop(self, grace_s: float = 2.0) -> None:
        """Close its input (it exits on EOF); kill it if it has not exited after ``grace_s``."""
        try:
            self.outbox.close()
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        self.kill()


class ScoringPool:
    """``num_workers`` worker processes; :meth:`run` maps a function over tasks with a per-task timeout.

    :param num_workers: worker processes (at least 1).
    :param timeout_s: wall-clock seconds one task may run before its worker is killed.
    :param memory_mb: address-space limit per worker (``RLIMIT_AS``); ``None`` for none.
    :param preload: modules each worker imports before it reports ready
        (so import time is not charged to the first task's timeout).

    Workers start on first use and are reused across calls; :meth:`close`
    (or ``with``) stops them. Not thread-safe: one :meth:`run` at a time.
    """

    def __init__(
        self, num_workers: int = 2, timeout_s: float = 10.0, memory_mb: int | None = None, preload: Sequence[str] = ()
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.num_workers, self.timeout_s = num_workers, float(timeout_s)
        self._setup = {"sys_path": list(sys.path), "memory_mb": memory_mb, "preload": list(preload)}
        self._workers: list[_Worker] = []
        remove_stale_worker_folders()
        self.restarts = 0  # workers replaced after a timeout or a crash, over the pool's life

    def __getstate__(self) -> dict[str, Any]:
        # A pool travels (to a Ray actor, say) as its settings; workers start on first use there.
        return {**self.__dict__, "_workers": []}

    def __enter__(self) -> ScoringPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def close(self) -> None:
        """Stop every worker."""
        workers, self._workers = getattr(self, "_workers", []), []
        for worker in workers:
            worker.stop()

    def _start_missing(self) -> None:
        while len(self._workers) < self.num_workers:
            self._workers.append(_Worker(self._setup))

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers.remove(worker)
        self.restarts += 1
        self._start_missing()

    def run(self, fn: Callable[..., Any], tasks: Sequence[tuple]) -> list[Outcome]:
        """``fn(*task)`` for every task, in order; never raises for a task's failure or timeout.

        Raises :class:`WorkerStartError` only when a worker cannot start at all.
        """
        self._start_missing()
        outcomes: list[Outcome | None] = [None] * len(tasks)
        pending = deque(range(len(tasks)))
        started_at: dict[int, float] = {}
        while pending or any(w.task is not None for w in self._workers):
            for worker in list(self._workers):
                # "while": a task that cannot be sent leaves the worker free for the next one
                while worker in self._workers and worker.ready and worker.task is None and pending:
                    index = pending.popleft()
                    started_at[index] = time.monotonic()
                    self._assign(worker, index, fn, tuple(tasks[index]), outcomes, pending)
            self._wait_and_collect(outcomes, started_at)
        return [o if o is not None else Outcome("error", error="lost") for o in outcomes]

    def _assign(
        self,
        worker: _Worker,
        index: int,
        fn: Callable[..., Any],
        args: tuple,
        outcomes: list[Outcome | None],
        pending: deque,
    ) -> None:
        try:
            worker.assign(index, fn, args, self.timeout_s)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:  # this task cannot travel
            worker.task = None
            outcomes[index] = Outcome("error", error=f"cannot send the task to a worker: {type(exc).__name__}: {exc}")
        except OSError:  # the worker died while idle: not the task's fault, so it goes to another
            worker.task = None
            pending.appendleft(index)
            self._replace(worker)

    def _wait_and_collect(self, outcomes: list[Outcome | None], started_at: dict[int, float]) -> None:
        now = time.monotonic()
        deadlines = [w.deadline for w in self._workers if w.task is not None]
        deadlines += [w.started + STARTUP_TIMEOUT_S for w in self._workers if not w.ready]
        if not deadlines:  # nothing running or starting: nothing to wait for
            return
        ready = wait([w.inbox for w in self._workers], timeout=max(0.0, min(deadlines) - now))
        by_inbox = {id(w.inbox): w for w in self._workers}
        for conn in ready:
            worker = by_inbox[id(conn)]
            try:
                message = conn.recv()
            except (EOFError, OSError):
                self._worker_died(worker, outcomes, started_at)
                continue
            if message[0] == "ready":
                worker.ready = True
            elif message[0] == "setup_error":
                worker.kill()
                self._workers.remove(worker)
                raise WorkerStartError(f"reward pool worker failed to start: {message[2]}")
            else:
                status, _, value = message
                index = worker.task
                worker.task = None
                if index is not None:
                    seconds = time.monotonic() - started_at[index]
                    ok = status == "ok"
                    outcomes[index] = Outcome(status, value if ok else None, "" if ok else value, seconds)
        now = time.monotonic()
        for worker in list(self._workers):
            if worker.task is not None and now >= worker.deadline:
                index = worker.task
                message = f"no result after {self.timeout_s:g} s; worker killed"
                outcomes[index] = Outcome("timeout", error=message, seconds=now - started_at[index])
                self._replace(worker)
            elif not worker.ready and now >= worker.started + STARTUP_TIMEOUT_S:
                self._replace(worker)
                raise WorkerStartError(f"reward pool worker not ready after {STARTUP_TIMEOUT_S:g} s")

    def _worker_died(self, worker: _Worker, outcomes: list[Outcome | None], started_at: dict[int, float]) -> None:
        code = worker.proc.wait()
        if not worker.ready:
            self._workers.remove(worker)
            raise WorkerStartError(f"reward pool worker exited with code {code} before it was ready")
        if worker.task is not None:
            index = worker.task
            outcomes[index] = Outcome(
                "error", error=f"worker process died (exit code {code})", seconds=time.monotonic() - started_at[index]
            )
        self._replace(worker)

"""The reward pool's worker process: ``python -m hybridflow.rewards.pool_worker RFD WFD``.

It reads pickled messages from file descriptor RFD and writes replies to
WFD (both inherited from :class:`~hybridflow.rewards.pool.ScoringPool`):

1. setup ``{"sys_path", "memory_mb", "preload"}`` -> ``("ready", pid)``
   after importing the preload modules;
2. then, per task, ``(task_id, fn, args)`` -> ``("ok", task_id, result)`` or
   ``("error", task_id, "Type: message")``;
3. end of input (the pool closed the pipe, or the trainer died) -> exit.

The worker asks the kernel to kill it when its parent dies, so it never
outlives the trainer. It is single-threaded: math-verify's signal-based
timeouts would even work here, but the pool bounds time from outside.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import os
import resource
import signal
import sys
import traceback
from multiprocessing.connection import Connection

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the pipe's EOF still ends the worker
        pass


def _setup(message: dict) -> None:
    sys.path[:] = list(message["sys_path"])
    memory_mb = message.get("memory_mb")
    if memory_mb:
        limit = int(memory_mb) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    for module in message.get("preload", ()):
        importlib.import_module(module)


def _error_text(exc: BaseException) -> str:
    tail = traceback.format_exception(exc)[-3:]
    return f"{type(exc).__name__}: {exc}\n{''.join(tail)}"[:4000]


def main(read_fd: int, write_fd: int) -> None:
    """Serve scoring tasks until the input pipe closes."""
    _die_with_parent()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s reward-worker %(process)d %(name)s: %(message)s")
    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    try:
        _setup(inbox.recv())
    except BaseException as exc:  # reported to the pool, which raises it
        outbox.send(("setup_error", os.getpid(), _error_text(exc)))
        return
    outbox.send(("ready", os.getpid()))
    while True:
        try:
            task_id, fn, args = inbox.recv()
        except EOFError:
            return
        except Exception as exc:  # a task that cannot be unpickled here (e.g. an unimportable function)
            outbox.send(("error", None, _error_text(exc)))
            continue
        try:
            reply = ("ok", task_id, fn(*args))
            outbox.send(reply)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt from user code too
            outbox.send(("error", task_id, _error_text(exc)))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))

"""The last lines a dead worker process wrote: what Ray's "the actor died unexpectedly" leaves out.

Ray writes each worker process's stdout and stderr to ``<session>/logs/worker-<id>-<job>-<pid>.out`` / ``.err``
on the process's node. When a rank's process dies abruptly (a segfault, whose stack Python's faulthandler
dumps there; a C++ abort; a fatal Python error) the cause is at the end of its ``.err``. A process the
kernel's OOM killer took writes nothing, so an empty tail is said as such: it points at memory.
"""

from __future__ import annotations

import glob
import os
import re
from collections import deque

import ray

TAIL_LINES = 12
NOTHING = "(nothing)"
"""What :func:`last_words` says of an empty log."""
RAY_MARKER = re.compile(r"^:(job_id|actor_name|task_name):")
"""The lines Ray itself writes into a worker's log when a job, actor or task starts there."""


def logs_dir() -> str | None:
    """This machine's Ray log directory of the connected session (None when unknown)."""
    node = getattr(ray._private.worker, "_global_node", None)  # noqa: SLF001 - no public way to the local logs
    try:
        return node.get_logs_dir_path() if node is not None else None
    except Exception:  # noqa: BLE001 - a best effort for an error message
        return None


def last_words(node_id: str, pid: int, lines: int = TAIL_LINES) -> str | None:
    """The last ``lines`` lines the worker process ``pid`` of node ``node_id`` wrote to stderr, as one text
    (:data:`NOTHING` for an empty log); None when its node is not this machine or no log is found."""
    if not ray.is_initialized() or ray.get_runtime_context().get_node_id() != node_id:
        return None
    directory = logs_dir()
    found = glob.glob(os.path.join(glob.escape(directory), f"worker-*-{pid}.err")) if directory else []
    if not found:
        return None
    with open(max(found, key=os.path.getmtime), errors="replace") as err:
        written = (line.rstrip("\n") for line in err if not RAY_MARKER.match(line))
        tail = list(deque(written, maxlen=lines))
    return "\n".join(tail) if any(line.strip() for line in tail) else NOTHING

"""Runs that restart themselves: ``trainer.max_restarts`` and ``<run>/faults.jsonl``.

When a worker fails (a rank's process dies, stops answering the heartbeat, times out in a call, a collective times
out because of a peer, a weight sync arrives corrupted), the attempt's worker groups are torn down with their
placement groups and a new attempt starts in the same Ray instance, resuming from the run's last checkpoint
(``trainer.resume_mode=auto`` from then on: the checkpoint a restart needs is the latest, whatever the first
attempt was told). Each fault is one line of ``faults.jsonl``::

    {"at": 1796.2, "step": 2, "kind": "died", "role": "actor", "method": "update_actor", "rank": 1,
     "message": "actor.update_actor failed on rank 1 (node ..., pid ...): The actor died unexpectedly ...",
     "cause": "", "still_in_call": ["rank 0 (node ..., pid ...): in actor.update_actor for 0.4 s"], "restart": 1}

``restart`` is the attempt the fault led to (0: none, the run stopped with it). After ``max_restarts`` restarts,
or when an error raised by the workers' own code comes back at the step it failed at (not a transient fault: it
would fail the same way every time), the run stops with the error, as without restarts.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ray.exceptions import RayActorError, RayTaskError

from hybridflow.core.rank_wait import WorkerError, WorkerStalledError, WorkerTimeoutError

logger = logging.getLogger(__name__)

FAULTS_FILE = "faults.jsonl"


@dataclass(frozen=True)
class Fault:
    """One worker failure: one line of ``faults.jsonl``."""

    at: float
    step: int | None
    """The step the run was in (None: while the worker groups started)."""
    kind: str
    """``died`` (the process is gone), ``stalled`` (no heartbeat), ``timed out`` (a call's bound) or ``failed``
    (an error raised in the call: a collective that timed out because of a peer, a corrupted weight sync, a bug)."""
    role: str
    method: str
    rank: int | None
    message: str
    """The error's first line: the call, the rank, its node and pid."""
    cause: str
    """The exception under the failure, ``SomethingError: its first line`` ('' for a stall or a timeout)."""
    still_in_call: tuple[str, ...]
    """The other ranks still in the call when it failed (a peer that never reached a collective is among them)."""

    @classmethod
    def of(cls, err: WorkerError) -> Fault:
        """The fault ``err`` reports."""
        return cls(
            at=round(time.time(), 3),
            step=err.step,
            kind=fault_kind(err),
            role=err.role,
            method=err.method,
            rank=err.rank,
            message=str(err).splitlines()[0],
            cause=_cause_line(err.cause),
            still_in_call=tuple(err.still_in_call),
        )

    def repeats(self, earlier: Fault | None) -> bool:
        """The same error raised by the workers' code, at the same step, as ``earlier``: it is not transient."""
        return (
            earlier is not None
            and self.kind == earlier.kind == "failed"
            and (self.step, self.role, self.method) == (earlier.step, earlier.role, earlier.method)
        )


def _cause_line(cause: BaseException | None) -> str:
    """``SomethingError: first line`` of the exception a worker raised (unwrapped from Ray's task error)."""
    if isinstance(cause, RayTaskError):
        cause = cause.cause
    if cause is None:
        return ""
    text = str(cause).strip()
    return f"{type(cause).__name__}: {text.splitlines()[0]}" if text else type(cause).__name__


def fault_kind(err: WorkerError) -> str:
    """How the worker failed: ``died``, ``stalled``, ``timed out`` or ``failed`` (see :attr:`Fault.kind`)."""
    if isinstance(err, WorkerStalledError):
        return "stalled"
    if isinstance(err, WorkerTimeoutError):
        return "timed out"
    return "died" if isinstance(err.cause, RayActorError) else "failed"


def record_fault(run_dir: Path, fault: Fault, restart: int) -> None:
    """Append ``fault`` to the run's ``faults.jsonl`` (``restart``: the attempt it leads to, 0 for none)."""
    line = json.dumps({**asdict(fault), "restart": restart})
    Path(run_dir).mkdir(parents=True, exist_ok=True)  # a fault while the groups start precedes the run's files
    with (Path(run_dir) / FAULTS_FILE).open("a", encoding="utf-8") as file:
        file.write(line + "\n")


def read_faults(run_dir: Path) -> list[dict[str, Any]]:
    """The lines of the run's ``faults.jsonl`` (none when nothing failed)."""
    path = Path(run_dir) / FAULTS_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def fit_with_restarts(fit: Callable[[Any], Any], config: Any, run_dir: Path) -> Any:
    """``fit(config)`` (one attempt: start the worker groups, train, tear them down on every way out), started again
    on a worker's failure up to ``config.trainer.max_restarts`` times, each restart resuming from the latest
    checkpoint; returns the last attempt's result with ``restarts`` set on it."""
    max_restarts = config.trainer.max_restarts
    restarts, last = 0, None
    while True:
        try:
            summary = fit(config)
        except WorkerError as err:
            fault = Fault.of(err)
            repeated = fault.repeats(last)
            stop = restarts >= max_restarts or repeated
            record_fault(run_dir, fault, 0 if stop else restarts + 1)
            if stop:
                if repeated:
                    logger.error("not restarting: the same error at step %s as the last attempt's", fault.step)
                raise
            restarts, last = restarts + 1, fault
            logger.warning(
                "restart %d of %d (trainer.max_restarts) after %s %s on rank %s at step %s; resuming from the last "
                "checkpoint (%s)",
                restarts,
                max_restarts,
                fault.kind,
                f"{fault.role}.{fault.method}",
                fault.rank,
                fault.step,
                FAULTS_FILE,
            )
            if config.trainer.resume_mode != "auto":
                config = copy.deepcopy(config)
                config.trainer.resume_mode = "auto"
            continue
        summary.restarts = restarts
        return summary

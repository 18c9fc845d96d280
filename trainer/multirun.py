"""Hydra multirun, the job side: run names from the sweep, and jobs that fail alone.

Under ``hybridflow-train --multirun`` each job is one training run in its own
directory (``<sweep dir>/<job num>``). Hydra 1.3's basic sweeper re-raises a
job's exception once its batch of jobs has run, which ends the sweep before
``on_multirun_end`` and with no record of what else succeeded. So the task
function runs each job through :func:`run_sweep_job`: a failure is logged
with its traceback, written to ``error.txt`` in the job's directory, and the
job returns normally; every job leaves ``job_status.json``, which the
summary at the end of the sweep reads (:mod:`hybridflow.tools.sweep`). The
files make this work the same for launchers that run jobs in other
processes (``hydra/launcher=joblib``).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

logger = logging.getLogger("hybridflow.sweep")

STATUS_FILE = "job_status.json"
ERROR_FILE = "error.txt"


@dataclass(frozen=True)
class SweepJob:
    """One job of a running multirun, as Hydra describes it to the job."""

    sweep_dir: Path
    job_dir: Path
    num: int
    overrides: list[str]
    """The job's own overrides (one value per key), in command-line order."""
    swept_keys: frozenset[str] | None
    """Keys the sweep varies (a sweep value such as ``a,b`` or ``range(3)``); None when unknown."""


def current_job() -> SweepJob | None:
    """The running multirun job, or None outside ``--multirun`` (and outside Hydra)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return None
    sweep_dir = Path(str(hydra_cfg.sweep.dir)).absolute()
    return SweepJob(
        sweep_dir=sweep_dir,
        job_dir=Path(hydra_cfg.runtime.output_dir),
        num=int(hydra_cfg.job.num),
        overrides=[str(o) for o in hydra_cfg.overrides.task],
        swept_keys=_swept_keys(sweep_dir),
    )


def _swept_keys(sweep_dir: Path) -> frozenset[str] | None:
    # Hydra's basic sweeper (also behind the joblib launcher) saves the sweep's
    # command-line overrides, sweeps unexpanded, in multirun.yaml before any job starts
    saved = sweep_dir / "multirun.yaml"
    if not saved.is_file():
        return None
    sweep_overrides = OmegaConf.select(OmegaConf.load(saved), "hydra.overrides.task", default=None)
    if sweep_overrides is None:
        return None
    return frozenset(o.key_or_group for o in _parse(list(sweep_overrides)) if o.is_sweep_override())


def _parse(overrides: Sequence[str]) -> list[Any]:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_overrides(list(overrides))


def short_keys(keys: Sequence[str]) -> list[str]:
    """Each dotted key cut to its shortest trailing part that no other key ends with.

    ``["algorithm.adv_estimator", "trainer.seed"]`` -> ``["adv_estimator", "seed"]``;
    ``["actor.optim.lr", "critic.optim.lr"]`` -> ``["actor.optim.lr", "critic.optim.lr"]``.
    """
    parts = [key.split(".") for key in keys]
    shortened = []
    for mine in parts:
        for n in range(1, len(mine) + 1):
            if sum(1 for other in parts if other[-n:] == mine[-n:]) == 1:
                break
        shortened.append(".".join(mine[-n:]))
    return shortened


def job_run_name(overrides: Sequence[str], swept_keys: frozenset[str] | None) -> str | None:
    """``adv_estimator=rloo,seed=1``: the job's swept overrides (and its seed) with short keys.

    All of the job's overrides when the swept keys are unknown or none of them
    is swept; None when the job has no overrides. Values are kept as written.
    """
    parsed = _parse(overrides)
    chosen = [
        o
        for o in parsed
        if swept_keys is not None and (o.key_or_group in swept_keys or o.key_or_group.split(".")[-1] == "seed")
    ]
    if not any(o.key_or_group in (swept_keys or ()) for o in chosen):
        chosen = parsed
    if not chosen:
        return None
    keys = short_keys([o.key_or_group for o in chosen])
    return ",".join(f"{key}={o.get_value_element_as_str()}" for key, o in zip(keys, chosen))


def logger_names(run_group: str | None, run_name: str | None, experiment_name: str) -> tuple[str | None, str]:
    """(group, name) for the loggers: explicit values win; under ``--multirun`` the sweep and the job.

    A single run has no group and is named ``experiment_name``. In a sweep the
    group is the sweep directory's name (the same for every job of one sweep)
    and the name is :func:`job_run_name` of the job.
    """
    job = current_job()
    if job is None:
        return run_group, run_name or experiment_name
    return run_group or job.sweep_dir.name, run_name or job_run_name(job.overrides, job.swept_keys) or experiment_name


def error_line(err: BaseException) -> str:
    """``Type: <last line of the message>``: the last line of ``err``'s traceback, with the short type name."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[-1]}" if lines else type(err).__name__


def run_sweep_job(train: Callable[[], float], job: SweepJob, facts: dict[str, Any] | None = None) -> float:
    """Run one multirun job; a failure is recorded instead of raised. Returns the job's score (NaN if it failed).

    ``train`` returns the final validation accuracy (NaN when validation is
    off). Writes ``job_status.json`` in the job directory (overrides, status,
    accuracy, wall time, and ``facts`` that ``train`` filled in, such as the
    Ray node it used) and, for a failure, ``error.txt`` with the traceback.
    Called by the ``hybridflow-train`` task function under ``--multirun`` only.
    """
    facts = {} if facts is None else facts
    job.job_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    record: dict[str, Any] = {
        "num": job.num,
        "name": job_run_name(job.overrides, job.swept_keys) or f"job {job.num}",
        "overrides": job.overrides,
        "started_at": started,
    }
    try:
        score = float(train())
        record.update(status="ok", val_accuracy=score if math.isfinite(score) else None)
    except Exception as err:  # one job's failure must not end the sweep (Ctrl-C still does)
        score = float("nan")
        logger.exception("job %d (%s) failed; the sweep goes on", job.num, " ".join(job.overrides))
        (job.job_dir / ERROR_FILE).write_text(traceback.format_exc(), encoding="utf-8")
        record.update(status="failed", val_accuracy=None, error=error_line(err))
        _release_ray()
    ended = time.time()
    record.update(facts, ended_at=ended, wall_time_s=ended - started)
    (job.job_dir / STATUS_FILE).write_text(json.dumps(record, indent=1), encoding="utf-8")
    return score


def _release_ray() -> None:
    # build_and_fit stops the Ray instance it started, also on errors; this is
    # for a failure it could not clean up after, so the next job (same process
    # under the basic launcher) starts a fresh instance instead of reusing a broken one
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        logger.warning("Ray was still connected after the failed job; shutting it down")
        ray.shutdown()

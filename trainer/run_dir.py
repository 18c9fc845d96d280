"""The Hydra run directory of a run that ended before it wrote anything: removed, not left behind empty."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

from hydra.core.hydra_config import HydraConfig

HYDRA_SAVED_CONFIGS = frozenset({"config.yaml", "hydra.yaml", "overrides.yaml"})
"""What Hydra writes into ``hydra.output_subdir`` (``.hydra/``) of a run directory before the task function runs."""

DATE_DIR = re.compile(r"^\d{4}-\d{2}-\d{2}$")
"""The name of the date level of Hydra's default run directory (``outputs/<date>/<time>``)."""


def remove_unused_run_dir() -> Path | None:
    """Remove the current (single-run) Hydra run directory if it holds nothing but what Hydra wrote before the
    task function ran (``.hydra/`` with its three files, the job's ``<name>.log``); then the date directory of
    Hydra's default ``outputs/<date>/<time>``, and ``outputs/``, where that leaves them empty. Returns the
    directory removed, None when it was kept.

    A run that ended on a config error before writing anything leaves no empty ``outputs/<date>/<time>/``.
    A directory with anything else in it (a checkpoint, ``metrics.jsonl``, a user's file) is left as it is, and
    so is a run directory that is (or holds) the working directory. Not for ``--multirun`` jobs: each leaves
    its ``job_status.json`` (``trainer/multirun.py``).
    """
    if not HydraConfig.initialized():  # called outside a Hydra app (a test): no run directory of its making
        return None
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir).absolute()
    if (
        not run_dir.is_dir()
        or Path(hydra_cfg.runtime.cwd).absolute().is_relative_to(run_dir)  # hydra.run.dir=.
        or not _holds_only_hydra_files(run_dir, hydra_cfg.output_subdir, f"{hydra_cfg.job.name}.log")
    ):
        return None
    _close_log_files_in(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    # Hydra's default layout, outputs/<date>/<time>: the date directory and outputs/ too, when left empty
    date_dir = run_dir.parent
    if DATE_DIR.match(date_dir.name) and _remove_if_empty(date_dir) and date_dir.parent.name == "outputs":
        _remove_if_empty(date_dir.parent)
    return run_dir


def _remove_if_empty(directory: Path) -> bool:
    try:
        directory.rmdir()  # only an empty directory goes
    except OSError:
        return False
    return True


def _close_log_files_in(directory: Path) -> None:
    """Detach and close the logging file handlers writing into ``directory`` (Hydra's job log), so that no later
    line recreates a file there."""
    loggers = [logging.root, *(lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger))]
    for owner in loggers:
        for handler in list(owner.handlers):
            if isinstance(handler, logging.FileHandler) and Path(handler.baseFilename).parent == directory:
                owner.removeHandler(handler)
                handler.close()


def _holds_only_hydra_files(run_dir: Path, output_subdir: str | None, log_name: str) -> bool:
    for entry in run_dir.iterdir():
        if entry.name == log_name and entry.is_file():
            continue
        if output_subdir is not None and entry.name == output_subdir and entry.is_dir() and not entry.is_symlink():
            if all(child.name in HYDRA_SAVED_CONFIGS and child.is_file() for child in entry.iterdir()):
                continue
        return False
    return True

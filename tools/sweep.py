"""Hydra multirun, the end of the sweep: ``sweep_summary.md`` from the jobs' ``job_status.json``.

Each job writes its status (:mod:`hybridflow.trainer.multirun`); the
:class:`SweepSummary` callback (registered in ``configs/ppo_trainer.yaml``)
reads those files when the sweep ends, writes and prints
``sweep_summary.md`` in the sweep directory, and exits with status 1 when
any job failed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from hybridflow.trainer.multirun import STATUS_FILE

SUMMARY_FILE = "sweep_summary.md"


def read_statuses(sweep_dir: Path, since: float = 0.0) -> list[dict[str, Any]]:
    """Every job status of ``sweep_dir`` written by a job that started at or after ``since``, by job number."""
    records = []
    for path in sweep_dir.rglob(STATUS_FILE):
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("started_at", 0.0) >= since:
            records.append({**record, "job_dir": str(path.parent)})
    return sorted(records, key=lambda r: r["num"])


def format_sweep_summary(records: Sequence[dict[str, Any]], sweep_dir: Path) -> str:
    """Markdown: one row per job with its swept overrides, status, final validation accuracy, wall time, error."""
    failed = sum(r["status"] != "ok" for r in records)
    lines = [
        f"# Sweep summary: {sweep_dir}",
        "",
        f"{len(records)} jobs: {len(records) - failed} ok, {failed} failed",
        "",
        "| job | run (swept overrides) | status | val accuracy | wall time | error |",
        "|---|---|---|---|---|---|",
    ]
    for r in records:
        accuracy = "-" if r.get("val_accuracy") is None else f"{r['val_accuracy']:.3f}"
        cells = [str(r["num"]), r["name"], r["status"], accuracy, f"{r['wall_time_s']:.1f} s", r.get("error", "")]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


class SweepSummary(Callback):
    """Hydra callback: at the end of a multirun, ``sweep_summary.md`` in the sweep directory.

    Prints the table too, and raises ``SystemExit(1)`` when a job failed, so a
    sweep with failures exits non-zero after every job ran (Hydra's callback
    runner catches ``Exception`` only, so the exit reaches the process).
    """

    def __init__(self) -> None:
        self.started = 0.0

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # a sweep dir can be reused; older jobs' statuses are not part of this sweep
        self.started = time.time() - 1.0

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
        records = read_statuses(sweep_dir, since=self.started)
        if not records:
            return
        text = format_sweep_summary(records, sweep_dir)
        (sweep_dir / SUMMARY_FILE).write_text(text, encoding="utf-8")
        print("\n" + text, flush=True)
        failed = [r for r in records if r["status"] != "ok"]
        if failed:
            raise SystemExit(
                f"{len(failed)} of {len(records)} sweep jobs failed (jobs {', '.join(str(r['num']) for r in failed)}); "
                f"see {sweep_dir / SUMMARY_FILE} and error.txt in each failed job's directory"
            )

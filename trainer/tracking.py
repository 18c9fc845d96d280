"""Metric sinks behind one interface: ``Tracking(backends).log(metrics, step)``.

The driver is the only process that logs. Built-in sinks: ``console`` (one
compact line per step through ``logging``) and ``jsonl`` (every metric of
every step in ``metrics.jsonl`` in the run directory). Other back-ends (W&B,
TensorBoard) implement the same two methods.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Protocol

logger = logging.getLogger("hybridflow.metrics")

CONSOLE_KEYS = ("score/mean", "score/accuracy", "val/accuracy", "actor/pg_loss", "actor/ppo_kl", "response_length/mean")


class MetricSink(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None:
        """Record the metrics of ``step``."""

    def close(self) -> None:
        """Flush and release resources."""


class ConsoleSink:
    """The main numbers of each validated step at INFO (the progress bar shows the others)."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        shown = " ".join(f"{k}={metrics[k]:.4g}" for k in CONSOLE_KEYS if k in metrics)
        level = logging.INFO if any(k.startswith("val/") for k in metrics) else logging.DEBUG
        logger.log(level, "step %d: %s", step, shown)

    def close(self) -> None:
        pass


class JsonlSink:
    """Appends ``{"step": N, ...metrics}`` lines to a file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, metrics: dict[str, float], step: int) -> None:
        clean = {k: (v if isinstance(v, (int, float)) and math.isfinite(v) else str(v)) for k, v in metrics.items()}
        self._file.write(json.dumps({"step": step, **clean}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


SINKS = ("console", "jsonl")


class Tracking:
    """Fans every ``log`` call out to the configured sinks."""

    def __init__(self, backends: list[str], run_dir: str | Path) -> None:
        unknown = [b for b in backends if b not in SINKS]
        if unknown:
            raise ValueError(f"trainer.logger has unknown back-end(s) {unknown}; allowed: {', '.join(SINKS)}")
        self.sinks: list[MetricSink] = []
        for backend in backends:
            self.sinks.append(ConsoleSink() if backend == "console" else JsonlSink(Path(run_dir) / "metrics.jsonl"))

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Send ``metrics`` of ``step`` to every sink."""
        for sink in self.sinks:
            sink.log(metrics, step)

    def close(self) -> None:
        """Close every sink."""
        for sink in self.sinks:
            sink.close()

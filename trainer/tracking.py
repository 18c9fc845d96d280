"""Metric sinks behind one interface: ``Tracking(backends).log(metrics, step)``.

The driver is the only process that logs. Sinks: ``console`` (one compact
line per step through ``logging``), ``jsonl`` (every metric of every step in
``metrics.jsonl`` in the run directory), ``wandb`` (a W&B run, offline without
an account) and ``tensorboard`` (event files under ``tensorboard/`` in the run
directory). Each implements ``log``, ``log_table`` and ``close``; ``SINKS``
names them. ``jsonl`` is always on, whatever ``trainer.logger`` lists:
``metrics.jsonl`` is the run's own record (``hybridflow compare`` reads it,
a resumed run rewinds it with :meth:`Tracking.rewind`).

Tables are rows of text and numbers under named columns, such as the
validation generations (:data:`GENERATION_COLUMNS`, rows from
:func:`generation_rows`): the console shows each row on a line, ``jsonl``
appends one line per row to ``<name>.jsonl`` (``/`` becomes ``_``:
``val_generations.jsonl``), W&B logs a ``wandb.Table`` and TensorBoard a
markdown table as text.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hybridflow.core import DataProto
from hybridflow.core.keys import GROUND_TRUTH, PROMPT_TEXT, RAW_PROMPT, RESPONSE_MASK, RESPONSES

logger = logging.getLogger("hybridflow.metrics")

CONSOLE_KEYS = ("score/mean", "score/accuracy", "val/accuracy", "actor/pg_loss", "actor/ppo_kl", "response_length/mean")

Row = Sequence[Any]
"""One row of a table: a value (text or number) per column."""

GENERATION_COLUMNS = ("prompt", "response", "ground_truth", "score")
"""The columns of the validation generations table (``trainer.log_val_generations``)."""

GENERATIONS_TABLE = "val/generations"
"""The name of the validation generations table."""

KNOWN_TABLES = (GENERATIONS_TABLE,)
"""The tables the trainer logs: a resumed run rewinds their ``jsonl`` files with ``metrics.jsonl``."""

METRICS_FILE = "metrics.jsonl"
"""Every metric of every step, in the run directory (written whatever ``trainer.logger`` lists)."""

CONSOLE_TEXT_CHARS = 200
"""The console shows at most this many characters of each text cell."""


def generation_rows(batch: DataProto, scores: Sequence[float], tokenizer: Any, limit: int) -> list[Row]:
    """The first ``limit`` rows of a generated batch as :data:`GENERATION_COLUMNS`.

    The response is its valid tokens (``response_mask``) decoded with the
    special tokens kept, so an EOS shows that the response ended and the text
    tokenizes back to the ids that were generated.
    """
    rows: list[Row] = []
    for i in range(min(limit, len(batch))):
        ids = batch.batch[RESPONSES][i][batch.batch[RESPONSE_MASK][i].bool()].tolist()
        shown = batch.non_tensor_batch.get(PROMPT_TEXT, batch.non_tensor_batch[RAW_PROMPT])  # rendered, when known
        prompt, truth = shown[i], batch.non_tensor_batch[GROUND_TRUTH][i]
        rows.append([str(prompt), tokenizer.decode(ids, skip_special_tokens=False), str(truth), float(scores[i])])
    return rows


class MetricSink(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None:
        """Record the metrics of ``step``."""

    def log_table(self, name: str, columns: Sequence[str], rows: Sequence[Row], step: int) -> None:
        """Record a table ``name`` of ``step``: ``rows``, each a value per one of ``columns``."""

    def close(self) -> None:
        """Flush and release resources."""


class ConsoleSink:
    """The main numbers of each validated step at INFO (the progress bar shows the others)."""

    def log(self, metrics: dict[str, float], step: int) -> None:
        shown = " ".join(f"{k}={metrics[k]:.4g}" for k in CONSOLE_KEYS if k in metrics)
        level = logging.INFO if any(k.startswith("val/") for k in metrics) else logging.DEBUG
        logger.log(level, "step %d: %s", step, shown)

    def log_table(self, name: str, columns: Sequence[str], rows: Sequence[Row], step: int) -> None:
        for index, row in enumerate(rows):
            cells = " ".join(f"{column}={_short(value)}" for column, value in zip(columns, row, strict=True))
            logger.info("step %d %s[%d]: %s", step, name, index, cells)

    def close(self) -> None:
        pass


def _short(value: Any) -> str:
    """A cell for one console line: numbers as %.4g, text quoted (newlines escaped) and cut to CONSOLE_TEXT_CHARS."""
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return repr(text if len(text) <= CONSOLE_TEXT_CHARS else text[:CONSOLE_TEXT_CHARS] + "...")


class JsonlSink:
    """Appends ``{"step": N, ...metrics}`` lines to a file; a table's rows, one line each, to ``<name>.jsonl`` beside
    it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")
        self._tables: dict[str, Any] = {}  # table name -> its open file

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._write(self._file, {"step": step, **metrics})

    def log_table(self, name: str, columns: Sequence[str], rows: Sequence[Row], step: int) -> None:
        if name not in self._tables:
            self._tables[name] = (self.path.parent / f"{name.replace('/', '_')}.jsonl").open("a", encoding="utf-8")
        for row in rows:
            self._write(self._tables[name], {"step": step, **dict(zip(columns, row, strict=True))})

    @staticmethod
    def _write(file: Any, record: dict[str, Any]) -> None:
        """One JSON line; numbers that JSON cannot hold (NaN, inf) and other objects as text."""
        clean = {k: (v if isinstance(v, (int, float)) and math.isfinite(v) else str(v)) for k, v in record.items()}
        file.write(json.dumps(clean) + "\n")
        file.flush()

    def rewind(self, step: int) -> None:
        """Drop what was logged after ``step`` from ``metrics.jsonl`` and the tables written beside it (a run
        resumed from the checkpoint of ``step`` logs those steps again)."""
        self.close()
        tables = [self.path.parent / f"{name.replace('/', '_')}.jsonl" for name in KNOWN_TABLES]
        for path in (self.path, *tables):
            drop_steps_after(path, step)
        self._file = self.path.open("a", encoding="utf-8")
        self._tables = {}

    def close(self) -> None:
        self._file.close()
        for file in self._tables.values():
            file.close()


def drop_steps_after(path: str | Path, step: int) -> int:
    """Rewrite the JSON lines file ``path`` without its records of steps after ``step``, atomically (written
    beside it, then renamed over it); a line that is not a JSON record (a write cut short by a kill) goes too.
    Returns how many lines were dropped; a missing file is left missing."""
    path = Path(path)
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
            keep = isinstance(record, dict) and int(record.get("step", 0)) <= step
        except (ValueError, TypeError):
            keep = False
        if keep:
            kept.append(line + "\n")
        else:
            dropped += 1
    if dropped:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(kept), encoding="utf-8")
        os.replace(tmp, path)
        logger.info("%s: dropped %d line(s) logged after step %d (resumed from its checkpoint)", path, dropped, step)
    return dropped


def read_step(path: str | Path, step: int) -> dict[str, Any]:
    """The metrics logged for ``step`` in the JSON lines file ``path`` (merged when several lines hold it);
    empty when the file or the step is missing."""
    path = Path(path)
    found: dict[str, Any] = {}
    if not path.is_file():
        return found
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("step") == step:
            found.update({k: v for k, v in record.items() if k != "step"})
    return found


@dataclass(frozen=True)
class RunInfo:
    """What a sink may record about the run besides its metrics."""

    run_dir: Path
    project: str = "hybridflow"
    name: str = "default"
    group: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)


class WandbSink:
    """A W&B run; offline (files under ``run_dir/wandb``) unless an API key or ``WANDB_MODE`` says otherwise."""

    def __init__(self, info: RunInfo) -> None:
        import wandb  # heavy; only runs that ask for W&B pay for it

        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        self.run = wandb.init(
            project=info.project,
            name=info.name,
            group=info.group,
            config=dict(info.config),
            dir=str(info.run_dir),
            mode=mode,
            settings=wandb.Settings(silent=True, console="off"),
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def log_table(self, name: str, columns: Sequence[str], rows: Sequence[Row], step: int) -> None:
        import wandb

        self.run.log({name: wandb.Table(columns=list(columns), data=[list(row) for row in rows])}, step=step)

    def close(self) -> None:
        import wandb

        self.run.finish()
        # finish() can return before the W&B service has written the offline
        # run file (measured with wandb 0.31: 5 of 6 files held only their
        # 7-byte header right after it); teardown waits for the service to exit,
        # so the run is complete on disk for ``wandb sync`` when the job ends
        wandb.teardown()


class TensorBoardSink:
    """Scalars per step and the run's config as text, in ``run_dir/tensorboard``."""

    def __init__(self, info: RunInfo) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:  # torch imports the optional ``tensorboard`` package lazily
            raise ImportError(
                "trainer.logger has 'tensorboard' but the tensorboard package is not installed; "
                "install it with: pip install 'hybridflow[tensorboard]' (or drop tensorboard from trainer.logger)"
            ) from err
        self.log_dir = Path(info.run_dir) / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        header = f"run `{info.name}`" + (f" in group `{info.group}`" if info.group else "")
        # TensorBoard renders text as markdown: a 4-space indent keeps the JSON a code block
        body = "\n".join("    " + line for line in json.dumps(dict(info.config), indent=2, default=str).splitlines())
        self.writer.add_text("config", f"{header}\n\n{body}", global_step=0)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            if isinstance(value, (int, float)):  # strings and other records have no scalar plot
                self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def log_table(self, name: str, columns: Sequence[str], rows: Sequence[Row], step: int) -> None:
        """The table as markdown text (TensorBoard has no table plot)."""

        def cell(value: Any) -> str:
            return str(value).replace("|", "\\|").replace("\n", " ")

        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
        self.writer.add_text(name, "\n".join(lines), global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


SINKS: dict[str, Callable[[RunInfo], MetricSink]] = {
    "console": lambda info: ConsoleSink(),
    "jsonl": lambda info: JsonlSink(info.run_dir / METRICS_FILE),
    "wandb": WandbSink,
    "tensorboard": TensorBoardSink,
}


class Tracking:
    """Fans every ``log`` call out to the configured sinks, and always to ``jsonl`` (``metrics.jsonl``)."""

    def __init__(self, backends: list[str], info: RunInfo) -> None:
        unknown = [b for b in backends if b not in SINKS]
        if unknown:
            raise ValueError(f"trainer.logger has unknown back-end(s) {unknown}; allowed: {', '.join(SINKS)}")
        Path(info.run_dir).mkdir(parents=True, exist_ok=True)
        names = list(dict.fromkeys([*backends, "jsonl"]))  # listed or not, once
        self.sinks: list[MetricSink] = [SINKS[backend](info) for backend in names]

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Send ``metrics`` of ``step`` to every sink."""
        for sink in self.sinks:
            sink.log(metrics, step)

    def log_table(self, name: str, columns: Sequence[str], rows: Sequence[Row], step: int) -> None:
        """Send the table ``name`` of ``step`` (``rows``, each a value per one of ``columns``) to every sink."""
        for sink in self.sinks:
            sink.log_table(name, columns, rows, step)

    def rewind(self, step: int) -> None:
        """Forget what was logged after ``step`` where it can be rewritten (``metrics.jsonl`` and its tables):
        a run resumed from the checkpoint of ``step`` logs each later step once."""
        for sink in self.sinks:
            if isinstance(sink, JsonlSink):
                sink.rewind(step)

    def close(self) -> None:
        """Close every sink."""
        for sink in self.sinks:
            sink.close()

"""The audit trail: ``<run>/trained_prompts.jsonl``, one line per prompt a step trained on.

Each line says which prompt (its row in the training data, the epoch it was drawn in), at which step, from which
weights its samples were generated (the oldest and newest weight version over their tokens), and how many of its
samples entered the loss (rows with a response token in the mask). A step's lines are written after its update and
before its checkpoint, so a resumed run drops the lines after its checkpoint and writes them again: each step's
lines are there once (tests/trainer/test_resume.py compares a resumed run's file with an uninterrupted run's)::

    {"step": 1, "epoch": 0, "prompt_id": 17, "weight_version": [0, 0], "samples": 4, "samples_trained": 4}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hybridflow.core import DataProto
from hybridflow.core.keys import EPOCH, PROMPT_ID, RESPONSE_MASK, ROLLOUT_VERSIONS, UID

AUDIT_FILE = "trained_prompts.jsonl"


def trained_prompts(batch: DataProto, step: int, version: int) -> list[dict[str, Any]]:
    """One record per prompt (``uid``) of the batch step ``step`` trained on, in the batch's order.

    ``version``: the weights a rollout that stamps no token sampled with (a synchronous rollout: the trainer's
    version at the step, which the rollout source checked)."""
    mask = batch.batch[RESPONSE_MASK].bool()
    versions = batch.batch.get(ROLLOUT_VERSIONS)
    rows_of: dict[str, list[int]] = {}
    for row, uid in enumerate(batch.non_tensor_batch[UID]):
        rows_of.setdefault(uid, []).append(row)
    records = []
    for rows in rows_of.values():
        stamped = versions[rows][mask[rows] & (versions[rows] >= 0)] if versions is not None else []
        lo, hi = (int(stamped.min()), int(stamped.max())) if len(stamped) else (version, version)
        records.append(
            {
                "step": step,
                "epoch": int(batch.non_tensor_batch[EPOCH][rows[0]]),
                "prompt_id": int(batch.non_tensor_batch[PROMPT_ID][rows[0]]),
                "weight_version": [lo, hi],
                "samples": len(rows),
                "samples_trained": int(mask[rows].any(dim=1).sum()),
            }
        )
    return records


def append_records(run_dir: Path, records: list[dict[str, Any]]) -> None:
    """Append ``records`` to the run's audit file, one JSON line each (the file is closed, so written, on return)."""
    with open(Path(run_dir) / AUDIT_FILE, "a", encoding="utf-8") as out:
        out.writelines(json.dumps(record) + "\n" for record in records)


def audit_summary(run_dir: Path | None) -> str:
    """The summary's line: how many prompts the run's steps trained on, how many distinct, over which epochs."""
    if run_dir is None or not (path := Path(run_dir) / AUDIT_FILE).is_file():
        return "none recorded"
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not records:
        return "none recorded"
    epochs = sorted({r["epoch"] for r in records})
    distinct = len({r["prompt_id"] for r in records})
    span = f"epoch {epochs[0]}" if len(epochs) == 1 else f"epochs {epochs[0]}-{epochs[-1]}"
    return f"{len(records)} ({distinct} distinct, {span}): {path}"

"""Checkpoint directories: atomic publication, retention, discovery.

A checkpoint is a directory ``global_step_<N>`` under the checkpoint root.
It is written under a temporary name and renamed into place only when every
part is on disk, so a crash mid-save leaves the previous checkpoint as the
latest complete one; ``latest_checkpointed_iteration.txt`` is then rewritten
atomically (write + rename). What goes *into* the directory (sharded model
and optimizer state, data position, RNG state) is the trainer's business.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^global_step_(\d+)$")
LATEST_FILE = "latest_checkpointed_iteration.txt"
DRIVER_STATE = "driver.json"
"""The driver's part of a checkpoint (step, data position, KL coefficient), written last before publication."""


def step_dir(root: str | Path, step: int) -> Path:
    """Where the checkpoint of ``step`` lives."""
    return Path(root) / f"global_step_{step}"


def staging_dir(root: str | Path, step: int) -> Path:
    """Where the checkpoint of ``step`` is written before it is published."""
    return Path(root) / f".tmp_global_step_{step}"


def publish(root: str | Path, step: int, max_to_keep: int) -> Path:
    """Rename the staged checkpoint into place, record it as latest, prune old ones."""
    root = Path(root)
    final, staged = step_dir(root, step), staging_dir(root, step)
    if final.exists():
        shutil.rmtree(final)
    os.replace(staged, final)
    tmp = root / f".{LATEST_FILE}.tmp"
    tmp.write_text(str(step))
    os.replace(tmp, root / LATEST_FILE)
    prune(root, max_to_keep)
    return final


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """Published checkpoints under ``root`` as (step, path), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and p.is_dir()]
    return sorted(found)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest published checkpoint, or None."""
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def prune(root: str | Path, max_to_keep: int) -> None:
    """Delete all but the newest ``max_to_keep`` checkpoints (0 keeps all) and stale staging dirs."""
    root = Path(root)
    for stale in root.glob(".tmp_global_step_*"):
        shutil.rmtree(stale, ignore_errors=True)
    found = list_checkpoints(root)
    if max_to_keep > 0:
        for _, path in found[:-max_to_keep]:
            logger.info("removing old checkpoint %s", path)
            shutil.rmtree(path, ignore_errors=True)


def is_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a published checkpoint: a ``global_step_<N>`` directory holding the driver's state."""
    path = Path(path)
    return bool(_STEP_DIR.match(path.name)) and (path / DRIVER_STATE).is_file()


def step_of(path: str | Path) -> int:
    """The step number of a checkpoint directory; a clear error for anything else."""
    match = _STEP_DIR.match(Path(path).name)
    if not match or not Path(path).is_dir():
        raise ValueError(f"{path} is not a checkpoint directory (expected an existing .../global_step_<N>)")
    return int(match.group(1))


def check_shared(root: str | Path, probe_ranks: Callable[[str, str], list[str | None]], key: str) -> None:
    """Refuse a checkpoint root that a rank cannot read or write as the driver sees it, before the first step.

    Every rank saves its own shards into the root and a resume reads them back, so on a cluster whose nodes do
    not share the directory a checkpoint would lie in pieces across their disks. The driver writes a marker in a
    probe directory under the root; ``probe_ranks(directory, token)`` has every rank read it and write its own
    (None per rank, or what failed there, naming its node); the driver then reads theirs. ``key`` names the
    setting in the error. Raises :class:`~hybridflow.trainer.config_checks.ConfigError`.
    """
    from hybridflow.trainer.config_checks import ConfigError  # noqa: PLC0415

    token = uuid.uuid4().hex
    probe = Path(root).resolve() / f".probe_{token[:12]}"
    probe.mkdir(parents=True)
    try:
        (probe / "driver").write_text(token)
        answers = probe_ranks(str(probe), token)
        problems = [answer for answer in answers if answer]
        problems += [
            f"rank {rank}: the driver does not see the marker it wrote"
            for rank, answer in enumerate(answers)
            if answer is None and not _holds(probe / f"rank-{rank}", token)
        ]
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    if problems:
        raise ConfigError(
            f"invalid config:\n  - {key}={Path(root).resolve()} is not shared by every rank (each writes its shards "
            "there and a resume reads them all): put it on storage every node mounts at the same path\n  - "
            + "\n  - ".join(problems)
        )


def _holds(path: Path, token: str) -> bool:
    try:
        return path.read_text() == token
    except OSError:
        return False

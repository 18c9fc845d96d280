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
import re
import uuid
from collections.abc import Callable

from hybridflow.core.storage import Location, absolute, child, filesystem, fs_path, is_url, read_text, write_text

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^global_step_(\d+)$")
LATEST_FILE = "latest_checkpointed_iteration.txt"
DRIVER_STATE = "driver.json"
"""The driver's part of a checkpoint (step, data position, KL coefficient), written last before publication."""


def step_dir(root: Location, step: int) -> Location:
    """Where the checkpoint of ``step`` lives."""
    return child(root, f"global_step_{step}")


def staging_dir(root: Location, step: int) -> Location:
    """Where the checkpoint of ``step`` is written before it is published: beside it on a local filesystem (a
    rename publishes it), in place in an object store (which has no rename: the driver's state, written last,
    completes it)."""
    return child(root, f".tmp_global_step_{step}") if _renames(root) else step_dir(root, step)


def prepare_staging(root: Location, step: int) -> Location:
    """An empty :func:`staging_dir` for ``step`` (what an earlier, interrupted save of it left is removed)."""
    staged = staging_dir(root, step)
    fs, path = filesystem(staged)
    if fs.exists(path):
        fs.rm(path, recursive=True)
    fs.makedirs(path, exist_ok=True)
    return staged


def publish(root: Location, step: int, max_to_keep: int) -> Location:
    """Publish the staged checkpoint, record it as latest, prune old ones. On a local filesystem the staged
    directory is renamed into place and the record rewritten by a rename, each atomic; in an object store the
    checkpoint was written in place and counts from its driver's state on, and the record is one object."""
    fs, _ = filesystem(root)
    final, latest = step_dir(root, step), child(root, LATEST_FILE)
    if _renames(root):
        if fs.exists(fs_path(final)):
            fs.rm(fs_path(final), recursive=True)
        fs.mv(fs_path(staging_dir(root, step)), fs_path(final))
        tmp = child(root, f".{LATEST_FILE}.tmp")
        write_text(tmp, str(step))
        fs.mv(fs_path(tmp), fs_path(latest))
    else:
        write_text(latest, str(step))
    prune(root, max_to_keep)
    return final


def list_checkpoints(root: Location) -> list[tuple[int, Location]]:
    """Published checkpoints under ``root`` as (step, location), oldest first."""
    fs, path = filesystem(root)
    if not fs.isdir(path):
        return []
    found = []
    for entry in fs.ls(path, detail=True):
        name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
        if (m := _STEP_DIR.match(name)) and entry["type"] == "directory":
            found.append((int(m.group(1)), child(root, name)))
    if not _renames(root):  # in place: complete once the driver's state is in
        found = [(step, where) for step, where in found if fs.isfile(fs_path(child(where, DRIVER_STATE)))]
    return sorted(found)


def latest_checkpoint(root: Location) -> Location | None:
    """The newest published checkpoint, or None."""
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def prune(root: Location, max_to_keep: int) -> None:
    """Delete all but the newest ``max_to_keep`` checkpoints (0 keeps all) and stale staging dirs."""
    fs, path = filesystem(root)
    if not fs.isdir(path):
        return
    found = list_checkpoints(root)
    published = {fs_path(where) for _, where in found}
    for entry in fs.ls(path, detail=False):  # what an interrupted save left: staged, or written in place
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        if name.startswith(".tmp_global_step_") or (_STEP_DIR.match(name) and entry.rstrip("/") not in published):
            fs.rm(entry, recursive=True)
    if max_to_keep > 0:
        for _, old in found[:-max_to_keep]:
            logger.info("removing old checkpoint %s", old)
            fs.rm(fs_path(old), recursive=True)


def is_checkpoint(location: Location) -> bool:
    """Whether ``location`` is a published checkpoint: a ``global_step_<N>`` directory holding the driver's state."""
    fs, path = filesystem(location)
    return bool(_STEP_DIR.match(_name(location))) and fs.isfile(fs_path(child(location, DRIVER_STATE)))


def step_of(location: Location) -> int:
    """The step number of a checkpoint directory; a clear error for anything else."""
    match = _STEP_DIR.match(_name(location))
    fs, path = filesystem(location)
    if not match or not fs.isdir(path):
        raise ValueError(f"{location} is not a checkpoint directory (expected an existing .../global_step_<N>)")
    return int(match.group(1))


def _renames(location: Location) -> bool:
    """Whether ``location``'s filesystem renames a directory in one step (a local one; an object store copies)."""
    return not is_url(location)


def _name(location: Location) -> str:
    return str(location).rstrip("/").rsplit("/", 1)[-1]


def check_shared(root: Location, probe_ranks: Callable[[str, str], list[str | None]], key: str) -> None:
    """Refuse a checkpoint root that a rank cannot read or write as the driver sees it, before the first step.

    Every rank saves its own shards into the root and a resume reads them back, so on a cluster whose nodes do
    not share the directory a checkpoint would lie in pieces across their disks. The driver writes a marker in a
    probe directory under the root; ``probe_ranks(directory, token)`` has every rank read it and write its own
    (None per rank, or what failed there, naming its node); the driver then reads theirs. ``key`` names the
    setting in the error. Raises :class:`~hybridflow.trainer.config_checks.ConfigError`.
    """
    from hybridflow.trainer.config_checks import ConfigError  # noqa: PLC0415

    token = uuid.uuid4().hex
    root = absolute(root)
    probe = child(root, f".probe_{token[:12]}")
    fs, path = filesystem(probe)
    fs.makedirs(path, exist_ok=True)
    try:
        write_text(child(probe, "driver"), token)
        answers = probe_ranks(str(probe), token)
        problems = [answer for answer in answers if answer]
        problems += [
            f"rank {rank}: the driver does not see the marker it wrote"
            for rank, answer in enumerate(answers)
            if answer is None and not _holds(child(probe, f"rank-{rank}"), token)
        ]
    finally:
        fs.rm(path, recursive=True)
    if problems:
        raise ConfigError(
            f"invalid config:\n  - {key}={root} is not shared by every rank (each writes its shards there and a "
            "resume reads them all): put it on storage every node mounts at the same path\n  - "
            + "\n  - ".join(problems)
        )


def _holds(location: Location, token: str) -> bool:
    try:
        return read_text(location) == token
    except OSError:
        return False

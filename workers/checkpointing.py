"""Sharded checkpoints of one role: model and optimizer through torch.distributed.checkpoint.

Every rank writes its own shards (no full copy of the model is ever gathered)
into ``<dir>/<role>/``; the scheduler state and anything else small go to
``<dir>/<role>/extra_rank<r>.pt``. Loading reshards automatically when the
world size differs (DCP's planner), so a run may resume on more or fewer ranks.
Call on every rank of the group (the save and load are collective).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def save_role(
    directory: str | Path,
    role: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    *,
    extra: dict[str, Any] | None = None,
) -> None:
    """Write this rank's shards of ``model`` (and ``optimizer``) plus ``extra`` under ``directory/role``."""
    target = Path(directory) / role
    target.mkdir(parents=True, exist_ok=True)
    model_state, optim_state = get_state_dict(model, optimizer if optimizer is not None else [])
    state = {"model": model_state}
    if optimizer is not None:
        state["optim"] = optim_state
    dcp.save(state, checkpoint_id=str(target))
    rank = dist.get_rank() if dist.is_initialized() else 0
    torch.save(extra or {}, target / f"extra_rank{rank}.pt")


def load_role(
    directory: str | Path, role: str, model: nn.Module, optimizer: torch.optim.Optimizer | None
) -> dict[str, Any]:
    """Restore ``model`` (and ``optimizer``) in place from ``directory/role``; returns this rank's ``extra``."""
    source = Path(directory) / role
    if not source.is_dir():
        raise FileNotFoundError(f"checkpoint {directory} has no {role!r} state (looked for {source})")
    model_state, optim_state = get_state_dict(model, optimizer if optimizer is not None else [])
    state = {"model": model_state}
    if optimizer is not None:
        state["optim"] = optim_state
    dcp.load(state, checkpoint_id=str(source))
    set_state_dict(
        model,
        optimizer if optimizer is not None else [],
        model_state_dict=state["model"],
        optim_state_dict=state.get("optim", {}),
    )
    rank = dist.get_rank() if dist.is_initialized() else 0
    extra_file = source / f"extra_rank{rank}.pt"
    if not extra_file.exists():  # resumed on more ranks than saved: rank 0's extras apply to all
        extra_file = source / "extra_rank0.pt"
    return torch.load(extra_file, weights_only=False)

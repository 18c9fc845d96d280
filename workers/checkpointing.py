"""Sharded checkpoints of one role: model and optimizer through torch.distributed.checkpoint.

Every rank writes its own shards (no full copy of the model is ever gathered)
into ``<dir>/<role>/``; the scheduler state and anything else small go to
``<dir>/<role>/extra_rank<r>.pt``. Loading reshards automatically when the
world size differs (DCP's planner), so a run may resume on more or fewer ranks.
Call on every rank of the group (the save and load are collective).

Two more things make a role's checkpoint readable without its ranks:
``<dir>/<role>/huggingface/`` holds the model's HF config, generation config
and tokenizer (small files, written by rank 0: :func:`save_hf_files`), and
:func:`read_model_state` reads the shards back as full tensors in one process
with no process group (what ``hybridflow export`` does on the driver machine).
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from transformers import AutoModelForCausalLM, GenerationConfig, PretrainedConfig, PreTrainedModel

from hybridflow.core.storage import child, filesystem, fs_path, read_text, write_text

HF_FILES = "huggingface"
"""The folder of a role's checkpoint holding its HF config, generation config and tokenizer."""


def save_role(
    directory: str | Path,
    role: str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    *,
    extra: dict[str, Any] | None = None,
) -> None:
    """Write this rank's shards of ``model`` (and ``optimizer``) plus ``extra`` under ``directory/role``
    (a local path, or a URL: DCP's fsspec writer, ``core/storage.py``)."""
    target = child(directory, role)
    fs, path = filesystem(target)
    fs.makedirs(path, exist_ok=True)
    model_state, optim_state = get_state_dict(model, optimizer if optimizer is not None else [])
    state = {"model": model_state}
    if optimizer is not None:
        state["optim"] = optim_state
    dcp.save(state, checkpoint_id=str(target))
    rank = dist.get_rank() if dist.is_initialized() else 0
    with fs.open(fs_path(child(target, f"extra_rank{rank}.pt")), "wb") as f:
        torch.save(extra or {}, f)


def load_role(
    directory: str | Path, role: str, model: nn.Module, optimizer: torch.optim.Optimizer | None
) -> dict[str, Any]:
    """Restore ``model`` (and ``optimizer``) in place from ``directory/role``; returns this rank's ``extra``."""
    source = child(directory, role)
    fs, path = filesystem(source)
    if not fs.isdir(path):
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
    extra_file = fs_path(child(source, f"extra_rank{rank}.pt"))
    if not fs.exists(extra_file):  # resumed on more ranks than saved: rank 0's extras apply to all
        extra_file = fs_path(child(source, "extra_rank0.pt"))
    with fs.open(extra_file, "rb") as f:
        return torch.load(f, weights_only=False)


def save_hf_files(
    directory: str | Path,
    role: str,
    config: PretrainedConfig,
    generation_config: GenerationConfig,
    tokenizer: Any,
    adapter_config: Any = None,
) -> None:
    """Write the model's HF config, generation config and tokenizer (and a LoRA run's adapter config, which an
    offline export needs to merge or write the adapter) into ``directory/role/huggingface``.

    With them and the shards, :func:`read_model_state` and :func:`model_from_full_state` rebuild the
    model offline. Call on one rank.
    """
    with tempfile.TemporaryDirectory() as local:  # transformers writes to a local directory; a URL gets a copy
        for part in (config, generation_config, tokenizer, adapter_config):
            if part is not None:
                part.save_pretrained(local)
        fs, path = filesystem(child(directory, role, HF_FILES))
        fs.makedirs(path, exist_ok=True)
        fs.put(f"{local}/*", path + "/", recursive=True)


def read_model_state(directory: str | Path, role: str) -> dict[str, torch.Tensor]:
    """The full model weights that :func:`save_role` wrote under ``directory/role``, in this process alone.

    No process group is needed, and any number of ranks may have saved: DCP's
    planner assembles every tensor from its shards. The optimizer state is not
    read. Returns parameter name -> full CPU tensor, in the saved dtype.
    """
    source = Path(directory) / role
    if not (source / ".metadata").is_file():
        raise FileNotFoundError(f"checkpoint {directory} has no {role!r} model shards (looked for {source}/.metadata)")
    reader = dcp.FileSystemReader(str(source))
    metadata = reader.read_metadata()
    model: dict[str, torch.Tensor] = {}
    for key, meta in metadata.state_dict_metadata.items():
        group, *name = metadata.planner_data[key]  # the nested path save_role's {"model": ..., "optim": ...} had
        if group == "model" and isinstance(meta, TensorStorageMetadata):
            model[".".join(map(str, name))] = torch.empty(meta.size, dtype=meta.properties.dtype)
    with warnings.catch_warnings():  # DCP warns that it loads in one process: that is the point here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load({"model": model}, storage_reader=reader, no_dist=True)
    return model


def model_from_full_state(
    config: PretrainedConfig, state: dict[str, torch.Tensor], generation_config: GenerationConfig | None = None
) -> PreTrainedModel:
    """An HF causal LM built from ``config`` holding exactly the weights ``state`` (full tensors).

    Every weight must be there, except the output projection of a model with
    tied embeddings (it is the input embedding); anything missing or left over
    is an error, as is a tie that loading would have broken.
    """
    model = AutoModelForCausalLM.from_config(config, dtype=next(iter(state.values())).dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    allowed = {"lm_head.weight"} if tied else set()
    if unexpected or set(missing) - allowed:
        raise RuntimeError(f"weights do not match the model (missing {missing}, unexpected {unexpected})")
    if tied and model.get_output_embeddings().weight is not model.get_input_embeddings().weight:
        raise RuntimeError("the model's output projection is no longer tied to its input embeddings")
    if generation_config is not None:
        model.generation_config = generation_config
    return model.eval()


def answer_probe(directory: str, token: str, rank: int) -> str | None:
    """This rank's part of the check that every rank shares the checkpoint directory: read the driver's marker
    ``directory/driver`` (it must hold ``token``), then write ``directory/rank-<rank>`` for the driver to read.
    None when both worked; otherwise what failed, with this rank's node (so the error says which node)."""
    import ray  # noqa: PLC0415 - a rank runs in a Ray actor; this module is imported without Ray too

    try:
        seen = read_text(child(directory, "driver"))
        if seen != token:
            raise OSError(f"holds {seen!r}, not this run's marker")
        write_text(child(directory, f"rank-{rank}"), token)
    except OSError as err:
        node = f"node {ray.util.get_node_ip_address()} ({ray.get_runtime_context().get_node_id()[:8]})"
        return f"rank {rank} on {node}, pid {os.getpid()}: {type(err).__name__}: {err}"
    return None

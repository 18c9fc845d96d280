"""Load a model sharded over a mesh with one full copy in host memory: one reader, the other ranks on meta.

Today every rank of a worker group reads the whole checkpoint and then shards
it, so a node running r ranks of a model of M bytes holds r private full
copies for a while whenever loading converts (a bf16 checkpoint into an fp32
model, a ``.bin`` checkpoint, a built-in model's random weights); only a
safetensors file read in its own dtype is mapped, and then shared through the
page cache. :func:`load_sharded_model` holds M once::

    rank 0 (reader)                                  ranks 1..n-1
    read(path, dtype, seed): full model, M bytes     (nothing read: path is not touched)
          |-- blueprint: class, config, generation config, train/eval,
          |   non-persistent buffers (broadcast_object_list) -->
    skeleton = cls._from_config(config) on meta      same
    shard(skeleton, mesh)  (shard_model: FSDP2 [+ TP] on meta, no memory)
    skeleton.to_empty(device): this rank's shards, ~M/n bytes
    set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True):
      rank 0 broadcasts one tensor at a time; every rank keeps its slice
          |-- full state dict -->                    {}  (receive)
    non-persistent buffers set from the blueprint (rotary inv_freq: to_empty
    left them garbage and they are in no state dict)

So the reader holds M (plus its shard) while loading and gives the full copy
back when done; every other rank holds its shard plus, at its peak, one
transient full tensor (the one being broadcast: the largest weight, e.g. the
embedding, sets the peak). ``bench/bench_loading.py`` measures both ways. The weights are those ``read`` made on
rank 0, so they are bit-identical to today's path, where every rank made the same weights (same
path, same seed) and sharded them.

Which rank reads: torch's ``broadcast_from_rank0`` broadcasts from *global*
rank 0 over the default process group (torch 2.13's ``set_model_state_dict``
takes no group), so the reader is global rank 0 and the call is collective
over the whole default group, which must be the mesh's ranks. On several
nodes this means one full copy in the whole job, on node 0; the other nodes
hold shards only, and the whole model travels from rank 0 to every rank (a
reader per node would need a per-node group, which this API does not take).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from transformers import GenerationConfig, PretrainedConfig, PreTrainedModel

from hybridflow.workers.fsdp import shard_model
from hybridflow.workers.models import load_model_and_tokenizer

__all__ = ["READER_RANK", "ModelReader", "load_sharded_model", "read_causal_lm"]

READER_RANK = 0
"""The global rank that reads the checkpoint (fixed by ``broadcast_from_rank0``)."""

ModelReader = Callable[[str, torch.dtype, int | None], PreTrainedModel]
"""``read(path, dtype, seed)``: the full model with its weights, on CPU; only the reader rank calls it."""


def read_causal_lm(path: str, dtype: torch.dtype, seed: int | None) -> PreTrainedModel:
    """The policy exactly as every rank loads it today (:func:`load_model_and_tokenizer`, tokenizer dropped)."""
    return load_model_and_tokenizer(path, dtype=dtype, seed=seed)[0]


@dataclass
class _Blueprint:
    """What the other ranks need from the reader to build the same model without reading anything."""

    model_class: type[PreTrainedModel]
    config: PretrainedConfig
    generation_config: GenerationConfig | None
    training: bool
    buffers: dict[str, torch.Tensor]  # the non-persistent ones: in no state dict, lost by to_empty

    @classmethod
    def of(cls, model: PreTrainedModel) -> _Blueprint:
        persistent = model.state_dict().keys()
        buffers = {name: buf.detach().cpu() for name, buf in model.named_buffers() if name not in persistent}
        generation = getattr(model, "generation_config", None)  # None for heads that do not generate (the critic)
        return cls(type(model), model.config, generation, model.training, buffers)


def _read_on_reader(path: str, dtype: torch.dtype, seed: int | None, read: ModelReader):
    """``(full model or None, blueprint)``: the reader reads, everyone gets the blueprint (collective).

    A failed read is broadcast in place of the blueprint, so the other ranks
    raise too instead of waiting forever in the next collective.
    """
    full, error, message = None, None, [None]
    if dist.get_rank() == READER_RANK:
        try:
            full = read(path, dtype, seed)
            message[0] = _Blueprint.of(full)
        except Exception as exc:  # re-raised below, after the others have been told
            error, message[0] = exc, f"{type(exc).__name__}: {exc}"
    dist.broadcast_object_list(message, src=READER_RANK)
    if error is not None:
        raise error
    if isinstance(message[0], str):
        raise RuntimeError(f"rank {READER_RANK} could not read the model at {path!r}: {message[0]}")
    return full, message[0]


def _skeleton(blueprint: _Blueprint, dtype: torch.dtype) -> PreTrainedModel:
    """The reader's model class and config on the meta device (weights unallocated, ties made)."""
    # AutoModel*.from_config picks the class and calls _from_config; the class is
    # already known (the reader's), so one argument (read) says what is built.
    with torch.device("meta"):
        model = blueprint.model_class._from_config(blueprint.config, dtype=dtype)
    if blueprint.generation_config is not None:
        model.generation_config = blueprint.generation_config
    return model


def _set_buffers(model: nn.Module, buffers: dict[str, torch.Tensor], device: torch.device) -> None:
    """Replace every non-persistent buffer by the reader's value (dtype included)."""
    persistent = model.state_dict().keys()
    unset = {name for name, _ in model.named_buffers() if name not in persistent}
    if unset != buffers.keys():  # one the reader did not send would stay whatever to_empty left
        raise RuntimeError(
            f"the meta-built model's non-persistent buffers {sorted(unset)} differ from the reader's {sorted(buffers)}"
        )
    for name, value in buffers.items():
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent), leaf, value.to(device))  # a registered buffer stays registered


def load_sharded_model(
    path: str,
    *,
    dtype: torch.dtype,
    seed: int | None,
    mesh: DeviceMesh,
    device: torch.device | str = "cpu",
    read: ModelReader = read_causal_lm,
    shard: Callable[[nn.Module, DeviceMesh], nn.Module] = shard_model,
) -> PreTrainedModel:
    """The model at ``path``, sharded over ``mesh`` by ``shard``, with one full copy on rank 0 only; collective.

    Call it on every rank of the default process group at once (the mesh must
    span that group). Only global rank 0 calls ``read`` and so touches
    ``path``; see the module docstring for what each rank holds.

    :param path: what ``read`` loads (a local HF directory or ``builtin:<name>``
        for the default reader); the other ranks ignore it.
    :param dtype: parameter dtype, passed to ``read`` and used for the skeleton.
    :param seed: passed to ``read`` (seeds a built-in model's random weights).
    :param mesh: a 1-D data-parallel mesh or a 2-D ``("dp", "tp")`` mesh.
    :param device: where this rank's shards live: ``"cpu"`` for gloo, the rank's
        GPU for nccl (the reader's full copy stays on CPU; each tensor is moved
        to the device for its broadcast).
    :param read: makes the full model on the reader; the critic passes its value-model builder.
    :param shard: shards the meta-device skeleton in place, as the role would shard a loaded model
        (e.g. with its mixed precision and activation checkpointing); it must not read weights.
    :returns: the sharded model (FSDP2 module of the reader's class) with the
        reader's weights, config, generation config, buffers and train/eval mode.
    :raises RuntimeError: on every rank when the reader's ``read`` failed (the
        reader re-raises its own exception), or when the mesh is not the whole group.
    """
    if mesh.size() != dist.get_world_size():
        raise RuntimeError(
            f"load_sharded_model broadcasts over the default process group ({dist.get_world_size()} ranks), "
            f"so the mesh must span it; got a mesh of {mesh.size()} ranks"
        )
    device = torch.device(device)
    full, blueprint = _read_on_reader(path, dtype, seed, read)
    model = shard(_skeleton(blueprint, dtype), mesh)
    model.to_empty(device=device)
    # Only the reader holds the full state dict; the others pass {} and receive.
    state = full.state_dict() if full is not None else {}
    del full  # the state dict's tensors go as soon as the broadcast has copied them
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, state, options=options)
    del state
    _set_buffers(model, blueprint.buffers, device)
    return model.train(blueprint.training)

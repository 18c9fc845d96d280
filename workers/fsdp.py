"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for HF causal LMs.

Each decoder layer is its own FSDP unit (its parameters are gathered just
for its forward/backward), then the root module takes the rest (embeddings,
final norm, LM head). FSDP averages gradients over the data-parallel ranks;
the actor scales its loss by the dp size so that this average is the sum of
every rank's share of the global mini-batch mean (see
``workers/actor/ppo_actor.py``). A custom divide factor would say the same
more directly, but it needs the PREMUL_SUM reduction, which gloo lacks.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks of an HF causal LM (``model.model.layers`` for Qwen2 / Llama)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(
            f"{type(model).__name__} has no model.layers ModuleList; FSDP wrapping supports HF decoder-only "
            "models laid out like Qwen2 / Llama"
        )
    return layers


def shard_model(model: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """Shard ``model`` in place over the 1-D data-parallel ``mesh``; returns it."""
    if mesh.ndim != 1:
        raise ValueError(f"shard_model needs a 1-D data-parallel mesh, got dims {mesh.mesh_dim_names}")
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def full_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter gathered to a full tensor (collective: call on all ranks)."""
    out = {}
    for name, param in model.named_parameters():
        out[name] = param.full_tensor() if hasattr(param, "full_tensor") else param.detach().clone()
    return out

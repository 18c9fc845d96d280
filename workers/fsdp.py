"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for HF causal LMs, optionally with tensor parallelism.

Each decoder layer is its own FSDP unit (its parameters are gathered just
for its forward/backward), then the root module takes the rest (embeddings,
final norm, LM head). FSDP averages gradients over the data-parallel ranks;
the actor scales its loss by the dp size so that this average is the sum of
every rank's share of the global mini-batch mean (see
``workers/actor/ppo_actor.py``). A custom divide factor would say the same
more directly, but it needs the PREMUL_SUM reduction, which gloo lacks.

On a 2-D ``("dp", "tp")`` mesh the model is first split Megatron-style over
the ``tp`` ranks (DTensor ``parallelize_module``), then FSDP2 shards it over
the ``dp`` ranks::

    layer:  q/k/v_proj, gate/up_proj  ColwiseParallel   (output heads / intermediate rows split)
            o_proj, down_proj          RowwiseParallel   (input columns split; output all-reduced)
    root:   embed_tokens               RowwiseParallel(input_layouts=Replicate())  (vocab rows split)
            lm_head                    ColwiseParallel(output_layouts=Replicate()) (callers see full logits)
            norms                      not split: every tp rank holds them, FSDP shards them over dp

The ranks of one dp group see the same batch; the dp group (for global token
counts and the loss scale) is :func:`data_parallel_group`. HF attention
reshapes with ``view(..., -1, head_dim)``, so each tp rank simply runs its
own heads; the head counts must divide by the tp size.

Tied embeddings (``lm_head.weight is embed_tokens.weight``): both modules
split the same weight along the vocab rows (``Shard(0)`` on the tp mesh), so
the embedding's DTensor parameter is handed back to ``lm_head`` after both are
parallelized, and the tie (one parameter, one gradient) survives.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from hybridflow.configs.schema import FSDPConfig
from hybridflow.core import dtensor

__all__ = [
    "data_parallel_group",
    "decoder_layers",
    "full_parameters",
    "mixed_precision",
    "reshard",
    "shard_model",
    "shard_role",
    "sharded_parameters",
    "tensor_parallelize",
]

_LAYER_PLAN = {
    "self_attn.q_proj": ColwiseParallel,
    "self_attn.k_proj": ColwiseParallel,
    "self_attn.v_proj": ColwiseParallel,
    "self_attn.o_proj": RowwiseParallel,
    "mlp.gate_proj": ColwiseParallel,
    "mlp.up_proj": ColwiseParallel,
    "mlp.down_proj": RowwiseParallel,
}


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


def _check_heads(model: nn.Module, tp_size: int) -> None:
    text = model.config.get_text_config(decoder=True)
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    if heads % tp_size or kv_heads % tp_size:
        raise ValueError(
            f"training tensor parallelism over {tp_size} ranks splits attention by heads: num_attention_heads={heads} "
            f"and num_key_value_heads={kv_heads} must both be divisible by the tp size"
        )


def tensor_parallelize(model: nn.Module, tp_mesh: DeviceMesh) -> nn.Module:
    """Split ``model`` in place over the 1-D ``tp_mesh`` (the plan in the module docstring); returns it."""
    _check_heads(model, tp_mesh.size())
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and head.weight is embed.weight
    for layer in decoder_layers(model):
        parallelize_module(layer, tp_mesh, {name: style() for name, style in _LAYER_PLAN.items()})
    parallelize_module(embed, tp_mesh, RowwiseParallel(input_layouts=Replicate()))
    if head is not None:
        parallelize_module(head, tp_mesh, ColwiseParallel(output_layouts=Replicate()))
    if tied:
        # parallelize_module gave each module its own copy; both are Shard(0) on
        # the same mesh, so lm_head can use the embedding's and stay tied.
        head.weight = embed.weight
    return model


def mixed_precision(param_dtype: torch.dtype | None, reduce_dtype: torch.dtype | None) -> MixedPrecisionPolicy:
    """FSDP2's policy: gathered parameters compute in ``param_dtype``, gradients reduce in ``reduce_dtype``
    (None: the parameters' own dtype); the sharded parameters, and so the optimizer, keep theirs."""
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)


def shard_model(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    mp_policy: MixedPrecisionPolicy | None = None,
    reshard_after_forward: bool = True,
) -> nn.Module:
    """Shard ``model`` in place; returns it.

    ``mesh``: 1-D (data parallel: FSDP2 over all its ranks) or 2-D with dims
    ``("dp", "tp")`` (tensor parallel over ``tp``, then FSDP2 over ``dp``).
    ``mp_policy``: FSDP2 mixed precision (:func:`mixed_precision`; None: none).
    ``reshard_after_forward=False`` keeps each layer's parameters gathered
    from its forward to its backward (one all-gather per layer and
    micro-batch instead of two), and after a no-grad forward until the next
    backward or :func:`reshard`, so the micro-batches of a log-prob pass
    all-gather once; the full model sits on every rank meanwhile. (Keeping
    them past the backward too, ``set_reshard_after_backward(False)``, gave
    wrong updates in a two-step test here, torch 2.13: not used.)
    """
    mp_policy = mp_policy or MixedPrecisionPolicy()
    if mesh.ndim == 2 and mesh.mesh_dim_names == ("dp", "tp"):
        tensor_parallelize(model, mesh["tp"])
        dp_mesh = mesh["dp"]
    elif mesh.ndim == 1:
        dp_mesh = mesh
    else:
        raise ValueError(
            f"shard_model needs a 1-D data-parallel mesh or a 2-D mesh with dims ('dp', 'tp'), "
            f"got dims {mesh.mesh_dim_names}"
        )
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=dp_mesh, mp_policy=mp_policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp_policy, reshard_after_forward=reshard_after_forward)
    return model


def reshard(model: nn.Module) -> None:
    """Free the gathered copies of every FSDP2 unit's parameters (a no-op where they are sharded)."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def enable_activation_checkpointing(model: nn.Module) -> nn.Module:
    """Recompute each decoder layer's activations in the backward pass (HF's checkpointing, non-reentrant, so
    it composes with FSDP2 and needs no input that requires grad); returns ``model``."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name; 4.x has only the old one
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    # every training forward passes use_cache=False: the config keeps its own value, which exports write
    return model


def shard_role(
    model: nn.Module,
    mesh: DeviceMesh,
    fsdp_config: FSDPConfig,
    *,
    compute_dtype: str,
    gradient_checkpointing: bool = False,
) -> nn.Module:
    """A role's model as it trains or scores: activation checkpointing when asked (HF's, non-reentrant,
    applied before sharding), then :func:`shard_model`, with FSDP2 mixed precision when the role computes in
    another dtype than its weights are held in (``compute_dtype``: the role's ``fsdp_config.compute_dtype``;
    an fp32 master copy computing in bf16, say) or names a ``param_dtype`` itself."""
    if gradient_checkpointing:
        enable_activation_checkpointing(model)
    held = {param.dtype for param in model.parameters()}  # two under LoRA: frozen weights may be held narrower
    compute = getattr(torch, compute_dtype)
    policy = None
    if held != {compute} or fsdp_config.param_dtype:
        reduce = getattr(torch, fsdp_config.reduce_dtype) if fsdp_config.reduce_dtype else None
        policy = mixed_precision(compute, reduce)
    return shard_model(model, mesh, mp_policy=policy, reshard_after_forward=fsdp_config.reshard_after_forward)


def data_parallel_group(mesh: DeviceMesh) -> ProcessGroup:
    """The process group over which the batch is split: the ``dp`` dim of a 2-D mesh, or the 1-D mesh itself."""
    return mesh.get_group("dp") if mesh.ndim == 2 else mesh.get_group()


def sharded_parameters(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """``(name, DTensor)`` of every parameter, in the sharded layout: the reshard plan's sources.

    FSDP2 leaves the root's parameters gathered (plain tensors) after a forward
    without backward (``compute_log_prob``, generation); they are resharded
    first, so the plan sees the persistent sharded DTensors, which the
    optimizer updates in place.
    """
    reshard(model)
    return list(model.named_parameters())


def full_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter gathered to a full tensor (collective: call on all ranks)."""
    out = {}
    for name, param in model.named_parameters():
        out[name] = param.full_tensor() if hasattr(param, "full_tensor") else param.detach().clone()
    return out


def parameter_bytes(model: nn.Module) -> int:
    """Bytes of this rank's parameter shards (the sharded layout; under LoRA the frozen base weights are held
    in the compute dtype, the adapters in the master dtype)."""
    return sum(t.numel() * t.element_size() for t in map(dtensor.local, model.parameters()))

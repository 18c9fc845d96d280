"""The model's attention, wrapped: the kernels hybridflow owns for the calls they take, the model's own otherwise.

:func:`install` points a transformers model's config at ``hybridflow+<its
implementation>``, registered here with the same mask functions, whose
attention function sends

* a layer whose ``attention_mask`` is a :class:`~hybridflow.workers.tree_attention.TreeLayout`
  (``packing.packed_forward`` with shared prompts) to
  :func:`~hybridflow.workers.tree_attention.tree_attention`;
* a CPU decode step of plain softmax attention (the model's own is ``sdpa``
  or ``eager``) to :func:`~hybridflow.workers.decode_attention.decode_attention`;
* every other call to the model's own implementation, unchanged;

and on a CPU computes each call of several queries a row in fp32 when its inputs are bf16 or fp16 (the output
in their dtype).

The training workers install it through ``probe_packing`` (which checks
that trees reproduce the model's own outputs, and uninstalls it if not); the
built-in rollout engine installs it on its model.
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from hybridflow.workers import decode_attention as decode
from hybridflow.workers.tree_attention import TreeLayout, tree_attention

__all__ = ["PREFIX", "install", "uninstall"]

PREFIX = "hybridflow+"
"""Registered implementation names are this prefix and the wrapped implementation's name."""

PLAIN = ("sdpa", "eager")
"""Implementations that compute plain scaled softmax attention, as the decode kernel does."""

HALF = (torch.bfloat16, torch.float16)
"""Dtypes whose attention a CPU computes in fp32."""


def _wrapping(implementation: str):
    """The attention function registered as ``hybridflow+<implementation>``."""

    def attention(
        module: nn.Module,
        query,
        key,
        value,
        attention_mask,
        dropout: float = 0.0,
        scaling: float | None = None,
        **kwargs,
    ):
        dtype = query.dtype
        if query.device.type != "cpu" or dtype not in HALF or query.shape[2] == 1:
            return dispatch(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
        # A CPU's fused attention kernel runs bf16 at about half its fp32 speed (bench/bench_attention.py): blocks of
        # queries (training, prefill) compute in fp32, as the kernel accumulates anyway. A decode step does not:
        # its two products are as fast in bf16, and widening the whole cache at every token would cost more.
        if isinstance(attention_mask, torch.Tensor) and attention_mask.is_floating_point():
            attention_mask = attention_mask.float()
        query, key, value = query.float(), key.float(), value.float()
        out, weights = dispatch(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
        return out.to(dtype), weights

    def dispatch(module, query, key, value, attention_mask, dropout, scaling, **kwargs):
        if isinstance(attention_mask, TreeLayout):
            if kwargs.get("sliding_window") is not None:
                raise NotImplementedError("tree attention has no sliding window")
            return tree_attention(query, key, value, attention_mask, scaling=scaling, dropout=dropout), None
        if implementation in PLAIN and decode.takes(query, key, attention_mask, dropout):
            return decode.decode_attention(query, key, value, attention_mask, scaling), None
        own = _eager(module) if implementation == "eager" else ALL_ATTENTION_FUNCTIONS[implementation]
        return own(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)

    return attention


def _eager(module: nn.Module):
    """The eager attention of ``module``'s modeling file: transformers registers none, each model defines its own."""
    return sys.modules[type(module).__module__].eager_attention_forward


def install(model: nn.Module) -> None:
    """Point ``model``'s attention at ``hybridflow+<its implementation>`` (registered on first use); idempotent.

    Raises ``ValueError`` for a model whose attention implementation is not in transformers' registry (nothing to
    delegate to)."""
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation is not None and implementation.startswith(PREFIX):
        return
    if implementation != "eager" and implementation not in ALL_ATTENTION_FUNCTIONS:
        raise ValueError(f"{type(model).__name__}'s attention {implementation!r} is not in transformers' registry")
    name = PREFIX + implementation
    if name not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(name, _wrapping(implementation))
        if implementation in ALL_MASK_ATTENTION_FUNCTIONS:
            AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[implementation])
    model.config._attn_implementation = name


def uninstall(model: nn.Module) -> None:
    """Give ``model`` back the attention implementation :func:`install` wrapped."""
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation is not None and implementation.startswith(PREFIX):
        model.config._attn_implementation = implementation[len(PREFIX) :]

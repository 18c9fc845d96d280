"""Which block of each weight a rollout tensor-parallel rank holds (HF Qwen2 / Llama layout).

Megatron-style split of a decoder over ``q`` ranks:

====================================  ==========  ==============================================
parameter                             split dim   block of rank ``t``
====================================  ==========  ==============================================
``embed_tokens.weight``, ``lm_head``  0 (vocab)   rows ``[t*V/q, (t+1)*V/q)`` (uneven V: ceil-sized blocks,
                                                  the last shorter)
``q_proj.weight`` / ``.bias``         0           query heads ``[t*H/q, (t+1)*H/q)``, ``head_dim`` rows each
``k_proj`` / ``v_proj``               0           KV heads ``[t*K/q, (t+1)*K/q)`` when ``q`` divides K;
                                                  when K divides ``q`` (fewer KV heads than ranks) KV head
                                                  ``t // (q/K)``, replicated over ``q/K`` ranks
``o_proj.weight``                     1           the input columns of this rank's query heads
``gate_proj`` / ``up_proj``           0           intermediate rows ``[t*I/q, (t+1)*I/q)``
``down_proj.weight``                  1           the same intermediate columns
anything else (norms, biases of row-  none        the whole tensor
parallel layers)
====================================  ==========  ==============================================

Query heads must divide over ``q``; so must the intermediate size. Row-parallel
outputs are summed over the tp group (all-reduce) and their biases added once,
after the sum.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridflow.core.reshard import TensorSlice

if TYPE_CHECKING:  # the config check imports this module: no transformers until a model's config is read
    from transformers import PretrainedConfig

__all__ = ["check_tp_size", "rollout_slice"]

_COLUMN = ("gate_proj", "up_proj")
_ROW = ("o_proj", "down_proj")
_VOCAB = ("embed_tokens", "lm_head")


def _dims(config: PretrainedConfig) -> tuple[int, int, int, int]:
    text = config.get_text_config(decoder=True)
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return heads, kv_heads, head_dim, text.intermediate_size


def check_tp_size(config: PretrainedConfig, tp_size: int) -> None:
    """Raise ``ValueError`` (saying which size does not divide) when ``tp_size`` cannot split this model."""
    heads, kv_heads, _, intermediate = _dims(config)
    problems = []
    if tp_size < 1:
        problems.append(f"tensor_model_parallel_size must be >= 1, got {tp_size}")
    else:
        if heads % tp_size:
            problems.append(f"num_attention_heads={heads} is not divisible by {tp_size}")
        if kv_heads % tp_size and tp_size % kv_heads:
            problems.append(f"num_key_value_heads={kv_heads} neither divides nor is divisible by {tp_size}")
        if intermediate % tp_size:
            problems.append(f"intermediate_size={intermediate} is not divisible by {tp_size}")
    if problems:
        raise ValueError("rollout tensor parallelism cannot split this model: " + "; ".join(problems))


def _even_block(size: int, tp_rank: int, tp_size: int) -> tuple[int, int]:
    step = -(-size // tp_size)  # ceil: uneven sizes give the last rank the short block
    return min(tp_rank * step, size), min((tp_rank + 1) * step, size)


def rollout_slice(
    name: str, full_shape: tuple[int, ...], config: PretrainedConfig, tp_rank: int, tp_size: int
) -> TensorSlice:
    """The block of parameter ``name`` (full shape ``full_shape``) held by rollout tp rank ``tp_rank`` of
    ``tp_size``."""
    if tp_size == 1:
        return TensorSlice.full()
    heads, kv_heads, head_dim, _ = _dims(config)
    parts = name.split(".")
    module, kind = (parts[-2], parts[-1]) if len(parts) >= 2 else ("", parts[-1])
    if module in _VOCAB:
        return TensorSlice(0, *_even_block(full_shape[0], tp_rank, tp_size))
    if module == "q_proj":
        per = heads // tp_size
        return TensorSlice(0, tp_rank * per * head_dim, (tp_rank + 1) * per * head_dim)
    if module in ("k_proj", "v_proj"):
        if kv_heads % tp_size == 0:
            per = kv_heads // tp_size
            return TensorSlice(0, tp_rank * per * head_dim, (tp_rank + 1) * per * head_dim)
        head = tp_rank // (tp_size // kv_heads)
        return TensorSlice(0, head * head_dim, (head + 1) * head_dim)
    if module in _COLUMN:
        return TensorSlice(0, *_even_block(full_shape[0], tp_rank, tp_size))
    if module in _ROW and kind == "weight":
        if module == "o_proj":
            per = heads // tp_size
            return TensorSlice(1, tp_rank * per * head_dim, (tp_rank + 1) * per * head_dim)
        return TensorSlice(1, *_even_block(full_shape[1], tp_rank, tp_size))
    return TensorSlice.full()


def tp_size_problems(model_path: str, sizes: dict[str, int]) -> list[str]:
    """For each config key whose tensor-parallel size is above 1, why the model at ``model_path`` (a directory
    or ``builtin:<name>``) cannot be split that way; reads only the model's config, and only when asked."""
    if max(sizes.values(), default=1) <= 1:
        return []
    from hybridflow.workers.models import load_model_config  # noqa: PLC0415 - transformers' config reader

    model_config = load_model_config(model_path)
    problems = []
    for key, size in sizes.items():
        try:
            check_tp_size(model_config, size)
        except ValueError as err:
            problems.append(f"{key}={size}: {err}")
    return problems

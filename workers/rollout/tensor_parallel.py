"""A rollout model split Megatron-style over a tensor-parallel group (HF Qwen2 / Llama).

Which block of each weight a rank holds is :mod:`hybridflow.workers.rollout.tp_plan`;
this module builds the model that holds exactly those blocks and runs it::

    ids --VocabParallelEmbedding (local vocab rows, zeros elsewhere; all-reduce)--> h
    per decoder layer (norms replicated):
        h --Column q/k/v (this rank's heads)--> attention over local heads --Row o_proj (all-reduce)--> +h
        h --Column gate/up (local intermediate)--> act * up --Row down_proj (all-reduce)--> +h
    h --ParallelLMHead (local vocab logits; all-gather)--> full-vocab logits on every rank

Every rank of a group ends each layer with the same hidden states and the same
full logits, so the sampler (seeded alike) makes the same choices everywhere:
:class:`~hybridflow.workers.rollout.engine.BuiltinEngine` runs the model unchanged.

The parallel layers keep their local shard as plain ``nn.Parameter`` named
``weight`` / ``bias`` (not DTensor: its per-op dispatch costs too much in a CPU
decode loop), so ``model.named_parameters()`` keeps the HF names and each
parameter has the shape ``rollout_slice(name, ...).shape(full_shape)``; the
train-to-rollout reshard writes into those parameters in place. The layers are
for inference: c10d collectives do not carry gradients.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from hybridflow.core.reshard import TensorSlice
from hybridflow.workers.rollout.tp_plan import check_tp_size, rollout_slice

__all__ = [
    "ColumnParallelLinear",
    "ParallelLMHead",
    "RowParallelLinear",
    "SUPPORTED_MODEL_TYPES",
    "VocabParallelEmbedding",
    "build_tp_rollout_model",
    "load_full_weights",
]

SUPPORTED_MODEL_TYPES = ("qwen2", "llama")
"""``config.model_type`` values whose module names and attention code the split below matches."""

_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
_ROW = ("o_proj", "down_proj")
_EMBED = "embed_tokens"
_LM_HEAD = "lm_head"


def _no_grad_check(x: torch.Tensor, layer: str) -> None:
    if x.requires_grad and torch.is_grad_enabled():
        raise RuntimeError(f"{layer} is inference-only (its collectives carry no gradient); run it under no_grad")


class ColumnParallelLinear(nn.Linear):
    """``y_local = x W_local^T + b_local``: an ``nn.Linear`` holding this rank's rows of W (output
    features); no communication."""


class RowParallelLinear(nn.Linear):
    """``y = sum over the group of x_local W_local^T, + b``: an ``nn.Linear`` holding this rank's
    columns of W (input features).

    The input is the rank's slice of the features (the output of a column-parallel
    layer); partial products are all-reduced and the bias, replicated, is added
    once after the sum.
    """

    def __init__(
        self, local_in_features: int, out_features: int, bias: bool, tp_group: dist.ProcessGroup, *,
        dtype: torch.dtype, device=None,
    ) -> None:  # fmt: skip
        super().__init__(local_in_features, out_features, bias, device=device, dtype=dtype)
        self.tp_group = tp_group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _no_grad_check(x, "RowParallelLinear")
        y = F.linear(x, self.weight)
        dist.all_reduce(y, group=self.tp_group)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Embedding rows ``[vocab_start, vocab_stop)`` of the full table; ids outside give zeros, summed over the group."""

    def __init__(
        self,
        vocab_start: int,
        vocab_stop: int,
        embedding_dim: int,
        tp_group: dist.ProcessGroup,
        *,
        dtype: torch.dtype,
        device=None,
    ) -> None:
        super().__init__()
        self.vocab_start, self.vocab_stop, self.embedding_dim = vocab_start, vocab_stop, embedding_dim
        self.tp_group = tp_group
        self.weight = nn.Parameter(torch.empty(vocab_stop - vocab_start, embedding_dim, dtype=dtype, device=device))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        outside = (input_ids < self.vocab_start) | (input_ids >= self.vocab_stop)
        if self.weight.shape[0] == 0:  # a tiny vocab over many ranks can leave a rank no rows
            out = self.weight.new_zeros((*input_ids.shape, self.embedding_dim))
        else:
            local = (input_ids - self.vocab_start).masked_fill(outside, 0)
            out = F.embedding(local, self.weight).masked_fill_(outside.unsqueeze(-1), 0)
        _no_grad_check(out, "VocabParallelEmbedding")
        dist.all_reduce(out, group=self.tp_group)
        return out

    def extra_repr(self) -> str:
        return f"vocab=[{self.vocab_start}, {self.vocab_stop}), embedding_dim={self.embedding_dim}"


class ParallelLMHead(nn.Module):
    """Logits of this rank's vocab rows, all-gathered so every rank returns the full-vocab logits.

    ``blocks`` are the ``(start, stop)`` vocab rows of every rank of the group, in
    rank order and contiguous (uneven vocabularies give unequal blocks: the local
    logits are padded to the largest block for the gather and the padding dropped).
    """

    def __init__(
        self,
        in_features: int,
        blocks: list[tuple[int, int]],
        tp_rank: int,
        tp_group: dist.ProcessGroup,
        *,
        dtype: torch.dtype,
        device=None,
    ) -> None:
        super().__init__()
        for (_, stop), (start, _) in zip(blocks, blocks[1:]):
            if start != stop:
                raise ValueError(f"vocab blocks must be contiguous and in rank order, got {blocks}")
        self.in_features, self.blocks, self.tp_rank, self.tp_group = in_features, blocks, tp_rank, tp_group
        self.vocab_start, self.vocab_stop = blocks[tp_rank]
        self._widest = max(stop - start for start, stop in blocks)
        rows = self.vocab_stop - self.vocab_start
        self.weight = nn.Parameter(torch.empty(rows, in_features, dtype=dtype, device=device))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        _no_grad_check(hidden_states, "ParallelLMHead")
        local = F.linear(hidden_states, self.weight)
        if local.shape[-1] < self._widest:
            local = F.pad(local, (0, self._widest - local.shape[-1]))
        gathered = [torch.empty_like(local) for _ in self.blocks]
        dist.all_gather(gathered, local.contiguous(), group=self.tp_group)
        return torch.cat([part[..., : stop - start] for part, (start, stop) in zip(gathered, self.blocks)], dim=-1)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, vocab=[{self.vocab_start}, {self.vocab_stop}) of {self.blocks[-1][1]}"


# ------------------------------------------------------------------ building
def _check_group(tp_group: dist.ProcessGroup | None, tp_rank: int, tp_size: int) -> None:
    if tp_size == 1:
        return
    if tp_group is None:
        raise ValueError(f"tp_size={tp_size} needs a tp process group (got None); only tp_size=1 runs without one")
    size, rank = dist.get_world_size(tp_group), dist.get_rank(tp_group)
    if (size, rank) != (tp_size, tp_rank):
        raise ValueError(
            f"tp_group has {size} ranks and this process is its rank {rank}, but tp_size={tp_size}, tp_rank={tp_rank}"
        )


def _split(name: str, full_shape: tuple[int, ...], config, tp_rank: int, tp_size: int, dim: int) -> TensorSlice:
    """The plan's block of ``name``, checked to split along ``dim`` (the dimension the parallel layer assumes)."""
    block = rollout_slice(name, full_shape, config, tp_rank, tp_size)
    if block.dim != dim:
        raise ValueError(f"the rollout tp plan splits {name} along dim {block.dim}; its parallel layer needs dim {dim}")
    return block


def _parallel_layer(name: str, module: nn.Module, config, tp_group, tp_rank: int, tp_size: int) -> nn.Module | None:
    """The parallel replacement of ``module`` (on the meta device), or None when it stays replicated."""
    leaf = name.rsplit(".", 1)[-1]
    if isinstance(module, nn.Linear) and leaf in _COLUMN:
        rows = _split(f"{name}.weight", tuple(module.weight.shape), config, tp_rank, tp_size, 0)
        local = rows.stop - rows.start
        if module.bias is not None:
            _split(f"{name}.bias", tuple(module.bias.shape), config, tp_rank, tp_size, 0)
        return ColumnParallelLinear(
            module.in_features, local, module.bias is not None, dtype=module.weight.dtype, device="meta"
        )
    if isinstance(module, nn.Linear) and leaf in _ROW:
        cols = _split(f"{name}.weight", tuple(module.weight.shape), config, tp_rank, tp_size, 1)
        return RowParallelLinear(
            cols.stop - cols.start, module.out_features, module.bias is not None, tp_group,
            dtype=module.weight.dtype, device="meta",
        )  # fmt: skip
    if isinstance(module, nn.Embedding) and leaf == _EMBED:
        rows = _split(f"{name}.weight", tuple(module.weight.shape), config, tp_rank, tp_size, 0)
        return VocabParallelEmbedding(
            rows.start, rows.stop, module.embedding_dim, tp_group, dtype=module.weight.dtype, device="meta"
        )
    if isinstance(module, nn.Linear) and leaf == _LM_HEAD:
        if module.bias is not None:
            raise ValueError(f"{name} has a bias; the vocab-parallel LM head supports none")
        shape = tuple(module.weight.shape)
        blocks = [_split(f"{name}.weight", shape, config, r, tp_size, 0) for r in range(tp_size)]
        return ParallelLMHead(
            module.in_features, [(b.start, b.stop) for b in blocks], tp_rank, tp_group,
            dtype=module.weight.dtype, device="meta",
        )  # fmt: skip
    if isinstance(module, (nn.Linear, nn.Embedding)):
        raise ValueError(f"{name} ({type(module).__name__}) is not in the rollout tp plan; it cannot stay replicated")
    return None


def _localize_attention(model: nn.Module, config, tp_size: int) -> None:
    """Per-layer head counts the HF attention reads (``num_key_value_groups`` drives GQA in eager/sdpa)."""
    text = config.get_text_config(decoder=True)
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    local_heads = heads // tp_size
    local_kv = kv_heads // tp_size if kv_heads % tp_size == 0 else 1  # else one replicated KV head
    for module in model.modules():
        if hasattr(module, "num_key_value_groups"):
            module.num_key_value_groups = local_heads // local_kv
            # Older transformers releases keep head counts on the module and reshape with them.
            if hasattr(module, "num_heads"):
                module.num_heads = local_heads
            if hasattr(module, "num_key_value_heads"):
                module.num_key_value_heads = local_kv


def _rebuild_buffers(model: nn.Module, device: torch.device) -> None:
    """Recompute what ``to_empty`` left uninitialised: non-persistent buffers (the rotary ``inv_freq``).

    They are computed in the owning module's ``__init__``, so the module is built
    again on ``device``; a buffer in any other module would stay garbage, so it is refused.
    """
    owners = [(name, m) for name, m in model.named_modules() if any(True for _ in m.buffers(recurse=False))]
    for name, module in owners:
        if not hasattr(module, "inv_freq") or not hasattr(module, "config"):
            buffers = [n for n, _ in module.named_buffers(recurse=False)]
            raise NotImplementedError(f"cannot recompute buffers {buffers} of {name} after building on the meta device")
        with torch.device(device):
            fresh = type(module)(config=module.config)
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, leaf, fresh)


def build_tp_rollout_model(
    config_or_model: PretrainedConfig | PreTrainedModel,
    tp_group: dist.ProcessGroup | None,
    tp_rank: int,
    tp_size: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> PreTrainedModel:
    """Build this rank's shard of the rollout model: an HF causal LM holding only its tp blocks.

    Called once per rollout worker when it starts; weights are written afterwards
    (:func:`load_full_weights`, or the train-to-rollout reshard writing into
    ``model.named_parameters()`` in place; the parameter objects never change).

    :param config_or_model: an HF config of a supported family (:data:`SUPPORTED_MODEL_TYPES`),
        or a model whose config and generation config are used (its weights are not copied).
    :param tp_group: the process group of the ``tp_size`` ranks sharing this model (gloo on
        CPU, nccl on CUDA); None is allowed only for ``tp_size == 1``.
    :param tp_rank: this process's rank in ``tp_group``.
    :param dtype: parameter dtype.
    :param device: where the shard lives (CPU for gloo groups, this rank's GPU for nccl).
    :returns: the model in eval mode, parameters zero (load weights before use), rotary
        buffers computed. With ``tp_size == 1`` it is the plain HF model (no collectives).
    :raises ValueError: when ``tp_size`` cannot split the model (:func:`check_tp_size`'s
        message), the family is not supported or the group does not match ``tp_rank``/``tp_size``.
    """
    model_given = isinstance(config_or_model, PreTrainedModel)
    config = config_or_model.config if model_given else config_or_model
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"rollout tensor parallelism supports model types {SUPPORTED_MODEL_TYPES}, got {config.model_type!r}"
        )
    check_tp_size(config, tp_size)
    _check_group(tp_group, tp_rank, tp_size)
    device = torch.device(device)

    # 1. The HF skeleton on the meta device: no memory for the full weights.
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    # 2. Swap in the parallel layers (sizes from the plan), remembering the tied pair.
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    if tp_size > 1:
        for name, module in list(model.named_modules()):
            layer = _parallel_layer(name, module, config, tp_group, tp_rank, tp_size)
            if layer is not None:
                parent, _, leaf = name.rpartition(".")
                setattr(model.get_submodule(parent), leaf, layer)
        _localize_attention(model, config, tp_size)
    # 3. Materialize only the local shards; to_empty gives each module its own tensor,
    #    so the tied LM head is re-pointed at the embedding (the same local vocab block).
    model.to_empty(device=device)
    if tied:
        model.get_output_embeddings().weight = model.get_input_embeddings().weight
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
    _rebuild_buffers(model, device)
    if model_given:
        model.generation_config = copy.deepcopy(config_or_model.generation_config)
    return model.eval()


def load_full_weights(
    model: PreTrainedModel, full_state: Mapping[str, torch.Tensor], tp_rank: int, tp_size: int
) -> None:
    """Copy this rank's block of every full weight into ``model``'s parameters, in place.

    Used by tests and single-rank paths; the parameter objects stay the same, so an
    engine holding the model sees the new weights.

    :param full_state: full (unsplit) tensors by HF name, e.g. a full model's
        ``state_dict()``; a tied LM head may be present or absent.
    :raises KeyError: when a parameter has no full weight or a name matches no parameter.
    :raises ValueError: when a block's shape differs from the local parameter's.
    """
    params = dict(model.named_parameters(remove_duplicate=False))
    unknown = sorted(set(full_state) - set(params))
    if unknown:
        raise KeyError(f"full_state has weights the rollout model does not: {unknown}")
    written: set[int] = set()
    with torch.no_grad():
        for name, param in params.items():
            if name not in full_state:
                continue
            full = full_state[name]
            block = rollout_slice(name, tuple(full.shape), model.config, tp_rank, tp_size).take(full)
            if block.shape != param.shape:
                raise ValueError(
                    f"{name}: block {tuple(block.shape)} of the full weight does not fit {tuple(param.shape)}"
                )
            param.copy_(block)
            written.add(id(param))
    missing = sorted(name for name, param in params.items() if id(param) not in written)
    if missing:
        raise KeyError(f"full_state has no weight for {missing}")

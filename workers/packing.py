"""Padding-free (packed) forward passes: the rows' real tokens laid end to end.

A batch holds left-padded prompts followed by right-padded responses, so each
row's real tokens (``attention_mask == 1``) are one contiguous run whose
position ids count 0, 1, ... from its first real token. :func:`pack` drops the
pads and lays the runs end to end, first-fit longest first, into packed rows
of ``C`` slots, ``C`` the longest run (or into a single row, ``one_row``)::

    padded, B=3 rows of P=3 prompt + T=3 response columns (_ is a pad)
        row 0:   _  a  b | c  _  _       positions   .  0  1 | 2  .  .
        row 1:   e  f  g | h  i  j                   0  1  2 | 3  4  5
        row 2:   _  _  k | l  _  _                   .  .  0 | 1  .  .
    packed, R=2 rows of C=6 slots (~ is a row's tail: a sequence of its own, its outputs unused)
        row 0:   e  f  g  h  i  j        positions   0  1  2  3  4  5
        row 1:   a  b  c  k  l  ~                    0  1  2  0  1  0
    logit_index, flat in R x C: 7 | 2 3 4 | 9    (the slots whose outputs predict c | h i j | l)

The model is called with ``attention_mask=None``, no cache and these position
ids. transformers 5 reads a position that does not continue its predecessor as
the start of a new sequence (``masking_utils.find_packed_sequence_indices``,
per packed row) and builds a block-diagonal causal mask for sdpa, eager and
flex attention, so no sequence attends to another. Packed rows of the longest
run's length keep the attention cost (rows x C^2) at most the padded batch's,
where one row of all N tokens would cost N^2 under a mask. Flash attention
reads packed sequences from the position ids of a single row only (its
varlen path, linear in N): it gets ``one_row``.

:func:`probe_packing` finds which layout a model confines, by running it: an
attention implementation without a mask function (a custom one) would
silently attend across sequences, and is refused.

The output at a packed slot (logits of an LM, the value head of the critic)
belongs to the token after it, the first response token's to the prompt's
last token; ``logit_index`` lists those slots for every real response token,
row by row of the batch, and :func:`unpack` scatters per-token results back to
the ``(B, T)`` response layout, zero at the pads.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn

from hybridflow.core import DataProto
from hybridflow.core.keys import ATTENTION_MASK, INPUT_IDS, POSITION_IDS, RESPONSES

__all__ = ["PackedBatch", "Packing", "pack", "packed_forward", "probe_packing", "unpack"]


@dataclass(frozen=True)
class Packing:
    """How a model's forwards are packed: rows of the longest sequence's length, or everything in ``one_row``."""

    one_row: bool = False


@dataclass(frozen=True)
class PackedBatch:
    """A padded batch's real tokens, packed (layout: the module docstring)."""

    input_ids: torch.Tensor
    """(R, C) the rows' real tokens, end to end; each packed row ends in a tail of filler."""
    position_ids: torch.Tensor
    """(R, C) the batch's position ids at those tokens (0 at each sequence's first); the tail counts from 0."""
    logit_index: torch.Tensor
    """(M,) for each real response token, row by row of the batch: the flat slot (of R x C) whose output
    predicts (scores) it."""
    response_tokens: torch.Tensor
    """(M,) those response tokens' ids."""
    response_keep: torch.Tensor
    """(B, T) bool: where the M real response tokens sit in the response columns."""


def pack(batch: DataProto, packing: Packing = Packing()) -> PackedBatch:
    """Remove the pads of ``batch`` (input_ids, attention_mask, position_ids, responses) into packed rows.

    Raises ``ValueError`` unless each row's real tokens are contiguous, start
    at position 0 and count up by one, and each row has a real prompt token
    before its response: the layout packing relies on.
    """
    keep = batch.batch[ATTENTION_MASK].bool()
    positions = batch.batch[POSITION_IDS]
    responses = batch.batch[RESPONSES]
    length = responses.shape[1]
    rank_in_row = keep.long().cumsum(-1) - 1  # 0, 1, ... along each row's real tokens
    real_positions = positions[keep]
    if not torch.equal(real_positions, rank_in_row[keep]):
        raise ValueError(
            "packing needs each row's real tokens (attention_mask == 1) to be contiguous with position ids "
            "0, 1, 2, ... from the row's first real token; this batch's are not (use_remove_padding=false pads instead)"
        )
    if bool((rank_in_row[:, -length:][keep[:, -length:]] == 0).any()):
        raise ValueError("packing needs a real prompt token before every response (a row's first real token "
                         "is a response token)")
    lengths = keep.sum(-1)
    bins, offsets, capacity = _fill_rows(lengths.tolist(), packing.one_row)
    start = torch.tensor(bins, device=keep.device) * capacity + torch.tensor(offsets, device=keep.device)
    slot = start[:, None] + rank_in_row  # (B, L): the flat packed slot of each real token
    fill = torch.zeros(max(bins) + 1, dtype=torch.long, device=keep.device).index_add_(0, start.new_tensor(bins), lengths)
    tail = torch.arange(capacity, device=keep.device) - fill[:, None]  # position ids of each row's tail: 0, 1, ...
    input_ids = torch.zeros(tail.numel(), dtype=batch.batch[INPUT_IDS].dtype, device=keep.device)
    input_ids[slot[keep]] = batch.batch[INPUT_IDS][keep]
    position_ids = tail.flatten().clamp(min=0)
    position_ids[slot[keep]] = real_positions
    response_keep = keep[:, -length:]
    return PackedBatch(
        input_ids=input_ids.view(tail.shape),
        position_ids=position_ids.view(tail.shape),
        logit_index=slot[:, -length:][response_keep] - 1,  # a response token is predicted one slot before it
        response_tokens=responses[response_keep],
        response_keep=response_keep,
    )


def _fill_rows(lengths: list[int], one_row: bool) -> tuple[list[int], list[int], int]:
    """Each sequence's packed row and offset there, first fit, longest first, and the rows' capacity."""
    capacity = sum(lengths) if one_row else max(lengths)
    bins, offsets, used = [0] * len(lengths), [0] * len(lengths), []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        row = next((r for r, n in enumerate(used) if n + lengths[i] <= capacity), len(used))
        if row == len(used):
            used.append(0)
        bins[i], offsets[i] = row, used[row]
        used[row] += lengths[i]
    return bins, offsets, capacity


def unpack(values: torch.Tensor, packed: PackedBatch) -> torch.Tensor:
    """(M,) per response token -> (B, T), zero where ``packed.response_keep`` is False (differentiable)."""
    out = values.new_zeros(packed.response_keep.shape)
    return out.masked_scatter(packed.response_keep, values)


def packed_forward(model: nn.Module, packed: PackedBatch) -> torch.Tensor:
    """The model's output (logits, or the critic's values) at ``packed.logit_index``: (M, V) or (M, 1).

    A causal LM whose forward takes ``logits_to_keep`` (HF's; Qwen2, Llama, ...)
    projects only those slots onto the vocabulary; other models compute every
    slot and the response slots are picked out.
    """
    kwargs = dict(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None, use_cache=False)
    if "logits_to_keep" not in inspect.signature(model.forward).parameters:
        return model(**kwargs).logits.flatten(0, 1)[packed.logit_index]
    wanted = torch.zeros(packed.input_ids.numel(), dtype=torch.bool, device=packed.input_ids.device)
    wanted[packed.logit_index] = True
    logits = model(**kwargs, logits_to_keep=wanted.view(packed.input_ids.shape)).logits  # (M, V) in slot order
    return logits[torch.argsort(torch.argsort(packed.logit_index))]  # in logit_index order


@torch.no_grad()
def probe_packing(model: nn.Module) -> Packing:
    """The packing ``model`` confines: rows of several sequences if its attention keeps them apart, else one
    row; ``ValueError`` if neither.

    Two packed inputs that differ only in one sequence must give the others the
    same outputs. An attention implementation that builds no block-diagonal
    mask from the position ids fails this; with the mask, the other sequence's
    keys get exactly zero weight, so the outputs agree to rounding whatever the
    dtype. Runs four tiny forwards at most: under FSDP (each a collective)
    every rank must call it, as the workers do when they build the model.
    """
    for packing in (Packing(one_row=False), Packing(one_row=True)):
        if _confines(model, rows=1 if packing.one_row else 2):
            return packing
    implementation = getattr(model.config, "_attn_implementation", None)
    raise ValueError(
        f"{type(model).__name__} with attention {implementation!r} attends across packed sequences (it builds "
        "no block-diagonal mask from restarting position ids); set actor_rollout_ref.model.use_remove_padding=false "
        "to run padded batches"
    )


def _confines(model: nn.Module, rows: int) -> bool:
    """Whether ``rows`` packed rows, each of two sequences (3 and 2 tokens), keep the second from the first."""
    vocab = model.config.get_text_config().vocab_size
    device = next(model.parameters()).device
    positions = torch.tensor([[0, 1, 2, 0, 1]] * rows, device=device)
    first = torch.tensor([[1, 2, 3, 4, 5], [5, 3, 1, 2, 4]][:rows], device=device) % vocab
    other = first.clone()
    other[:, :3] = (first[:, :3] + 5) % vocab  # only the first sequence of each row differs
    training = model.training
    model.eval()
    try:
        a, b = (model(input_ids=ids, position_ids=positions, attention_mask=None, use_cache=False).logits[:, 3:].float()
                for ids in (first, other))
    finally:
        model.train(training)
    return torch.allclose(a, b, rtol=1e-3, atol=1e-3 * float(a.abs().max()) + 1e-6)

"""Padding-free (packed) forward passes: the rows' real tokens laid end to end.

A batch holds left-padded prompts followed by right-padded responses, so each
row's real tokens (``attention_mask == 1``) are one contiguous run whose
position ids count 0, 1, ... from its first real token. :func:`pack` drops the
pads, and each row's last response token (its output would score the token
after the response: nothing reads it), and lays the runs end to end, first-fit
longest first, into packed rows of ``C`` slots, ``C`` the longest run (or into
a single row, ``one_row``)::

    padded, B=3 rows of P=3 prompt + T=3 response columns (_ is a pad)
        row 0:   _  a  b | c  _  _       positions   .  0  1 | 2  .  .
        row 1:   e  f  g | h  i  j                   0  1  2 | 3  4  5
        row 2:   _  _  k | l  _  _                   .  .  0 | 1  .  .
    packed, R=2 rows of C=5 slots (~ is a row's tail: a sequence of its own, its outputs unused)
        row 0:   e  f  g  h  i           positions   0  1  2  3  4
        row 1:   a  b  k  ~  ~                       0  1  0  0  1
    logit_index, flat in R x C: 6 | 2 3 4 | 7    (the slots whose outputs predict c | h i j | l)

The model is called with ``attention_mask=None``, no cache and these position
ids. transformers 5 reads a position that does not continue its predecessor as
the start of a new sequence (``masking_utils.find_packed_sequence_indices``,
per packed row) and builds a block-diagonal causal mask for sdpa, eager and
flex attention, so no sequence attends to another. Packed rows of the longest
run's length keep the attention cost (rows x C^2) at most the padded batch's,
where one row of all N tokens would cost N^2 under a mask. Flash attention
reads packed sequences from the position ids of a single row only (its
varlen path, linear in N): it gets ``one_row``.

With ``share_prompts``, rows whose prompts are the same tokens (the ``n``
samples of one prompt) form one unit, a prefix tree: the prompt once, then
each row's response, every response at the position ids it has in its own
row. All units go end to end into one packed row (no filler), and the
model's attention runs :func:`~hybridflow.workers.tree_attention.tree_attention`
(:mod:`~hybridflow.workers.attention` wraps it), which lets each response see
the prompt and itself only and computes no other pair, so each response gets
what its own row computes, and the
prompt's tokens are computed once instead of ``n`` times (their gradient sums
the responses' contributions, as the rows' copies would)::

    rows 0 and 1 share the prompt a b:   row 0: a b | c d e     row 1: a b | f g _
    one unit:   a  b  c  d  f        positions  0  1  2  3  2
    attends to: a: a   b: a b   c: a b c   d: a b c d   f: a b f
    logit_index: 1 2 3 | 1 4   (b predicts c and f; c, d predict d, e; f predicts g)

:func:`probe_packing` finds which layout a model confines, by running it: an
attention implementation without a mask function (a custom one) would
silently attend across sequences, and is refused; one whose outputs tree
attention does not reproduce (other attention math) packs without sharing.

The output at a packed slot (logits of an LM, the value head of the critic)
belongs to the token after it, the first response token's to the prompt's
last token; ``logit_index`` lists those slots for every real response token,
row by row of the batch, and :func:`unpack` scatters per-token results back to
the ``(B, T)`` response layout, zero at the pads.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from hybridflow.core import DataProto
from hybridflow.core.keys import ATTENTION_MASK, INPUT_IDS, POSITION_IDS, RESPONSES
from hybridflow.workers import attention
from hybridflow.workers.tree_attention import TreeLayout, tree_layout

__all__ = ["PackedBatch", "Packing", "pack", "packed_forward", "probe_packing", "unpack"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Packing:
    """How a model's forwards are packed: rows of the longest sequence's length, or everything in ``one_row``;
    with ``share_prompts`` the rows of one prompt as one prefix tree (the module docstring)."""

    one_row: bool = False
    share_prompts: bool = False


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
    tree: TreeLayout | None = None
    """``share_prompts``: where the prefix trees sit in the one packed row (:mod:`~hybridflow.workers.tree_attention`
    attends by it); None: the model's own mask from the position ids."""


def pack(batch: DataProto, packing: Packing = Packing()) -> PackedBatch:
    """Remove the pads of ``batch`` (input_ids, attention_mask, position_ids, responses) into packed rows.

    Raises ``ValueError`` unless each row's real tokens are contiguous, start
    at position 0 and count up by one, and each row has a real prompt token
    before its response: the layout packing relies on.
    """
    real = batch.batch[ATTENTION_MASK].bool()
    positions = batch.batch[POSITION_IDS]
    responses = batch.batch[RESPONSES]
    length = responses.shape[1]
    rank_in_row = real.long().cumsum(-1) - 1  # 0, 1, ... along each row's real tokens
    if not torch.equal(positions[real], rank_in_row[real]):
        raise ValueError(
            "packing needs each row's real tokens (attention_mask == 1) to be contiguous with position ids "
            "0, 1, 2, ... from the row's first real token; this batch's are not (use_remove_padding=false pads instead)"
        )
    response_keep = real[:, -length:]
    if bool((rank_in_row[:, -length:][response_keep] == 0).any()):
        raise ValueError(
            "packing needs a real prompt token before every response (a row's first real token is a response token)"
        )
    keep = _without_last_response_token(real, response_keep)
    real_positions = positions[keep]
    prompt_keep = keep[:, :-length]
    groups = _prompt_groups(batch.batch[INPUT_IDS][:, :-length], prompt_keep, packing.share_prompts)
    prompt_lengths, lengths = prompt_keep.sum(-1).tolist(), keep.sum(-1).tolist()
    unit_of_row, before, unit_lengths = _units(groups, prompt_lengths, lengths)
    bins, offsets, capacity = _fill_rows(unit_lengths, packing.one_row or packing.share_prompts)
    tree = None
    if packing.share_prompts:
        tree = tree_layout(
            [b * capacity + o for b, o in zip(bins, offsets)],
            [prompt_lengths[members[0]] for members in groups],
            unit_of_row,
            before,
            [n - p for n, p in zip(lengths, prompt_lengths)],
            capacity,
            keep.device,
        )
    unit_of_row, before = torch.tensor(unit_of_row, device=keep.device), torch.tensor(before, device=keep.device)
    unit_start = torch.tensor(bins, device=keep.device) * capacity + torch.tensor(offsets, device=keep.device)
    is_response = torch.zeros_like(keep)
    is_response[:, -length:] = True
    # (B, L): the flat packed slot of each real token; a response token moves past the earlier members' responses
    slot = unit_start[unit_of_row][:, None] + rank_in_row + before[:, None] * is_response
    fill = torch.zeros(max(bins) + 1, dtype=torch.long, device=keep.device).index_add_(
        0, torch.tensor(bins, device=keep.device), torch.tensor(unit_lengths, device=keep.device)
    )
    tail = torch.arange(capacity, device=keep.device) - fill[:, None]  # position ids of each row's tail: 0, 1, ...
    input_ids = torch.zeros(tail.numel(), dtype=batch.batch[INPUT_IDS].dtype, device=keep.device)
    input_ids[slot[keep]] = batch.batch[INPUT_IDS][keep]  # a shared prompt's slots get the same ids from each member
    position_ids = tail.flatten().clamp(min=0)
    position_ids[slot[keep]] = real_positions
    return PackedBatch(
        input_ids=input_ids.view(tail.shape),
        position_ids=position_ids.view(tail.shape),
        logit_index=slot[:, -length - 1 : -1][response_keep],  # the slot of each response token's predecessor
        response_tokens=responses[response_keep],
        response_keep=response_keep,
        tree=tree,
    )


def _without_last_response_token(real: torch.Tensor, response_keep: torch.Tensor) -> torch.Tensor:
    """The tokens a forward computes: the real ones but each row's last response token, whose output would
    score the token after the response (nothing does: the logits and values read are its predecessors')."""
    length = response_keep.shape[1]
    has_response = response_keep.any(-1)
    last = length - 1 - response_keep.flip(-1).long().argmax(-1)  # the last real response column
    keep = real.clone()
    rows = has_response.nonzero().squeeze(-1)
    keep[rows, real.shape[1] - length + last[rows]] = False
    return keep


def _prompt_groups(prompts: torch.Tensor, prompt_keep: torch.Tensor, share: bool) -> list[list[int]]:
    """The rows in groups of equal prompt tokens (first appearance order), or each row alone."""
    if not share:
        return [[i] for i in range(len(prompts))]
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (ids, real) in enumerate(zip(prompts.tolist(), prompt_keep.tolist())):
        groups.setdefault(tuple(t for t, r in zip(ids, real) if r), []).append(i)
    return list(groups.values())


def _units(
    groups: list[list[int]], prompt_lengths: list[int], lengths: list[int]
) -> tuple[list[int], list[int], list[int]]:
    """A group's unit is its prompt once, then each member's response tokens (a row alone: the row itself).
    Returns each row's unit, each row's count of response tokens its unit's earlier members hold, and each
    unit's length."""
    unit_of_row, before, unit_lengths = [0] * len(lengths), [0] * len(lengths), []
    for unit, members in enumerate(groups):
        responses_so_far = 0
        for i in members:
            unit_of_row[i], before[i] = unit, responses_so_far
            responses_so_far += lengths[i] - prompt_lengths[i]
        unit_lengths.append(prompt_lengths[members[0]] + responses_so_far)
    return unit_of_row, before, unit_lengths


def _fill_rows(lengths: list[int], one_row: bool) -> tuple[list[int], list[int], int]:
    """Each unit's packed row and offset there, first fit, longest first, and the rows' capacity."""
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
    projects only the wanted columns onto the vocabulary (a shared prompt's last
    slot once, however many responses it predicts); other models compute every
    slot and the response slots are picked out. The columns go as a 1-D index,
    which every transformers release that has ``logits_to_keep`` takes (a 2-D
    mask only the newest do; vLLM's CPU build pins transformers < 5.20). With
    several packed rows a column kept for one row is projected in all of them.
    """
    kwargs = dict(
        input_ids=packed.input_ids,
        position_ids=packed.position_ids,
        use_cache=False,
        attention_mask=None if packed.tree is None else _tree_masks(model, packed.tree),
    )
    if "logits_to_keep" not in inspect.signature(model.forward).parameters:
        return model(**kwargs).logits.flatten(0, 1)[packed.logit_index]
    width = packed.input_ids.shape[1]
    row, column = packed.logit_index // width, packed.logit_index % width
    columns = torch.unique(column)  # sorted
    logits = model(**kwargs, logits_to_keep=columns).logits  # (rows, kept columns, V)
    return logits[row, torch.searchsorted(columns, column)]  # in logit_index order


def _tree_masks(model: nn.Module, tree: TreeLayout) -> dict[str, TreeLayout]:
    """The layout as every layer's prepared mask (transformers takes a dict of masks by layer type as built),
    the model's attention wrapped to run :func:`~hybridflow.workers.tree_attention.tree_attention` for it
    (:mod:`hybridflow.workers.attention`)."""
    attention.install(model)
    kinds = getattr(model.config.get_text_config(), "layer_types", None) or ["full_attention"]
    return {kind: tree for kind in set(kinds)}


@torch.no_grad()
def probe_packing(model: nn.Module, *, share_prompts: bool = False) -> Packing:
    """The packing ``model`` confines: rows of several sequences if its attention keeps them apart, else one
    row; ``ValueError`` if neither. With ``share_prompts``, prompts are shared too when tree attention
    (:mod:`~hybridflow.workers.tree_attention`, the model's attention wrapped by
    :mod:`~hybridflow.workers.attention`) gives each branch what the model's own attention computes for that
    branch alone (otherwise a warning, the model's attention back, and no sharing).

    Two packed inputs that differ only in one sequence must give the others the
    same outputs. An attention implementation that builds no block-diagonal
    mask from the position ids fails this; with the mask, the other sequence's
    keys get exactly zero weight, so the outputs agree to rounding whatever the
    dtype. Runs six tiny forwards at most: under FSDP (each a collective)
    every rank must call it, as the workers do when they build the model.
    """
    for packing in (Packing(one_row=False), Packing(one_row=True)):
        if _confines(model, rows=1 if packing.one_row else 2):
            if share_prompts and _shares_prompts(model):
                return Packing(one_row=packing.one_row, share_prompts=True)
            if share_prompts:
                attention.uninstall(model)
                logger.warning(
                    "%s with attention %r: its outputs differ from tree attention's over shared "
                    "prompts; packing without sharing them",
                    type(model).__name__,
                    _attention(model),
                )
            return packing
    raise ValueError(
        f"{type(model).__name__} with attention {_attention(model)!r} attends across packed sequences (it builds "
        "no block-diagonal mask from restarting position ids); set actor_rollout_ref.model.use_remove_padding=false "
        "to run padded batches"
    )


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """The probes' forwards in eval mode (no dropout), the model's mode restored after."""
    training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(training)


def _attention(model: nn.Module) -> str | None:
    return getattr(model.config, "_attn_implementation", None)


def _shares_prompts(model: nn.Module) -> bool:
    """Whether responses packed as prefix trees (two to one prompt, one to another) get the outputs of their own
    unpacked rows."""
    vocab = model.config.get_text_config().vocab_size
    device = next(model.parameters()).device
    rows = torch.tensor([[1, 2, 3, 4, 5], [1, 2, 3, 6, 7], [8, 9, 1, 2, 3]], device=device) % vocab
    batch = DataProto.from_dict(
        {
            INPUT_IDS: rows,
            ATTENTION_MASK: torch.ones_like(rows),
            RESPONSES: rows[:, 3:],
            POSITION_IDS: torch.arange(5, device=device).expand(3, 5),
        }
    )
    try:
        with _eval_mode(model):
            tree = packed_forward(model, pack(batch, Packing(share_prompts=True))).float()
            alone = model(input_ids=rows, position_ids=batch.batch[POSITION_IDS], use_cache=False).logits[:, 2:4]
    except Exception as error:  # a model whose attention could not be wrapped, or whose forward takes no prepared masks
        logger.info("tree attention refused: %s", error)
        return False
    alone = alone.flatten(0, 1).float()
    return torch.allclose(tree, alone, rtol=1e-3, atol=1e-3 * float(alone.abs().max()) + 1e-6)


def _confines(model: nn.Module, rows: int) -> bool:
    """Whether ``rows`` packed rows, each of two sequences (3 and 2 tokens), keep the second from the first."""
    vocab = model.config.get_text_config().vocab_size
    device = next(model.parameters()).device
    positions = torch.tensor([[0, 1, 2, 0, 1]] * rows, device=device)
    first = torch.tensor([[1, 2, 3, 4, 5], [5, 3, 1, 2, 4]][:rows], device=device) % vocab
    other = first.clone()
    other[:, :3] = (first[:, :3] + 5) % vocab  # only the first sequence of each row differs
    with _eval_mode(model):
        a, b = (
            model(input_ids=ids, position_ids=positions, attention_mask=None, use_cache=False).logits[:, 3:].float()
            for ids in (first, other)
        )
    return torch.allclose(a, b, rtol=1e-3, atol=1e-3 * float(a.abs().max()) + 1e-6)

"""Micro-batches of one rank's rows: a fixed number of rows each, or a token budget (dynamic batch size).

With a budget (``use_dynamic_bsz``), a row costs its real tokens, prompt plus
response (``attention_mask.sum()``), and the rows are dealt into ``k`` parts,
longest first, each to the part with the fewest tokens so far (LPT: balanced
parts). ``k`` is the fewest parts that keep every part within the budget; a
single row over the budget is a part of its own.

Under FSDP every forward is collective (each layer all-gathers its weights),
so every data-parallel rank must run as many forwards as the others, in the
update and in the no-grad passes alike. One all-reduce makes ``k`` the largest
count any rank needs (never more than the rows of the smallest rank, so no
part is empty); a rank that needs fewer splits into ``k`` smaller parts.

The parts hold rows in an order of their own; :meth:`MicroBatching.split`
returns that order, and :func:`restore_order` puts per-row results of the
concatenated parts back in the rank's row order. Gradients need nothing of the
kind: each micro-batch's loss is its share of the global mini-batch mean
(``losses/aggregation.py``), whatever rows it holds.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hybridflow.configs.schema import ActorRolloutRefConfig
from hybridflow.core import DataProto
from hybridflow.core.keys import ATTENTION_MASK

__all__ = ["MicroBatching", "balanced_parts", "log_prob_token_budget", "parts_needed", "restore_order"]


@dataclass(frozen=True)
class MicroBatching:
    """How a rank's rows are cut into forward (and backward) passes."""

    rows: int
    """Rows per micro-batch when ``max_tokens`` is None."""
    max_tokens: int | None = None
    """Real tokens (prompt + response) per micro-batch; None: fixed ``rows``."""

    def split(
        self, data: DataProto, group: dist.ProcessGroup | None = None
    ) -> tuple[list[DataProto], torch.Tensor | None]:
        """The micro-batches of ``data``, and the row order they hold (None: consecutive rows, ``data``'s order).

        With a token budget this is collective over ``group`` (the dp group: every rank must call it).
        """
        if self.max_tokens is None:
            return data.split(self.rows), None
        lengths = data.batch[ATTENTION_MASK].sum(-1)
        k = _shared_count(parts_needed(lengths.tolist(), self.max_tokens), len(data), group, lengths.device)
        parts = balanced_parts(lengths.tolist(), k)
        return [data[part] for part in parts], torch.tensor([i for part in parts for i in part])


def restore_order(values: torch.Tensor, order: torch.Tensor | None) -> torch.Tensor:
    """Rows of ``values`` (in micro-batch order, ``order`` from :meth:`MicroBatching.split`) in the original order."""
    if order is None:
        return values
    out = torch.empty_like(values)
    out[order.to(values.device)] = values
    return out


def balanced_parts(lengths: Sequence[int], k: int) -> list[list[int]]:
    """Row indices dealt into exactly ``k`` non-empty parts (1 <= k <= rows), longest row first, each to the
    part with the fewest tokens so far (then the fewest rows); indices ascending within a part."""
    if not 1 <= k <= len(lengths):
        raise ValueError(f"cannot split {len(lengths)} rows into {k} non-empty parts")
    heap = [(0, 0, part) for part in range(k)]  # (tokens, rows, part): an empty part is always lightest
    parts: list[list[int]] = [[] for _ in range(k)]
    for row in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        tokens, count, part = heapq.heappop(heap)
        parts[part].append(row)
        heapq.heappush(heap, (tokens + lengths[row], count + 1, part))
    return [sorted(part) for part in parts]


def parts_needed(lengths: Sequence[int], max_tokens: int) -> int:
    """The fewest parts :func:`balanced_parts` makes within ``max_tokens`` each (a row over it alone)."""
    if max_tokens < 1:
        raise ValueError(f"a token budget must be >= 1, got {max_tokens}")
    if not lengths:
        return 0
    over = [n for n in lengths if n > max_tokens]  # each alone; the rest need their tokens / budget parts at least
    k = min(len(lengths), max(1, len(over) + math.ceil((sum(lengths) - sum(over)) / max_tokens)))
    while k < len(lengths):
        parts = balanced_parts(lengths, k)
        if all(len(p) == 1 or sum(lengths[i] for i in p) <= max_tokens for p in parts):
            break
        k += 1
    return k


def _shared_count(needed: int, rows: int, group: dist.ProcessGroup | None, device: torch.device) -> int:
    """The largest ``needed`` over the ranks of ``group``, at most the fewest ``rows`` of any rank."""
    if group is None or dist.get_world_size(group) == 1:
        return min(needed, rows)
    counts = torch.tensor([needed, -rows], device=device)  # on the batch's device: NCCL reduces CUDA tensors
    dist.all_reduce(counts, op=dist.ReduceOp.MAX, group=group)
    return min(int(counts[0]), -int(counts[1]))


def log_prob_batching(arr: ActorRolloutRefConfig, rows: int) -> MicroBatching:
    """The micro-batches of the no-grad log-prob passes: ``rollout.log_prob_micro_batch_size_per_gpu`` rows (or
    the role's own ``rows``), or the token budget of :func:`log_prob_token_budget` when there is one."""
    given = arr.rollout.log_prob_micro_batch_size_per_gpu
    return MicroBatching(rows if given is None else given, log_prob_token_budget(arr))


def log_prob_token_budget(arr: ActorRolloutRefConfig) -> int | None:
    """The token budget of the no-grad log-prob passes (the actor's ``old_log_probs`` and the reference's), or
    None for fixed rows: ``rollout.log_prob_use_dynamic_bsz`` and ``rollout.log_prob_max_token_len_per_gpu``,
    each defaulting to the actor's ``use_dynamic_bsz`` and ``ppo_max_token_len_per_gpu``."""
    actor, rollout = arr.actor, arr.rollout
    dynamic = actor.use_dynamic_bsz if rollout.log_prob_use_dynamic_bsz is None else rollout.log_prob_use_dynamic_bsz
    if not dynamic:
        return None
    budget = rollout.log_prob_max_token_len_per_gpu
    return actor.ppo_max_token_len_per_gpu if budget is None else budget

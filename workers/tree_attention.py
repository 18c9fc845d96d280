"""Attention over prefix trees that computes only the pairs a tree lets attend: a prompt once, each branch apart.

A prefix tree (``packing.pack`` with ``share_prompts``) lays one prompt and
its ``n`` responses end to end in one packed row; every response sees the
prompt and itself, never a sibling. A dense mask over the packed row would
compute every pair of its ``N`` slots (``N^2``) and hide most of them.
:func:`tree_attention` gathers instead, per tree and per branch::

    prompt queries  (units, P, ...)  against the unit's prompt keys         (P x P, causal)
    branch queries  (rows,  L, ...)  against [its prompt's keys, its own]   (L x (P + L), causal in its own)

with ``P`` / ``L`` the longest prompt / response of the micro-batch (shorter
ones padded, the pads masked out), and scatters the outputs back to the
packed slots. Each pair a row's own forward computes is computed once, and
nothing else: a query's softmax runs over exactly the keys its unpacked row
gives it, so the outputs equal the padded pass to rounding.

The model reaches it through :mod:`hybridflow.workers.attention`, which
wraps the model's attention and calls :func:`tree_attention` when a layer's
``attention_mask`` is a :class:`TreeLayout` (``packed_forward`` passes it as
the prepared mask of every layer). ``probe_packing`` checks that the tree's
outputs equal each row's own before it shares prompts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

__all__ = ["TreeLayout", "tree_attention", "tree_layout"]


@dataclass(frozen=True)
class TreeLayout:
    """Where a packed row's prefix trees sit: gather indices into its ``N`` slots and the masks that go with them.

    ``U`` trees of prompts up to ``P`` tokens; ``B`` branches (the batch's rows) of responses up to ``L`` tokens.
    """

    prompt_slots: torch.Tensor
    """(U, P) each tree's prompt slots; a pad repeats the tree's first slot."""
    prompt_mask: torch.Tensor
    """(U, 1, P, P) bool: causal among the real prompt slots (a pad query sees the real keys)."""
    branch_queries: torch.Tensor
    """(B, L) each row's response slots; a pad repeats its tree's first slot."""
    branch_keys: torch.Tensor
    """(B, P + L) its tree's prompt slots, then its own response slots."""
    branch_mask: torch.Tensor
    """(B, 1, L, P + L) bool: every real prompt key, and its own response keys up to the query."""
    source: torch.Tensor
    """(N,) for each slot, its output's place in the prompt outputs (U x P) followed by the branch outputs (B x L)."""


def tree_layout(
    unit_start: list[int],
    prompt_lengths: list[int],
    row_unit: list[int],
    row_before: list[int],
    response_lengths: list[int],
    slots: int,
    device: torch.device,
) -> TreeLayout:
    """The layout of trees whose unit ``u`` starts at slot ``unit_start[u]`` with its ``prompt_lengths[u]``
    prompt slots, then its rows' responses: row ``i`` of unit ``row_unit[i]`` has ``response_lengths[i]`` slots
    after the ``row_before[i]`` response slots of the unit's earlier rows. ``slots``: the packed row's length."""
    arange = lambda n: torch.arange(n, device=device)  # noqa: E731
    start, plen = torch.tensor(unit_start, device=device), torch.tensor(prompt_lengths, device=device)
    unit, before = torch.tensor(row_unit, device=device), torch.tensor(row_before, device=device)
    rlen = torch.tensor(response_lengths, device=device)
    p, length = int(plen.max()), int(rlen.max()) if len(response_lengths) else 0
    prompt_real = arange(p) < plen[:, None]  # (U, P)
    prompt_slots = torch.where(prompt_real, start[:, None] + arange(p), start[:, None])
    causal = arange(p)[None, :, None] >= arange(p)[None, None, :]
    prompt_mask = (prompt_real[:, None, :] & (causal | ~prompt_real[:, :, None]))[:, None]
    query_real = arange(length) < rlen[:, None]  # (B, L)
    first_response = start[unit] + plen[unit] + before
    branch_queries = torch.where(query_real, first_response[:, None] + arange(length), start[unit][:, None])
    branch_keys = torch.cat([prompt_slots[unit], branch_queries], dim=1)
    own = (arange(length)[None, :, None] >= arange(length)[None, None, :]) & query_real[:, None, :]
    own = own | (~query_real[:, :, None] & query_real[:, None, :])  # a pad query sees the real keys, never none
    branch_mask = torch.cat([prompt_real[unit][:, None, :].expand(-1, length, -1), own], dim=2)[:, None]
    source = torch.zeros(slots, dtype=torch.long, device=device)
    source[prompt_slots[prompt_real]] = arange(prompt_slots.numel())[prompt_real.flatten()]
    source[branch_queries[query_real]] = prompt_slots.numel() + arange(branch_queries.numel())[query_real.flatten()]
    return TreeLayout(prompt_slots, prompt_mask, branch_queries, branch_keys, branch_mask, source)


def tree_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layout: TreeLayout,
    *,
    scaling: float | None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """Attention of one packed row ``(1, heads, N, d)`` (keys and values may have fewer heads: grouped-query)
    over its trees; returns ``(1, N, heads, d)``, the layout transformers' attention functions return."""
    if query.shape[0] != 1:
        raise ValueError(f"tree attention takes one packed row, got a batch of {query.shape[0]}")
    # Token-major (N, heads, d): the projections' own memory order, so a gathered slot is one contiguous run,
    # and index_select's backward is an index_add (advanced indexing's is a slower accumulating index_put).
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    gqa = q.shape[1] != k.shape[1]

    def gather(t: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:  # (G, heads, len, d)
        return t.index_select(0, slots.flatten()).view(*slots.shape, *t.shape[1:]).transpose(1, 2)

    def attend(queries: torch.Tensor, keys: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = F.scaled_dot_product_attention(
            gather(q, queries),
            gather(k, keys),
            gather(v, keys),
            attn_mask=mask,
            dropout_p=dropout,
            scale=scaling,
            enable_gqa=gqa,
        )
        return out.transpose(1, 2).flatten(0, 1)  # (G * len, heads, d)

    parts = [attend(layout.prompt_slots, layout.prompt_slots, layout.prompt_mask)]
    if layout.branch_queries.shape[1]:
        parts.append(attend(layout.branch_queries, layout.branch_keys, layout.branch_mask))
    return torch.cat(parts).index_select(0, layout.source)[None]

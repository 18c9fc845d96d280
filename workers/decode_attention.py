"""One decode step's attention on a CPU as two batched matrix products.

At each decode step every resident row has one query against its cached keys
(``(A, heads, 1, d)`` against ``(A, kv_heads, S, d)``, ``S`` a few dozen to a
few thousand). On a CPU, SDPA sends this to its flash kernel, which is built
for long query blocks; folding each key/value head's query group into one
``(group, d)`` block and running ``softmax(q k^T * scale + mask) v`` as two
``bmm`` took 0.28-0.48 ms against the kernel's 0.40-0.65 ms at the bench
shapes (128 rows, 4 heads over 2 kv heads, d 64, S 20-52), and the built-in
engine's whole generation ~10% less time, the same tokens, log-probs within
7e-7 (``bench/bench_update_profile.py``'s job, measured 2026-12-02). Same
attention, so same numbers to rounding; on a GPU the fused kernels win and
this is not used.
"""

from __future__ import annotations

import torch

__all__ = ["decode_attention", "takes"]


def takes(query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float) -> bool:
    """Whether :func:`decode_attention` computes this call: a CPU decode step (one query per row, no dropout)
    with no mask or a boolean one (True: attend), heads a multiple of the key/value heads."""
    return (
        query.device.type == "cpu"
        and query.shape[2] == 1
        and dropout == 0.0
        and query.shape[1] % key.shape[1] == 0
        and (attention_mask is None or (attention_mask.dtype == torch.bool and attention_mask.shape[2] == 1))
    )


def decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
) -> torch.Tensor:
    """``(A, heads, 1, d)`` queries against ``(A, kv_heads, S, d)`` keys and values, masked by ``attention_mask``
    (``(A, 1 or heads, 1, S)`` bool, or None); returns ``(A, 1, heads, d)``, as transformers' attention functions."""
    rows, heads, _, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    group = heads // kv_heads
    scale = dim**-0.5 if scaling is None else scaling
    q = query.reshape(rows * kv_heads, group, dim)  # a kv head's query heads, one block (heads are kv-major)
    k, v = key.reshape(rows * kv_heads, length, dim), value.reshape(rows * kv_heads, length, dim)
    if attention_mask is None:
        scores = torch.bmm(q, k.transpose(1, 2)).mul_(scale)
    else:
        bias = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device)
        bias.masked_fill_(~attention_mask, float("-inf"))
        bias = bias.expand(rows, heads, 1, length).reshape(rows * kv_heads, group, length)
        scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=scale)
    return torch.bmm(scores.softmax(-1), v).view(rows, 1, heads, dim)

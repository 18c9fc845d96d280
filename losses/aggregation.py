"""Loss aggregation: from a (B, T) matrix of token losses to one scalar.

The actor splits a mini-batch across data-parallel ranks and micro-batches and
sums their gradients. To make the update independent of that split, every
mode divides by a count taken over the *global* mini-batch (all ranks, all
micro-batches), passed in as ``num_tokens`` / ``num_seqs``; each micro-batch
then contributes its share of one global mean, and the shares add up.

Modes (m = response mask, L = token losses, S = sequences in the mini-batch,
N = valid tokens in the mini-batch, T_max = ``norm_len``)::

    token-mean               sum_{i,t} m L / N
    seq-mean-token-sum       sum_i (sum_t m L) / S
    seq-mean-token-mean      sum_i (sum_t m L / sum_t m) / S
    seq-mean-token-sum-norm  sum_i (sum_t m L) / (S * T_max)     # Dr.GRPO: a constant, not the length

When the counts are left out they default to this batch's own, which gives the
plain local mean.
"""

from __future__ import annotations

import torch

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def agg_loss(
    token_losses: torch.Tensor,
    response_mask: torch.Tensor,
    mode: str,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_len: float | None = None,
) -> torch.Tensor:
    """This batch's contribution to the global mean loss under ``mode``.

    :param token_losses: (B, T) per-token loss.
    :param response_mask: (B, T) 1 for tokens that count.
    :param num_tokens: valid tokens in the global mini-batch (``token-mean``).
    :param num_seqs: sequences in the global mini-batch (the ``seq-*`` modes).
    :param norm_len: the constant length of ``seq-mean-token-sum-norm``
        (default: T, the padded response length).
    """
    if token_losses.shape != response_mask.shape or token_losses.dim() != 2:
        raise ValueError(
            f"token_losses {tuple(token_losses.shape)} and response_mask {tuple(response_mask.shape)} must be equal (B, T) shapes"
        )
    mask = response_mask.to(token_losses.dtype)
    masked = token_losses * mask
    if mode == "token-mean":
        return masked.sum() / (mask.sum().clamp(min=1) if num_tokens is None else num_tokens)
    seqs = float(token_losses.shape[0]) if num_seqs is None else num_seqs
    if mode == "seq-mean-token-sum":
        return masked.sum() / seqs
    if mode == "seq-mean-token-mean":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1)).sum() / seqs
    if mode == "seq-mean-token-sum-norm":
        length = float(token_losses.shape[1]) if norm_len is None else norm_len
        return masked.sum() / (seqs * length)
    raise ValueError(f"unknown loss_agg_mode {mode!r}; allowed: {', '.join(LOSS_AGG_MODES)}")

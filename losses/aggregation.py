"""Loss aggregation: from a (B, T) matrix of token losses to one scalar.

The actor splits a mini-batch across data-parallel ranks and micro-batches and
sums their gradients. To make the update independent of that split, every
mode but one divides by a count taken over the *global* mini-batch (all ranks,
all micro-batches), passed in as ``num_tokens`` / ``num_seqs``; each
micro-batch then contributes its share of one global mean, and the shares add
up.

Modes (m = response mask, L = token losses, N = valid tokens in the
mini-batch, S = sequences in the mini-batch *with at least one valid token*,
T_max = ``norm_len``; b, n, s: the same for this micro-batch alone)::

    token-mean               sum_{i,t} m L / N
    token-sum                sum_{i,t} m L                       # no normalization at all
    token-mean-local         (sum_{i,t} m L / n) * s / S          # each micro-batch's own token mean
    seq-mean-token-sum       sum_i (sum_t m L) / S
    seq-mean-token-mean      sum_i (sum_t m L / sum_t m) / S
    seq-mean-token-sum-norm  sum_i (sum_t m L) / (S * T_max)     # Dr.GRPO: a constant, not the length

S leaves out fully masked rows (a filtered or rejected response), as veRL's
``agg_loss`` does: a fully masked row must not shrink everyone else's loss.
T_max is veRL's ``loss_scale_factor`` (``actor.loss_scale_factor``, null:
``rollout.response_length``, resolved once by ``configs/roles.py``), a
constant of the run: the padded width of a batch would change with packing,
dynamic batch sizes or a batch padded to its longest response. veRL's
``agg_loss`` divides ``seq-mean-token-sum`` by S and then by T_max, as here
(older veRL summed over sequences without dividing by S: its issue 3741).
``token-mean-local`` is the one mode that depends on the micro-batch split,
on purpose: it averages per-micro-batch token means (weighted by their
share of the sequences, so equal micro-batches weigh the same).

TRL's ``GRPOTrainer`` ``loss_type`` values, in these modes:

- ``dapo`` (TRL's default; also ``cispo``, ``vespo``): token mean over the
  global batch, the token count summed over processes and accumulation
  steps: ``token-mean``.
- ``bnpo``: token mean over the local (per-device, per-step) batch, averaged
  over steps and processes: ``token-mean-local``.
- ``grpo`` (and ``sapo``): per-sequence token mean, then the mean over the
  local batch: ``seq-mean-token-mean`` (TRL counts fully masked rows; we and
  veRL do not).
- ``dr_grpo``: token sum over (local rows x ``max_completion_length``):
  ``seq-mean-token-sum-norm`` with ``norm_len`` = the maximum response length.

When the counts are left out they default to this batch's own, which gives the
plain local mean.
"""

from __future__ import annotations

import torch

LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "token-mean-local",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


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
    :param num_seqs: sequences with at least one valid token in the global
        mini-batch (the ``seq-*`` modes and ``token-mean-local``).
    :param norm_len: the constant length of ``seq-mean-token-sum-norm``, veRL's
        ``loss_scale_factor`` (default: T, this batch's padded width, as veRL's
        ``agg_loss`` falls back to; the actor and the critic pass the run's constant).
    """
    if token_losses.shape != response_mask.shape or token_losses.dim() != 2:
        raise ValueError(
            f"token_losses {tuple(token_losses.shape)} and response_mask {tuple(response_mask.shape)} "
            "must be equal (B, T) shapes"
        )
    mask = response_mask.to(token_losses.dtype)
    masked = token_losses * mask
    tokens = mask.sum(-1)
    local_seqs = (tokens > 0).sum().to(token_losses.dtype)
    seqs = local_seqs.clamp(min=1) if num_seqs is None else num_seqs
    if mode == "token-mean":
        return masked.sum() / (mask.sum().clamp(min=1) if num_tokens is None else num_tokens)
    if mode == "token-sum":
        return masked.sum()
    if mode == "token-mean-local":
        return masked.sum() / mask.sum().clamp(min=1) * local_seqs / seqs
    if mode == "seq-mean-token-sum":
        return masked.sum() / seqs
    if mode == "seq-mean-token-mean":
        return (masked.sum(-1) / tokens.clamp(min=1)).sum() / seqs
    if mode == "seq-mean-token-sum-norm":
        length = float(token_losses.shape[1]) if norm_len is None else norm_len
        return masked.sum() / (seqs * length)
    raise ValueError(f"unknown loss_agg_mode {mode!r}; allowed: {', '.join(LOSS_AGG_MODES)}")

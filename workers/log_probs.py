"""Per-token log-probabilities and entropy of a response under a causal LM.

Shared by the actor (``old_log_probs`` and the update), the reference and
the tests that check the rollout engine against a teacher-forced pass. The
forward runs on the padded batch, or padding-free (``packing``: the rows' real
tokens packed end to end, ``workers/packing.py``); both give the same numbers
at the real response tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from hybridflow.core import DataProto
from hybridflow.core.keys import ATTENTION_MASK, INPUT_IDS, POSITION_IDS, RESPONSES
from hybridflow.workers.packing import Packing, pack, packed_forward, unpack


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] for each position: (B, T, V), (B, T) -> (B, T) float32."""
    logits = logits.float()
    return torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) at each position: (B, T, V) -> (B, T) float32."""
    logits = logits.float()
    log_p = torch.log_softmax(logits, dim=-1)
    return -(log_p.exp() * log_p).sum(-1)


def sum_pi_squared_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """sum_v softmax(logits)_v^2 at each position, (B, T, V) -> (B, T) float32, in log space:
    exp(logsumexp(2 z) - 2 logsumexp(z)), so a peaked distribution does not underflow."""
    logits = logits.float()
    return torch.exp(torch.logsumexp(2 * logits, dim=-1) - 2 * torch.logsumexp(logits, dim=-1))


class TokenStats(NamedTuple):
    """Per response token, (B, T) each: the log-prob of the sampled token, and when asked the entropy and
    sum_v pi(v)^2 of the distribution it was drawn from (None otherwise)."""

    log_probs: torch.Tensor
    entropy: torch.Tensor | None = None
    sum_pi_squared: torch.Tensor | None = None


def response_log_probs(
    model: nn.Module,
    batch: DataProto,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    with_sum_pi_squared: bool = False,
    packing: Packing | None = None,
) -> TokenStats:
    """Teacher-forced log-probs of ``batch["responses"]`` given the prompt, (B, T), and what else is asked.

    The logits are divided by ``temperature`` first, so the result is the
    log-probability under the distribution the rollout sampled from (and the
    entropy and sum of squared probabilities are of that distribution).
    ``packing``: one forward without the pads, packed so (``probe_packing``
    finds the model's); every statistic is then zero at the response pads (the
    padded pass leaves whatever the model computed there, which no loss reads).
    """
    if packing is not None:
        packed = pack(batch, packing)
        logits = packed_forward(model, packed) / temperature  # (M, V): one row per real response token
        stats = _token_stats(logits, packed.response_tokens, with_entropy, with_sum_pi_squared)
        return TokenStats(*(None if s is None else unpack(s, packed) for s in stats))
    responses = batch.batch[RESPONSES]
    length = responses.shape[1]
    out = model(
        input_ids=batch.batch[INPUT_IDS],
        attention_mask=batch.batch[ATTENTION_MASK],
        position_ids=batch.batch[POSITION_IDS],
        use_cache=False,
    )
    # logits at position p predict token p + 1: the response's logits start one before it
    logits = out.logits[:, -length - 1 : -1, :] / temperature
    return _token_stats(logits, responses, with_entropy, with_sum_pi_squared)


def _token_stats(
    logits: torch.Tensor, labels: torch.Tensor, with_entropy: bool, with_sum_pi_squared: bool
) -> TokenStats:
    """The asked statistics of ``logits`` (..., V) at ``labels`` (...)."""
    return TokenStats(
        log_probs_from_logits(logits, labels),
        entropy_from_logits(logits) if with_entropy else None,
        sum_pi_squared_from_logits(logits) if with_sum_pi_squared else None,
    )

"""The per-step token choice of the rollout engine (its parameters: :class:`hybridflow.core.sampling.SamplingParams`).

Log-prob convention: the log-prob recorded for a sampled token is
``log_softmax(logits / temperature)[token]``, computed from the model's raw
logits divided by the temperature, **before** top-k / top-p filtering. It is
the quantity the actor recomputes in a teacher-forced pass (its logits divided
by the same temperature), so the two can be compared token for token. In
greedy mode the temperature is taken as 1.
"""

from __future__ import annotations

import torch

from hybridflow.core.sampling import SamplingParams

__all__ = ["filter_top_k_top_p", "sample_next_tokens"]


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k and the top-p nucleus to -inf; (N, V) -> (N, V).

    The most likely token always survives. Ties at the top-k boundary are all
    kept (the threshold is the k-th largest value).
    """
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p.
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
        drop_sorted[..., 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next_tokens(
    logits: torch.Tensor,
    params: SamplingParams,
    *,
    greedy: bool,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose one token per row of ``logits`` (N, V).

    :returns: ``(tokens, log_probs)``, both (N,): the chosen ids and their
        log-probs under ``log_softmax(logits / temperature)`` (see the module
        docstring; temperature 1 when ``greedy``).
    """
    logits = logits.float()
    if greedy:
        tokens = logits.argmax(dim=-1)
        log_probs = logits.log_softmax(dim=-1)
    else:
        scaled = logits / params.temperature
        log_probs = scaled.log_softmax(dim=-1)
        filtered = filter_top_k_top_p(scaled, params.top_k, params.top_p)
        probs = filtered.softmax(dim=-1)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

"""The per-step token choice of the rollout engine (its parameters: :class:`hybridflow.core.sampling.SamplingParams`).

Log-prob convention: the log-prob recorded for a sampled token is
``log_softmax(logits / temperature)[token]``, computed from the model's raw
logits divided by the temperature, **before** top-k / top-p filtering. It is
the quantity the actor recomputes in a teacher-forced pass (its logits divided
by the same temperature), so the two can be compared token for token. In
greedy mode the temperature is taken as 1.

Randomness is per sample, not per batch: sample ``j`` of prompt ``i`` in a
call seeded ``seed`` has the key ``seed + i*n + j`` (vLLM's seeds for a
request's samples), and its ``t``-th token is drawn by inverting the filtered
distribution's CDF at a uniform number that is a hash of (key, t)
(:func:`sample_uniforms`). So a sample draws the same numbers whatever else is
decoded beside it, in whatever order or slot: the static loop, continuous
batching and the streaming rollout sample alike for equal seeds.
"""

from __future__ import annotations

import torch

from hybridflow.core.sampling import SamplingParams

__all__ = ["filter_top_k_top_p", "prompt_keys", "sample_keys", "sample_next_tokens", "sample_uniforms"]

_MIX_1 = 0xBF58476D1CE4E5B9 - 2**64  # splitmix64's multipliers, as signed int64
_MIX_2 = 0x94D049BB133111EB - 2**64
_GOLDEN = 0x9E3779B97F4A7C15 - 2**64


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finalizer: every input bit moves every output bit (int64 arithmetic wraps)."""
    x = (x ^ _shift_right(x, 30)) * _MIX_1
    x = (x ^ _shift_right(x, 27)) * _MIX_2
    return x ^ _shift_right(x, 31)


def sample_uniforms(keys: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """One uniform number in [0, 1) per row, a function of the row's sample key and token index only;
    (N,) int64, (N,) int64 -> (N,) float64."""
    x = _mix(_mix(keys) + (steps + 1) * _GOLDEN)
    return _shift_right(x, 11).double() * 2.0**-53


def sample_keys(seed: int, rows: int, device: torch.device | str) -> torch.Tensor:
    """The keys of a call's rows ``i*n + j`` (prompt ``i``'s sample ``j``): ``seed + row``."""
    return seed + torch.arange(rows, dtype=torch.long, device=device)


def prompt_keys(seed: int, prompts: int, n: int) -> list[int]:
    """The key of each prompt's sample 0 (``seed + i*n``; sample ``j``'s adds ``j``): also vLLM's request seeds."""
    return [seed + i * n for i in range(prompts)]


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
    uniforms: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose one token per row of ``logits`` (N, V).

    :param uniforms: (N,) numbers in [0, 1), one per row (:func:`sample_uniforms`); unused when ``greedy``.
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
        cdf = filter_top_k_top_p(scaled, params.top_k, params.top_p).softmax(dim=-1).double().cumsum(dim=-1)
        # the first token whose CDF exceeds u * total: a token of zero probability never is (its CDF equals the one
        # before it)
        at = (uniforms.to(cdf.device, torch.float64) * cdf[:, -1]).unsqueeze(-1)
        tokens = torch.searchsorted(cdf, at, right=True).squeeze(-1).clamp_(max=logits.shape[-1] - 1)
    return tokens, log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

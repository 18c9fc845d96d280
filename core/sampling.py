"""How the rollout picks each next token: the sampling parameters the driver, the rollout engines and the
policy server share (the per-step token choice itself lives in ``workers/rollout/sampling.py``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SamplingParams"]


@dataclass(frozen=True)
class SamplingParams:
    """How the rollout engine picks each next token."""

    temperature: float = 1.0
    """Divides the logits before softmax; must be > 0 (use greedy mode for argmax)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability sum reaches top_p (1.0: off)."""
    top_k: int = 0
    """Keep only the k most likely tokens (0 or negative: off)."""
    max_new_tokens: int = 64
    """Response length T: generation stops after this many tokens even without EOS."""
    ignore_eos: bool = False
    """Sampled responses run to ``max_new_tokens`` whatever they sample, EOS kept as an ordinary token (equal work
    per response, for throughput measurements: veRL's ``rollout.ignore_eos``); greedy ones still stop at EOS."""

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}; use greedy=True for argmax decoding")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    def stop_ids(self, eos_token_ids, stop_token_ids=(), *, greedy: bool = False) -> tuple[int, ...]:
        """The token ids that end a response, kept in it: the EOS ids (not with ``ignore_eos``, for sampled
        responses) and ``stop_token_ids`` (an agent turn's)."""
        eos = () if self.ignore_eos and not greedy else eos_token_ids
        return tuple(dict.fromkeys(int(t) for t in (*eos, *stop_token_ids)))

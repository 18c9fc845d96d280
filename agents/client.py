"""What an agent loop talks to: a client that samples a continuation of token ids from the policy.

Two clients implement :class:`PolicyClient`: :class:`hybridflow.agents.batcher.GenerationBatcher`
(in the driver, straight to the rollout worker group) and
:class:`hybridflow.agents.http_client.CompletionsClient` (over HTTP, to the
OpenAI-compatible server in front of the same workers, or to vLLM's own).
Loops exchange token ids, never text, so a trajectory is exactly the tokens
the policy was scored on: no retokenization drift.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Completion", "PolicyClient"]


@dataclass(frozen=True)
class Completion:
    """One sampled continuation."""

    token_ids: list[int]
    """The sampled tokens, the EOS or stop token that ended them included."""
    log_probs: list[float]
    """Each sampled token's log-probability under the sampling policy (the rollout convention:
    ``log_softmax(logits / temperature)``, see ``workers/rollout/sampling.py``)."""
    finish_reason: str
    """``"stop"`` (EOS or a stop token) or ``"length"`` (``max_tokens`` reached first)."""
    weight_version: int | None = None
    """The policy weight version that sampled it (None when the server does not say)."""

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.log_probs):
            raise ValueError(f"{len(self.token_ids)} tokens but {len(self.log_probs)} log-probs")
        if self.finish_reason not in ("stop", "length"):
            raise ValueError(f"finish_reason must be 'stop' or 'length', got {self.finish_reason!r}")


class PolicyClient(Protocol):
    """Samples from the policy; many agent loops share one client on one event loop."""

    async def generate(
        self, prompt_ids: Sequence[int], *, max_tokens: int, stop_token_ids: Sequence[int] = ()
    ) -> Completion:
        """A continuation of ``prompt_ids`` of at most ``max_tokens`` tokens, ending early at EOS or
        at one of ``stop_token_ids`` (kept in the output). Sampling settings (temperature, greedy, seed)
        are the client's, set for the whole rollout."""
        ...

"""What an agent loop is given for one prompt."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hybridflow.core.keys import EXTRA_INFO

__all__ = ["AgentRequest", "TOOLS_KWARGS"]

TOOLS_KWARGS = "tools_kwargs"
"""The key of a row's ``extra_info`` that holds each tool's per-prompt state (tool name -> dict), as in veRL."""


@dataclass(frozen=True)
class AgentRequest:
    """One prompt for one agent loop: its tokens, its row's fields and the trajectory's budget."""

    prompt_ids: list[int]
    """The prompt's tokens (chat template applied, no padding)."""
    row: Mapping[str, Any]
    """The row's non-tensor fields: ``data_source``, ``reward_model``, ``extra_info``, ``uid``, ..."""
    tokenizer: Any
    """Decodes the policy's turns and renders observations (an HF tokenizer)."""
    max_response_tokens: int
    """The most tokens after the prompt, policy and observation tokens together (``rollout.response_length``)."""

    @property
    def tools_state(self) -> Mapping[str, Any]:
        """``extra_info["tools_kwargs"]``: what each tool's instance knows for this prompt (empty when absent)."""
        extra = self.row.get(EXTRA_INFO)
        state = extra.get(TOOLS_KWARGS) if isinstance(extra, Mapping) else None
        return state if isinstance(state, Mapping) else {}

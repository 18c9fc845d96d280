"""A trajectory: the tokens after the prompt, which of them the policy sampled, and their log-probs.

An agent loop appends, in order, what the policy generated
(:meth:`Trajectory.add_generation`, loss mask 1) and what the environment
said back (:meth:`Trajectory.add_observation`: tool results and the chat
template's tokens around them, loss mask 0). :func:`assemble_trajectories`
lays a batch of them out as the rollout DataProto every stage reads::

    input_ids      = [prompt, left-padded (P)] [response: policy + observation tokens, right-padded (T)]
    attention_mask = [prompt's real tokens   ] [every real response token (observations included)]
    response_mask  =                           [1 on policy tokens only: the loss mask]

so the actor, reference and critic forwards see the whole conversation
(``attention_mask``) while losses, advantages, entropy and KL count policy
tokens only (``response_mask``), as veRL's agent loop does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from hybridflow.agents.client import Completion
from hybridflow.agents.toolbox import ToolResult
from hybridflow.core.data_proto import DataProto
from hybridflow.core.keys import (
    ATTENTION_MASK,
    INPUT_IDS,
    POSITION_IDS,
    PROMPTS,
    RESPONSE_MASK,
    RESPONSES,
    ROLLOUT_LOG_PROBS,
)
from hybridflow.core.rollout_batch import positions_from_mask

__all__ = ["Trajectory", "assemble_trajectories"]


@dataclass
class Trajectory:
    """What one agent loop produced for one prompt (see the module docstring)."""

    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    turns: int = 0
    """Generations made."""
    tool_calls: int = 0
    tool_errors: int = 0
    """Error observations: calls that failed (unknown tool, bad arguments, raised, timed out, not text) and
    calls that could not be run (malformed, or past a loop's per-turn limit)."""
    tool_timeouts: int = 0
    tool_truncated: int = 0
    """Observations cut to the configured length."""
    truncated: bool = False
    """The token budget ended the trajectory (a generation hit its ``max_tokens``, or an observation did not fit)."""
    weight_versions: set[int] = field(default_factory=set)

    def add_generation(self, completion: Completion) -> None:
        """Append sampled tokens (loss mask 1)."""
        self.response_ids += completion.token_ids
        self.loss_mask += [1] * len(completion.token_ids)
        self.log_probs += completion.log_probs
        self.turns += 1
        if completion.weight_version is not None:
            self.weight_versions.add(completion.weight_version)

    def record_call(self, result: ToolResult) -> None:
        """Count one call the loop ran: a call, and an error, timeout or cut observation as it went."""
        self.tool_calls += 1
        self.tool_errors += int(result.failed)
        self.tool_timeouts += int(result.status == "timeout")
        self.tool_truncated += int(result.truncated)

    def add_observation(self, token_ids: Sequence[int]) -> None:
        """Append tokens the policy did not sample (loss mask 0, log-prob 0)."""
        self.response_ids += list(token_ids)
        self.loss_mask += [0] * len(token_ids)
        self.log_probs += [0.0] * len(token_ids)

    @property
    def policy_tokens(self) -> int:
        """Tokens the policy sampled."""
        return sum(self.loss_mask)

    def __len__(self) -> int:
        return len(self.response_ids)


def assemble_trajectories(
    prompts: DataProto, trajectories: Sequence[Trajectory], response_length: int, pad_token_id: int
) -> DataProto:
    """The rollout DataProto of ``trajectories``, row ``i`` continuing prompt row ``i`` of ``prompts``.

    ``prompts`` holds ``input_ids`` / ``attention_mask`` / ``position_ids`` (B, P), left-padded, one row per
    trajectory (already repeated for the n samples). Responses are right-padded to ``response_length``
    (a longer trajectory is an error: the loops keep to their budget). Returns the columns
    :func:`hybridflow.workers.rollout.engine.assemble_rollout` does, plus the prompts' other columns.
    """
    if len(trajectories) != len(prompts):
        raise ValueError(f"{len(trajectories)} trajectories for {len(prompts)} prompt rows")
    rows = len(trajectories)
    responses = torch.full((rows, response_length), pad_token_id, dtype=torch.long)
    real = torch.zeros((rows, response_length), dtype=torch.long)
    loss_mask = torch.zeros((rows, response_length), dtype=torch.long)
    log_probs = torch.zeros((rows, response_length), dtype=torch.float32)
    for i, traj in enumerate(trajectories):
        n = len(traj)
        if n > response_length:
            raise ValueError(f"trajectory {i} has {n} tokens, more than the response length {response_length}")
        responses[i, :n] = torch.tensor(traj.response_ids, dtype=torch.long)
        real[i, :n] = 1
        loss_mask[i, :n] = torch.tensor(traj.loss_mask, dtype=torch.long)
        log_probs[i, :n] = torch.tensor(traj.log_probs, dtype=torch.float32)
    prompt_ids, prompt_mask = prompts.batch[INPUT_IDS], prompts.batch[ATTENTION_MASK]
    prompt_pos = prompts.batch.get(POSITION_IDS)
    if prompt_pos is None:
        prompt_pos = positions_from_mask(prompt_mask)
    response_pos = prompt_pos[:, -1:] + 1 + torch.arange(response_length)[None, :]
    out = DataProto(dict(prompts.batch), dict(prompts.non_tensor_batch), dict(prompts.meta_info))
    mask_dtype = prompt_mask.dtype
    out.batch.update(
        {
            PROMPTS: prompt_ids,
            RESPONSES: responses,
            RESPONSE_MASK: loss_mask.to(mask_dtype),
            ROLLOUT_LOG_PROBS: log_probs * loss_mask,
            INPUT_IDS: torch.cat([prompt_ids, responses], dim=1),
            ATTENTION_MASK: torch.cat([prompt_mask, real.to(mask_dtype)], dim=1),
            POSITION_IDS: torch.cat([prompt_pos, response_pos], dim=1),
        }
    )
    return out

"""Run one agent loop per sample of a batch of prompts, concurrently, and lay out their trajectories.

::

    prompts (B rows, meta n) --repeat x n, interleaved--> B*n requests
        |  asyncio: B*n loops on one event loop, sharing one PolicyClient
        |  (the GenerationBatcher sends their turns to the engine as batches)
        v
    B*n trajectories --assemble_trajectories--> the rollout DataProto

Row ``i*n + j`` is prompt ``i``'s sample ``j``, as the single-generation
rollout lays them out, so the rest of the step (uids, groups, rewards) is
unchanged; each row's ``extra_info`` gains the loop's ``num_turns`` and
``tool_calls`` (the verifier's to read, as veRL passes ``num_turns``). The batch's
``meta_info`` carries the oldest ``weight_version``
any turn was sampled with and the ``agent/*`` metrics
(:func:`trajectory_metrics`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from hybridflow.agents.client import PolicyClient
from hybridflow.agents.request import AgentRequest
from hybridflow.agents.toolbox import ToolBox
from hybridflow.agents.trajectory import Trajectory, assemble_trajectories
from hybridflow.core.data_proto import DataProto
from hybridflow.core.keys import ATTENTION_MASK, EXTRA_INFO, INPUT_IDS, METRICS, N_SAMPLES, WEIGHT_VERSION
from hybridflow.plugins.entries import AgentLoop

__all__ = ["AGENT_METRICS_PREFIX", "AgentRunner", "trajectory_metrics"]

AGENT_METRICS_PREFIX = "agent/"


class AgentRunner:
    """Runs ``loop`` (an :class:`AgentLoop` record) over batches of prompts (module docstring).

    :param options: the loop's options (``rollout.agent.options``), checked against its signature.
    :param tools: the tools the loop may call.
    :param tokenizer: the policy's tokenizer (decodes turns, renders observations).
    :param response_length: each trajectory's token budget after the prompt.
    :param pad_token_id: pads the assembled responses.
    """

    def __init__(
        self,
        loop: AgentLoop,
        options: Mapping[str, Any],
        tools: ToolBox,
        tokenizer: Any,
        response_length: int,
        pad_token_id: int,
    ) -> None:
        unknown = sorted(set(options) - set(loop.options))
        if unknown:
            allowed = ", ".join(sorted(loop.options)) or "(none)"
            raise ValueError(f"agent loop {loop.name!r} has no option(s) {unknown}; its options: {allowed}")
        self.loop, self.options, self.tools = loop, dict(options), tools
        self.tokenizer, self.response_length, self.pad_token_id = tokenizer, int(response_length), int(pad_token_id)

    def run(self, prompts: DataProto, client_for: Callable[[int], PolicyClient]) -> DataProto:
        """``meta_info["n"]`` trajectories per prompt row; ``client_for(count)`` makes the rollout's client
        for ``count`` concurrent loops. Blocks until every loop has finished."""
        rows = prompts.repeat(int(prompts.meta_info.get(N_SAMPLES, 1)), interleave=True)
        requests = [self._request(rows, i) for i in range(len(rows))]
        trajectories, client_metrics = asyncio.run(self._run_all(requests, client_for))
        out = assemble_trajectories(rows, trajectories, self.response_length, self.pad_token_id)
        out.non_tensor_batch[EXTRA_INFO] = with_trajectory_counts(rows.non_tensor_batch.get(EXTRA_INFO), trajectories)
        versions = set().union(*(t.weight_versions for t in trajectories))
        if versions:
            out.meta_info[WEIGHT_VERSION] = min(versions)
        out.meta_info[METRICS] = {**trajectory_metrics(trajectories), **client_metrics}
        return out

    def _request(self, rows: DataProto, i: int) -> AgentRequest:
        mask = rows.batch[ATTENTION_MASK][i].bool()
        prompt_ids = rows.batch[INPUT_IDS][i][mask].tolist()
        fields = {key: _plain(values[i]) for key, values in rows.non_tensor_batch.items()}
        return AgentRequest(prompt_ids, fields, self.tokenizer, self.response_length)

    async def _run_all(
        self, requests: Sequence[AgentRequest], client_for: Callable[[int], PolicyClient]
    ) -> tuple[list[Trajectory], dict[str, float]]:
        """The trajectories, and the client's own metrics (a batcher's calls) when it keeps any."""
        client = client_for(len(requests))
        live = len(requests)

        async def one(request: AgentRequest) -> Trajectory:
            nonlocal live
            try:
                trajectory = await self.loop.fn(request, client, self.tools, **self.options)
            finally:  # one loop fewer to wait for before a batch goes
                live -= 1
                expect = getattr(client, "expect", None)
                if expect is not None:
                    expect(live)
            if not isinstance(trajectory, Trajectory):
                raise TypeError(f"agent loop {self.loop.name!r} returned {type(trajectory).__name__}, not a Trajectory")
            return trajectory

        try:
            trajectories = list(await asyncio.gather(*(one(r) for r in requests)))
            stats = getattr(client, "stats", None)
            return trajectories, (stats.metrics() if stats is not None else {})
        finally:
            close = getattr(client, "close", None)
            if close is not None:
                await close()


def with_trajectory_counts(extra_infos: Any, trajectories: Sequence[Trajectory]) -> np.ndarray:
    """Each row's ``extra_info`` (a new dict: the n samples of a prompt shared one) plus ``num_turns`` and
    ``tool_calls``, counted by the loop, so a verifier can tell a real call from text that looks like one."""
    out = np.empty(len(trajectories), dtype=object)
    for i, trajectory in enumerate(trajectories):
        extra = extra_infos[i] if extra_infos is not None and isinstance(extra_infos[i], Mapping) else {}
        out[i] = {**extra, "num_turns": trajectory.turns, "tool_calls": trajectory.tool_calls}
    return out


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def trajectory_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """``agent/*`` metrics of a batch: turns, tool calls (mean, the fraction of trajectories with one),
    tool errors / timeouts / truncated observations (counts), truncated trajectories (fraction), and
    policy vs observation tokens per trajectory (means)."""
    count = max(len(trajectories), 1)
    total = lambda attr: float(sum(getattr(t, attr) for t in trajectories))  # noqa: E731
    policy = float(sum(t.policy_tokens for t in trajectories))
    return {
        "agent/turns/mean": total("turns") / count,
        "agent/tool_calls/mean": total("tool_calls") / count,
        "agent/tool_call_frac": sum(t.tool_calls > 0 for t in trajectories) / count,
        "agent/tool_errors": total("tool_errors"),
        "agent/tool_timeouts": total("tool_timeouts"),
        "agent/tool_truncated": total("tool_truncated"),
        "agent/truncated_frac": sum(t.truncated for t in trajectories) / count,
        "agent/policy_tokens/mean": policy / count,
        "agent/observation_tokens/mean": (sum(len(t) for t in trajectories) - policy) / count,
    }

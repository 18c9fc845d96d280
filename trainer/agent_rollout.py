"""Step 1 with a multi-turn agent loop: the driver runs the loops, the rollout workers generate their turns.

``rollout.agent_loop`` names the loop; a loop that declares ``single_generate``
(``single_turn``, the default) keeps the one batched engine call of
:meth:`PPOTrainer.generate` and never comes here. Otherwise every sample of
the batch runs its own loop (``agents/runner.py``) and the loops reach the
policy through:

* ``rollout.mode=direct``: a :class:`hybridflow.agents.batcher.GenerationBatcher`
  that gathers the loops' concurrent turns into ``generate_sequences`` calls;
* ``rollout.mode=server``: the OpenAI-compatible server (``agents/server.py``),
  started here in front of the same worker group, with each loop an HTTP
  client of it; with ``rollout.name=vllm``, vLLM's own server
  (``workers/rollout/vllm_server.py``, started by the trainer), whose weight
  version after the sync is the batch's.
"""

from __future__ import annotations

import logging
from typing import Any

from hybridflow.agents.batcher import GenerationBatcher
from hybridflow.agents.runner import AgentRunner
from hybridflow.agents.toolbox import ToolBox
from hybridflow.configs.schema import PPOConfig
from hybridflow.core.data_proto import DataProto
from hybridflow.core.keys import GREEDY, SEED, WEIGHT_VERSION
from hybridflow.plugins import get_agent_loop

__all__ = ["AgentRollout", "agent_rollout_for"]

logger = logging.getLogger(__name__)


class AgentRollout:
    """Runs the configured agent loop over a batch of prompts (module docstring)."""

    def __init__(
        self,
        config: PPOConfig,
        actor: Any,
        tokenizer: Any,
        pad_token_id: int,
        eos_token_ids: list[int],
        server: Any = None,
    ) -> None:
        rollout = config.actor_rollout_ref.rollout
        tools = ToolBox.from_names(
            list(rollout.agent.tools),
            timeout_s=rollout.agent.tool_timeout_s,
            max_observation_chars=rollout.agent.max_observation_chars,
        )
        self.runner = AgentRunner(
            get_agent_loop(rollout.agent_loop),
            dict(rollout.agent.options),
            tools,
            tokenizer,
            rollout.response_length,
            pad_token_id,
        )
        self.actor, self.pad_token_id, self.eos_token_ids = actor, pad_token_id, eos_token_ids
        self.server_config = rollout.server
        # a turn generates at most the trajectory's response budget, inside a context of prompt + responses
        self.server_limits = {
            "max_tokens_limit": rollout.response_length,
            "max_model_len": config.data.max_prompt_length + rollout.response_length,
        }
        self.mode = rollout.mode
        self.server = None
        self.vllm_server = server  # a VLLMServer: the loops are its clients

    def generate(self, prompts: DataProto) -> DataProto:
        """``meta_info["n"]`` trajectories per prompt, laid out as the single-generation rollout is."""
        meta = prompts.meta_info
        greedy, seed = bool(meta.get(GREEDY, False)), int(meta.get(SEED, 0))
        out = self.runner.run(prompts, lambda count: self._client(count, greedy, seed))
        if self.vllm_server is not None:  # vLLM's completions carry no version: the server's is the batch's
            out.meta_info[WEIGHT_VERSION] = self.vllm_server.weight_version()
        return out

    def _client(self, count: int, greedy: bool, seed: int) -> Any:
        if self.mode == "server":
            from hybridflow.agents.http_client import CompletionsClient  # noqa: PLC0415 - aiohttp only when used

            if self.vllm_server is not None:  # one seed for every request would give a prompt's n samples alike
                return CompletionsClient(self.vllm_server.url, greedy=greedy, seed=None)
            return CompletionsClient(self._server_url(), greedy=greedy, seed=seed)
        batcher = GenerationBatcher(
            self.actor.generate_sequences, self.pad_token_id, self.eos_token_ids, greedy=greedy, seed=seed
        )
        batcher.expect(count)
        return batcher

    def _server_url(self) -> str:
        if self.server is None:
            from hybridflow.agents.server import PolicyServer  # noqa: PLC0415

            cfg = self.server_config
            self.server = PolicyServer(
                self.actor.generate_sequences,
                self.runner.tokenizer,
                host=cfg.host,
                port=cfg.port,
                max_wait_s=cfg.max_wait_s,
                eos_token_ids=self.eos_token_ids,
                access_log=cfg.access_log,
                max_tokens_per_call=cfg.max_tokens_per_call,
                **self.server_limits,
            )
            self.server.start()
            logger.info("policy server: %s (OpenAI-compatible; rollout.mode=server)", self.server.url)
        return self.server.url

    def close(self) -> None:
        """Stop the server, if one was started."""
        if self.server is not None:
            self.server.stop()
            self.server = None


def agent_rollout_for(
    config: PPOConfig, actor: Any, tokenizer: Any, pad_token_id: int, eos_token_ids: list[int], server: Any = None
) -> AgentRollout | None:
    """The agent rollout of the configured loop, or None when it is a single generation per prompt; ``server``:
    the run's ``vllm serve`` (``rollout.name=vllm``, ``rollout.mode=server``)."""
    if get_agent_loop(config.actor_rollout_ref.rollout.agent_loop).single_generate:
        return None
    return AgentRollout(config, actor, tokenizer, pad_token_id, eos_token_ids, server)

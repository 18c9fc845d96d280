"""End-to-end: the trainer with the tool_calling loop on the synthetic tool task (real Ray, 2 CPU ranks).

The loops run on the driver and reach the rollout workers directly (batched calls; the tool_calling
run) or through the OpenAI-compatible server the trainer starts (``rollout.mode=server``; the run
whose loop calls tools that hang, raise and flood: the step completes with each failure counted).
"""

import math
import time
from types import ModuleType

import pytest
from support import read_metrics, small_config

from hybridflow.agents import ToolCall, Trajectory
from hybridflow.agents.formats import observation_ids
from hybridflow.plugins import AgentLoop, Tool, get_plugin_manager, hookimpl, reset_plugin_manager
from hybridflow.plugins.manager import PluginSource
from hybridflow.trainer.main import build_and_fit

pytestmark = pytest.mark.slow

TOOL_USE = {
    "data.synthetic_task": "tool",
    "actor_rollout_ref.rollout.response_length": 8,
    "actor_rollout_ref.rollout.agent_loop": "tool_calling",
    "actor_rollout_ref.rollout.agent.tools": ["reveal"],
    "actor_rollout_ref.rollout.agent.options": {"format": "compact", "default_tool": "reveal", "max_turns": 2},
    "trainer.total_training_steps": 2,
    "trainer.test_freq": 2,
    "data.val_batch_size": 16,
}


def test_tool_use_trains_end_to_end(ray_session, tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    config = small_config(tmp_path, **TOOL_USE)
    summary = build_and_fit(config, tmp_path / "run")
    assert summary.steps == 2
    steps = read_metrics(tmp_path / "run")
    train = [m for m in steps if "actor/pg_loss" in m]
    assert len(train) == 2
    for m in train:
        for key in (
            "actor/pg_loss",
            "actor/grad_norm",
            "actor/entropy",
            "agent/turns/mean",
            "agent/tool_calls/mean",
            "reward/called/mean",
        ):
            assert math.isfinite(m[key]), (key, m[key])
        assert 1.0 <= m["agent/turns/mean"] <= 2.0
        # the batcher's calls: each turn of the batch's 16 loops shares one
        assert 1 <= m["agent/generate_calls"] <= 2 and m["agent/requests_per_call"] >= 8
        assert 0.0 <= m["agent/tool_call_frac"] <= 1.0
        # the policy's tokens only: an observation (3 tokens here) never counts as response length
        assert m["response_length/mean"] == pytest.approx(m["agent/policy_tokens/mean"])
        # the verifier's "called" is the loop's own count, handed over in extra_info
        assert m["reward/called/mean"] == pytest.approx(m["agent/tool_call_frac"])
    assert "val/accuracy" in steps[-1]


def hang(arguments, state):
    """Never answers in time."""
    time.sleep(60)
    return "late"


def explode(arguments, state):
    """Raises."""
    raise RuntimeError("broken tool")


def flood(arguments, state):
    """Answers a megabyte."""
    return "9" * 1_000_000


async def calls_every_tool(request, client, tools):
    """One turn of the policy, then a call of every configured tool, its observation cut to fit, one more turn."""
    trajectory = Trajectory()
    trajectory.add_generation(await client.generate(request.prompt_ids, max_tokens=2))
    for name in sorted(tools.tools):
        result = await tools.call(ToolCall(name, {}), request.tools_state)
        trajectory.record_call(result)
        trajectory.add_observation(observation_ids(request.tokenizer, [result.text[:1]]))
    left = request.max_response_tokens - len(trajectory)
    trajectory.add_generation(await client.generate(request.prompt_ids + trajectory.response_ids, max_tokens=left))
    return trajectory


@pytest.fixture
def failing_tools():
    """The three tools and the loop, registered in this process (the driver runs loops and tools)."""
    plugin = ModuleType("failing_tools_plugin")

    @hookimpl
    def hybridflow_register_tools(register):
        for fn in (hang, explode, flood):
            register(Tool(name=fn.__name__, fn=fn))

    @hookimpl
    def hybridflow_register_agent_loops(register):
        register(AgentLoop(name="calls_every_tool", fn=calls_every_tool))

    plugin.hybridflow_register_tools = hybridflow_register_tools
    plugin.hybridflow_register_agent_loops = hybridflow_register_agent_loops
    get_plugin_manager().register(plugin, PluginSource("failing_tools_plugin", "tests", "0"))
    yield
    reset_plugin_manager()


def test_tools_that_hang_raise_or_flood_leave_the_step_running(ray_session, tmp_path, monkeypatch, failing_tools):
    """Through the HTTP server (rollout.mode=server): the loops are its clients, as of vLLM's."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    config = small_config(
        tmp_path,
        **{
            **TOOL_USE,
            "actor_rollout_ref.rollout.mode": "server",
            "actor_rollout_ref.rollout.agent_loop": "calls_every_tool",
            "actor_rollout_ref.rollout.agent.tools": ["hang", "explode", "flood"],
            "actor_rollout_ref.rollout.agent.options": {},
            "actor_rollout_ref.rollout.agent.tool_timeout_s": 0.5,
            "actor_rollout_ref.rollout.response_length": 16,  # 2 policy + 3 observations of 3 tokens + the answer
            "actor_rollout_ref.rollout.agent.max_observation_chars": 64,
            "trainer.total_training_steps": 1,
            "trainer.test_freq": 0,
        },
    )
    start = time.monotonic()
    assert build_and_fit(config, tmp_path / "run").steps == 1
    assert time.monotonic() - start < 60  # a hung tool costs its timeout, not its sleep
    [step] = read_metrics(tmp_path / "run")
    samples = 4 * 4  # prompts x n
    assert step["agent/tool_calls/mean"] == 3.0
    assert step["agent/tool_timeouts"] == samples  # hang
    assert step["agent/tool_errors"] == 2 * samples  # hang and explode
    assert step["agent/tool_truncated"] == samples  # flood, cut to 64 characters
    assert step["agent/observation_tokens/mean"] == 3 * 3.0  # each observation: marker, 1 character, marker
    assert math.isfinite(step["actor/pg_loss"])

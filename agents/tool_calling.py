"""``tool_calling``: generate, run the tool calls the turn wrote, show the results, until an answer.

::

    for turn in 1..max_turns:
        completion = policy(prompt + trajectory)               # loss mask 1
        calls = format.parse(completion)                      # agents/formats.py
        if no calls: stop                                     # the turn is the answer
        observation = chat_template(tool messages of the results)   # loss mask 0
        trajectory += completion + observation

Every call's result is an observation, an error included (unknown tool, bad
arguments, a tool that raised, hung or answered in something other than
text: ``agents/toolbox.py``), so the policy can learn from its mistakes and a
step never fails on a tool. The trajectory never exceeds
``rollout.response_length`` tokens: each turn asks for what is left, and an
observation that does not fit ends it (``truncated``). A call written on the
last allowed turn is not run (no turn is left to read it).
"""

from __future__ import annotations

from hybridflow.agents.client import PolicyClient
from hybridflow.agents.formats import FORMATS, observation_ids
from hybridflow.agents.request import AgentRequest
from hybridflow.agents.toolbox import ToolBox
from hybridflow.agents.trajectory import Trajectory
from hybridflow.plugins import AgentLoop, hookimpl


async def tool_calling(
    request: AgentRequest,
    client: PolicyClient,
    tools: ToolBox,
    *,
    format: str = "hermes",  # noqa: A002 - the option's name in the config
    max_turns: int = 4,
    max_calls_per_turn: int = 4,
    default_tool: str = "",
) -> Trajectory:
    """Generate, run the turn's tool calls, show their results, until a turn without calls.

    ``format`` is ``hermes`` or ``compact``; ``max_turns`` generations at most; ``max_calls_per_turn``
    calls run per turn (more are answered with an error); ``default_tool`` is what a bare ``?`` calls
    in the compact format."""
    if format not in FORMATS:
        raise ValueError(f"tool_calling: unknown format {format!r}; allowed: {', '.join(FORMATS)}")
    fmt, tokenizer = FORMATS[format], request.tokenizer
    stops = fmt.stop_token_ids(tokenizer)
    trajectory = Trajectory()
    for turn in range(max_turns):
        budget = request.max_response_tokens - len(trajectory)
        if budget < 1:
            trajectory.truncated = True
            break
        completion = await client.generate(
            request.prompt_ids + trajectory.response_ids, max_tokens=budget, stop_token_ids=stops
        )
        trajectory.add_generation(completion)
        if completion.finish_reason == "length":
            trajectory.truncated = True
            break
        text = tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        calls, problems = fmt.parse(text, tools, default_tool or None)
        if (not calls and not problems) or turn == max_turns - 1:
            break
        texts = await _run_calls(calls, problems, tools, request, trajectory, max_calls_per_turn)
        observation = observation_ids(tokenizer, texts)
        if len(trajectory) + len(observation) >= request.max_response_tokens:  # no room left to answer
            trajectory.truncated = True
            break
        trajectory.add_observation(observation)
    return trajectory


async def _run_calls(
    calls, problems, tools: ToolBox, request: AgentRequest, trajectory: Trajectory, limit: int
) -> list[str]:
    """The observation texts of one turn's calls, counted into ``trajectory``."""
    texts = list(problems)
    trajectory.tool_errors += len(problems)
    for index, call in enumerate(calls):
        if index >= limit:
            texts.append(f"error: at most {limit} tool calls per turn")
            trajectory.tool_errors += 1
            continue
        result = await tools.call(call, request.tools_state)
        trajectory.record_call(result)
        texts.append(result.text)
    return texts


@hookimpl
def hybridflow_register_agent_loops(register):
    register(AgentLoop(name="tool_calling", fn=tool_calling))

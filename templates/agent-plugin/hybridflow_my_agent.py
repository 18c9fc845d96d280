"""``my_agent``: think, call at most one tool, then answer (a template agent loop); ``my_lookup``: a tool.

The loop, for one prompt::

    turn 1 (think):   completion = policy(prompt)                          # loss mask 1
                      at most max_think_tokens tokens (0: the whole budget)
    calls = format.parse(turn 1)                                          # hermes or compact (agents/formats.py)
    no call:          turn 1 is the answer; stop                           # one generation
    else:             text = result of the turn's first well-formed call  # any other call is not run
                      observation = chat_template(tool message: text)      # loss mask 0
    turn 2 (answer):  completion = policy(prompt + turn 1 + observation)   # loss mask 1; stop

so a trajectory is ``[turn 1]`` or ``[turn 1][observation][turn 2]``, and
only the two turns train (``response_mask`` is the loss mask). A turn whose
calls are all malformed gets the first one's error as its observation. Every
observation is text the policy reads, errors included (unknown tool, bad
arguments, a tool that raised or timed out: ``agents/toolbox.py``), counted in
the trajectory (``tool_calls``, ``tool_errors``, ``tool_timeouts``,
``tool_truncated``), so a step never fails on a tool.

The trajectory never exceeds ``request.max_response_tokens``
(``rollout.response_length``: the whole conversation after the prompt): turn 1
asks for at most that, an observation that leaves no token for the answer
ends the trajectory before it, and turn 2 asks for what is left. A turn that
reaches its ``max_tokens`` ends the trajectory unparsed; either way it is
``truncated``. Both turns stop at the format's stop tokens (``?`` in
``compact``), so the batcher, which makes one engine call per stop set, can
send the turns of all loops together.

The tool, for one prompt whose row has
``extra_info["tools_kwargs"]["my_lookup"] = {"table": {"x": "6", ...}}``::

    my_lookup({"key": "x"}) -> "6"
    my_lookup({})           -> "x=6, y=2"      # every entry, sorted by key
    unknown key, no table   -> raises LookupError (the observation is "error: my_lookup failed: LookupError: ...")

Select them with ``actor_rollout_ref.rollout.agent_loop=my_agent`` and
``'actor_rollout_ref.rollout.agent.tools=[my_lookup]'``; set an option with
``+actor_rollout_ref.rollout.agent.options.max_think_tokens=64`` (a key the
options dict does not have yet takes a leading ``+``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hybridflow.agents import AgentRequest, PolicyClient, ToolBox, ToolCall, Trajectory
from hybridflow.agents.formats import FORMATS, observation_ids
from hybridflow.plugins import AgentLoop, Tool, hookimpl


async def my_agent(
    request: AgentRequest,
    client: PolicyClient,
    tools: ToolBox,
    *,
    format: str = "hermes",  # noqa: A002 - the option's name in the config, as tool_calling's
    default_tool: str = "",
    max_think_tokens: int = 0,
) -> Trajectory:
    """Think, call at most one tool, then answer (the module docstring has the loop).

    Options (``actor_rollout_ref.rollout.agent.options``): ``format``, ``hermes`` or ``compact``
    (``agents/formats.py``); ``default_tool``, what a bare ``?`` calls in the compact format;
    ``max_think_tokens``, the most tokens of the first turn (0: the whole budget).
    """
    if format not in FORMATS:
        raise ValueError(f"my_agent: unknown format {format!r}; allowed: {', '.join(FORMATS)}")
    if max_think_tokens < 0:
        raise ValueError(f"my_agent: max_think_tokens must be >= 0, got {max_think_tokens}")
    fmt, tokenizer, budget = FORMATS[format], request.tokenizer, request.max_response_tokens
    stops = fmt.stop_token_ids(tokenizer)
    trajectory = Trajectory()

    think = await client.generate(
        request.prompt_ids, max_tokens=min(max_think_tokens or budget, budget), stop_token_ids=stops
    )
    trajectory.add_generation(think)
    if think.finish_reason == "length":
        trajectory.truncated = True
        return trajectory
    text = tokenizer.decode(think.token_ids, skip_special_tokens=True)
    calls, problems = fmt.parse(text, tools, default_tool or None)
    if not calls and not problems:
        return trajectory  # no call: the first turn is the answer

    observation = observation_ids(tokenizer, [await _first_call(calls, problems, tools, request, trajectory)])
    left = budget - len(trajectory) - len(observation)
    if left < 1:  # no room left to answer
        trajectory.truncated = True
        return trajectory
    trajectory.add_observation(observation)
    answer = await client.generate(request.prompt_ids + trajectory.response_ids, max_tokens=left, stop_token_ids=stops)
    trajectory.add_generation(answer)
    trajectory.truncated = answer.finish_reason == "length"
    return trajectory


async def _first_call(
    calls: list[ToolCall], problems: list[str], tools: ToolBox, request: AgentRequest, trajectory: Trajectory
) -> str:
    """The observation text of turn 1: the first well-formed call's result, else the first malformed call's
    error; counted into ``trajectory``."""
    if not calls:
        trajectory.tool_errors += 1
        return problems[0]
    result = await tools.call(calls[0], request.tools_state)
    trajectory.record_call(result)
    return result.text


def my_lookup(arguments: Mapping[str, Any], state: Mapping[str, Any]) -> str:
    """Look up a key in this prompt's table; without a key, every entry.

    The table is the row's ``extra_info["tools_kwargs"]["my_lookup"]["table"]``, here ``state["table"]``.

    Called in a thread of the driver with model-written ``arguments``, already
    checked against the schema below (``key``, if given, is a string). Raises
    ``LookupError`` for an unknown key or a prompt without a table: the tool
    box turns it into an error observation and counts it.
    """
    table = state.get("table")
    if not isinstance(table, Mapping):
        raise LookupError("this prompt has no table")
    if "key" not in arguments:
        return ", ".join(f"{key}={table[key]}" for key in sorted(table))
    key = arguments["key"].strip()
    if key not in table:
        raise LookupError(f"no entry {key!r}; keys: {', '.join(sorted(table))}")
    return str(table[key])


MY_LOOKUP = Tool(
    name="my_lookup", fn=my_lookup,
    description="Look up a key in this prompt's table; without a key, list every entry.",
    parameters={
        "type": "object",
        "properties": {"key": {"type": "string", "description": "the entry to look up (leave it out for all)"}},
        "required": [],
    },
)  # fmt: skip
"""The tool's record: what ``rollout.agent.tools=[my_lookup]`` resolves to, and its JSON schema."""


@hookimpl
def hybridflow_register_agent_loops(register):
    """Called once per process by hybridflow's plugin manager: describe, do no work."""
    register(AgentLoop(name="my_agent", fn=my_agent))


@hookimpl
def hybridflow_register_tools(register):
    """Called once per process by hybridflow's plugin manager: describe, do no work."""
    register(MY_LOOKUP)

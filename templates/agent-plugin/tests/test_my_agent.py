"""The tool by hand, the loop on scripted turns, and both registered by name (run as the trainer runs them).

Run after ``pip install -e .`` (the last test needs the installed entry point).

The loop tests drive ``my_agent`` with ``ScriptedClient``, a stand-in for the
policy: it returns fixed turns instead of sampling, so every token is known.
The rest is hybridflow's own: the tool box, the call formats, the chat
template's observations and the trajectory. The tokenizer is hybridflow's
builtin character-level one, the tiny policy's. Its 25 characters (digits,
``+-*%=(), ?aimnx``) can write a ``compact`` call (``?``, the format the
builtin policy trains with), used as it is below, but not a ``hermes`` call,
whose JSON needs braces, quotes and most letters: the hermes test adds the
ASCII letters and punctuation it lacks to it as extra tokens (the scripted
client needs no model, so the tiny model's 32-token vocabulary does not matter).
"""

import asyncio
import string
from importlib import metadata

import numpy as np
import pytest
import torch
from hybridflow_my_agent import MY_LOOKUP, my_agent, my_lookup

from hybridflow.agents import AgentRequest, AgentRunner, Completion, ToolBox, ToolCall
from hybridflow.agents.formats import observation_ids
from hybridflow.core import DataProto
from hybridflow.plugins import get_agent_loop, get_plugin_manager, get_tool
from hybridflow.plugins.manager import AGENT_LOOPS, TOOLS
from hybridflow.workers.models import build_char_tokenizer

DISTRIBUTION = "hybridflow-my-agent"
STATE = {"table": {"x": "6"}}  # this prompt's instance of my_lookup knows x = 6
ROW = {"extra_info": {"tools_kwargs": {"my_lookup": STATE}}}
COMPACT = {"format": "compact", "default_tool": "my_lookup"}


class ScriptedClient:
    """A stand-in for the policy: returns the given turns (text) in order, with log-prob -0.5 per token.

    Like the engine, it ends a turn with EOS unless it ends with a stop token, and cuts it to ``max_tokens``
    (then the finish reason is ``"length"``). It records what each call was asked.
    """

    def __init__(self, tokenizer, turns):
        self.tokenizer, self.turns = tokenizer, list(turns)
        self.prompts, self.max_tokens, self.stops = [], [], []

    async def generate(self, prompt_ids, *, max_tokens, stop_token_ids=()):
        self.prompts.append(list(prompt_ids))
        self.max_tokens.append(max_tokens)
        self.stops.append(list(stop_token_ids))
        ids = self.tokenizer.encode(self.turns.pop(0), add_special_tokens=False)
        if not (ids and ids[-1] in stop_token_ids):
            ids.append(self.tokenizer.eos_token_id)
        reason = "stop" if len(ids) <= max_tokens else "length"
        ids = ids[:max_tokens]
        return Completion(ids, [-0.5] * len(ids), reason, 0)


def request(tokenizer, budget, row=ROW):
    """The prompt ``x+1=`` as the prompt loader makes it: the chat template's text, tokenized without additions."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x+1="}], add_generation_prompt=True, tokenize=False
    )
    return AgentRequest(tokenizer.encode(text, add_special_tokens=False), row, tokenizer, budget)


def hermes_tokenizer():
    """The builtin tokenizer plus, as extra tokens, the ASCII letters and punctuation a hermes call needs."""
    tok = build_char_tokenizer()
    tok.add_tokens(sorted(set(string.ascii_letters + string.punctuation) - set(tok.get_vocab())))
    return tok


def run(req, client, **options):
    return asyncio.run(my_agent(req, client, ToolBox([MY_LOOKUP]), **options))


def test_the_tool_by_hand():
    table = {"table": {"x": "6", "m": 2}}
    assert my_lookup({"key": "x"}, table) == "6"
    assert my_lookup({"key": " m "}, table) == "2"  # keys are stripped, values shown as text
    assert my_lookup({}, table) == "m=2, x=6"  # no key: every entry, sorted
    with pytest.raises(LookupError, match="no entry 'y'; keys: m, x"):
        my_lookup({"key": "y"}, table)
    with pytest.raises(LookupError, match="no table"):
        my_lookup({"key": "x"}, {})
    # through the tool box, as a loop calls it: the row's state goes to its tool, errors become observations
    box, state = ToolBox([MY_LOOKUP]), {"my_lookup": STATE}
    assert asyncio.run(box.call(ToolCall("my_lookup", {"key": "x"}), state)).text == "6"
    failed = asyncio.run(box.call(ToolCall("my_lookup", {"key": "y"}), state))
    assert (failed.status, failed.text) == ("error", "error: my_lookup failed: LookupError: no entry 'y'; keys: x")
    invalid = asyncio.run(box.call(ToolCall("my_lookup", {"key": 3}), state))  # the JSON schema is checked first
    assert (invalid.status, invalid.text) == (
        "invalid",
        "error: my_lookup argument 'key' must be a JSON string, got int",
    )


def test_a_compact_call_with_the_builtin_tokenizer():
    tok = build_char_tokenizer()
    client = ScriptedClient(tok, ["?", "7"])  # turn 1 calls the default tool, turn 2 answers
    traj = run(request(tok, 12), client, **COMPACT)

    obs = observation_ids(tok, ["x=6"])  # my_lookup({}) lists the table
    assert tok.decode(obs) == "<|system|>x=6<|assistant|>"
    question, seven, eos = tok.convert_tokens_to_ids(["?", "7", "<eos>"])
    assert traj.response_ids == [question, *obs, seven, eos]
    assert traj.loss_mask == [1, 0, 0, 0, 0, 0, 1, 1]  # 1: the policy sampled it; 0: the observation
    assert traj.log_probs == [-0.5, 0.0, 0.0, 0.0, 0.0, 0.0, -0.5, -0.5]
    assert (traj.turns, traj.tool_calls, traj.tool_errors, traj.truncated) == (2, 1, 0, False)
    assert (traj.policy_tokens, len(traj)) == (3, 8)
    # turn 2 saw the prompt, the call and the observation; it asked for what was left of the 12 tokens
    assert client.prompts[1] == request(tok, 12).prompt_ids + [question, *obs]
    assert client.max_tokens == [12, 6] and client.stops == [[question], [question]]


def test_a_hermes_call_runs_the_first_call_only():
    tok = hermes_tokenizer()
    call = '<tool_call>{"name": "my_lookup", "arguments": {"key": "%s"}}</tool_call>'
    turn = "x is in the table: " + call % "x" + call % "y"
    client = ScriptedClient(tok, [turn, "7"])
    traj = run(request(tok, 200), client, max_think_tokens=170)  # hermes is the default format (162 tokens)

    first = tok.encode(turn, add_special_tokens=False) + [tok.eos_token_id]  # a hermes turn ends at EOS
    assert len(first) == 162
    obs = observation_ids(tok, ["6"])  # the first call's result; the second call (key y) is not run
    assert tok.decode(obs) == "<|system|>6<|assistant|>"
    assert traj.response_ids == first + obs + tok.encode("7", add_special_tokens=False) + [tok.eos_token_id]
    assert traj.loss_mask == [1] * len(first) + [0] * 3 + [1, 1]
    assert (traj.turns, traj.tool_calls, traj.tool_errors, traj.truncated) == (2, 1, 0, False)
    assert client.max_tokens == [170, 200 - len(first) - 3] and client.stops == [[], []]


def test_no_call_errors_and_the_budget():
    tok = build_char_tokenizer()
    # no call: the first turn is the answer
    client = ScriptedClient(tok, ["7"])
    traj = run(request(tok, 8), client, **COMPACT)
    assert (traj.response_ids, traj.loss_mask, traj.turns, len(client.prompts)) == (tok.encode("7<eos>"), [1, 1], 1, 1)

    # an error is an observation like any other, counted
    wide = hermes_tokenizer()
    error = "error: my_lookup failed: LookupError: this prompt has no table"
    traj = run(request(wide, 80, row={}), ScriptedClient(wide, ["?", "7"]), **COMPACT)
    obs = observation_ids(wide, [error])
    assert wide.decode(obs) == f"<|system|>{error}<|assistant|>"
    assert traj.loss_mask == [1] + [0] * len(obs) + [1, 1]
    assert (traj.turns, traj.tool_calls, traj.tool_errors) == (2, 1, 1)

    # "?" + a 5-token observation leave no token of 6 for the answer: the trajectory ends before it
    client = ScriptedClient(tok, ["?"])
    traj = run(request(tok, 6), client, **COMPACT)
    assert traj.response_ids == tok.encode("?") and traj.truncated and traj.tool_calls == 1

    # a first turn cut at max_think_tokens is not parsed
    traj = run(request(tok, 8), ScriptedClient(tok, ["x+1?"]), **COMPACT, max_think_tokens=2)
    assert (traj.response_ids, traj.turns, traj.tool_calls, traj.truncated) == (tok.encode("x+"), 1, 0, True)

    with pytest.raises(ValueError, match="unknown format 'json'"):
        run(request(tok, 8), ScriptedClient(tok, ["7"]), format="json")


def test_registered_by_name():
    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise AssertionError(
            f"{DISTRIBUTION} is not installed; run `pip install -e .` in the plugin folder first"
        ) from None

    loop, tool = get_agent_loop("my_agent"), get_tool("my_lookup")
    assert loop.fn is my_agent and not loop.single_generate
    assert loop.options == {"format": "hermes", "default_tool": "", "max_think_tokens": 0}
    assert tool.fn is my_lookup and tool.openai_schema()["function"]["parameters"]["properties"] == {
        "key": {"type": "string", "description": "the entry to look up (leave it out for all)"}
    }
    manager = get_plugin_manager()
    for kind, name in ((AGENT_LOOPS, "my_agent"), (TOOLS, "my_lookup")):
        [registration] = manager.registry(kind).by_name[name]
        assert (registration.source.distribution, registration.source.version) == (DISTRIBUTION, version)

    # as the trainer runs it (trainer/agent_rollout.py): by name, options checked, one row per sample
    tok = build_char_tokenizer()
    tools = ToolBox.from_names(["my_lookup"])
    with pytest.raises(ValueError, match=r"has no option\(s\) \['max_turns'\]"):
        AgentRunner(loop, {"max_turns": 2}, tools, tok, 8, tok.pad_token_id)
    runner = AgentRunner(loop, COMPACT, tools, tok, 8, tok.pad_token_id)
    prompt = request(tok, 8).prompt_ids
    prompts = DataProto.from_dict(
        {"input_ids": torch.tensor([prompt]), "attention_mask": torch.ones(1, len(prompt), dtype=torch.long)},
        non_tensors={"extra_info": np.array([ROW["extra_info"]], dtype=object)},
        meta_info={"n": 1},
    )
    out = runner.run(prompts, lambda count: ScriptedClient(tok, ["?", "7"]))
    assert out.batch["response_mask"][0].tolist() == [1, 0, 0, 0, 0, 0, 1, 1]
    assert out.batch["attention_mask"][0, len(prompt) :].tolist() == [1] * 8  # observations are attended to
    metrics = out.meta_info["metrics"]
    assert (
        metrics["agent/turns/mean"],
        metrics["agent/tool_calls/mean"],
        metrics["agent/observation_tokens/mean"],
    ) == (2.0, 1.0, 5.0)

"""Agent loops, tools and the batcher, on one process (no Ray).

Most tests drive the loops with the real tiny model through the real
``GenerationBatcher``; the layout and error tests use ``ScriptedClient``, a
stand-in for the policy that returns fixed turns (said here: it replaces the
model only, the loop, tool box, formats and assembly are the real ones).
"""

import asyncio
import time

import numpy as np
import pytest
import torch

from hybridflow.agents import AgentRequest, AgentRunner, Completion, ToolBox, ToolCall
from hybridflow.agents.batcher import GenerationBatcher
from hybridflow.agents.calculator import evaluate
from hybridflow.agents.formats import FORMATS, observation_ids
from hybridflow.agents.python_tool import run_code
from hybridflow.agents.server import engine_generate_fn
from hybridflow.agents.tool_calling import tool_calling
from hybridflow.agents.toolbox import cut_middle
from hybridflow.core import DataProto
from hybridflow.core.rollout_batch import left_pad
from hybridflow.core.sampling import SamplingParams
from hybridflow.data.synthetic_tool import make_tool_example
from hybridflow.plugins import Tool, ToolError, get_agent_loop
from hybridflow.rewards.tool_task import compute_score
from hybridflow.workers.models import load_model_and_tokenizer
from hybridflow.workers.rollout.engine import BuiltinEngine


@pytest.fixture(scope="module")
def policy():
    torch.set_num_threads(1)
    model, tokenizer = load_model_and_tokenizer("builtin:tiny-qwen2", seed=0)
    return BuiltinEngine(model, tokenizer), tokenizer


def counted_generate_fn(engine, calls):
    """The server's in-process generate_fn (the actor worker's contract), counting calls and reporting version 3."""
    generate = engine_generate_fn(engine)

    def counted(prompts):
        calls.append(len(prompts))
        out = generate(prompts)
        out.meta_info["weight_version"] = 3
        return out

    return counted


def chat_ids(tokenizer, messages):
    """A prompt's tokens as the prompt loader makes them: the template's text, tokenized without additions."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def tool_prompts(tokenizer, hidden=(7, 5, 9, 6), n=2, greedy=False):
    rows = [make_tool_example([1, 2, 3], h, split="val", index=i) for i, h in enumerate(hidden)]
    ids = [chat_ids(tokenizer, r["prompt"]) for r in rows]
    input_ids, mask, _ = left_pad(ids, tokenizer.pad_token_id)
    return DataProto.from_dict(
        {"input_ids": input_ids, "attention_mask": mask},
        non_tensors={
            "extra_info": np.array([r["extra_info"] for r in rows], dtype=object),
            "uid": np.array([str(i) for i in range(len(rows))], dtype=object),
        },
        meta_info={"n": n, "greedy": greedy, "seed": 5},
    )


class ScriptedClient:
    """Returns the given turns (text) in order, as a policy would, with log-prob -0.5 per token."""

    def __init__(self, tokenizer, turns, eos=True):
        self.tokenizer, self.turns, self.eos, self.prompts = tokenizer, list(turns), eos, []

    async def generate(self, prompt_ids, *, max_tokens, stop_token_ids=()):
        self.prompts.append(list(prompt_ids))
        text = self.turns.pop(0)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if self.eos and not (ids and ids[-1] in stop_token_ids):
            ids.append(self.tokenizer.eos_token_id)
        reason = "stop" if len(ids) <= max_tokens else "length"
        ids = ids[:max_tokens]
        return Completion(ids, [-0.5] * len(ids), reason, 0)


def request_for(tokenizer, hidden=7, budget=8):
    row = make_tool_example([1, 2, 3], hidden, split="val", index=0)
    return AgentRequest(chat_ids(tokenizer, row["prompt"]), {"extra_info": row["extra_info"]}, tokenizer, budget)


COMPACT = {"format": "compact", "default_tool": "reveal", "max_turns": 2}


def test_a_tool_call_trajectory_masks_the_observation(policy):
    _, tok = policy
    client = ScriptedClient(tok, ["?", "7"])
    traj = asyncio.run(tool_calling(request_for(tok), client, ToolBox.from_names(["reveal"]), **COMPACT))
    obs = observation_ids(tok, ["7"])
    assert tok.decode(obs) == "<|system|>7<|assistant|>"
    question, seven, eos = tok.convert_tokens_to_ids(["?", "7", "<eos>"])
    assert traj.response_ids == [question, *obs, seven, eos]
    assert traj.loss_mask == [1, 0, 0, 0, 1, 1]
    assert traj.log_probs == [-0.5, 0.0, 0.0, 0.0, -0.5, -0.5]
    assert (traj.turns, traj.tool_calls, traj.tool_errors, traj.truncated) == (2, 1, 0, False)
    # the second turn saw the prompt, the call and the observation: exactly the trajectory so far
    assert client.prompts[1] == request_for(tok).prompt_ids + [question, *obs]


def test_the_verifier_scores_the_answer_after_the_last_call():
    called, not_called = {"tool_calls": 1}, {"tool_calls": 0}
    assert compute_score("synthetic/tool", "?7", "7", called) == {"score": 1.0, "called": 1.0}
    assert compute_score("synthetic/tool", "?5", "7", called) == {"score": pytest.approx(0.1), "called": 1.0}
    assert compute_score("synthetic/tool", "7", "7", not_called) == {"score": 1.0, "called": 0.0}
    assert compute_score("synthetic/tool", "5", "7", not_called) == {"score": 0.0, "called": 0.0}
    assert compute_score("synthetic/tool", "7?", "7", called)["score"] == 0.0  # a call, but no answer after it
    assert compute_score("synthetic/tool", "?", "7", called)["score"] == 0.0
    # a "?" the loop did not run as a call (malformed, or on the last turn) earns no bonus: the text cannot claim one
    assert compute_score("synthetic/tool", "5?", "7", not_called)["score"] == 0.0
    assert compute_score("synthetic/tool", "?5", "7", None)["score"] == 0.0


def test_the_budget_is_never_exceeded(policy):
    _, tok = policy
    # "?" + 3 observation tokens leave 1 of 5: the answer "7<eos>" is cut, the trajectory is truncated
    traj = asyncio.run(
        tool_calling(
            request_for(tok, budget=5), ScriptedClient(tok, ["?", "7"]), ToolBox.from_names(["reveal"]), **COMPACT
        )
    )
    assert len(traj) == 5 and traj.truncated and traj.loss_mask == [1, 0, 0, 0, 1]
    # an observation that does not fit ends the trajectory before it
    traj = asyncio.run(
        tool_calling(request_for(tok, budget=3), ScriptedClient(tok, ["?"]), ToolBox.from_names(["reveal"]), **COMPACT)
    )
    assert traj.response_ids == [tok.convert_tokens_to_ids("?")] and traj.truncated


def hang(arguments, state):
    time.sleep(30)
    return "never"


def explode(arguments, state):
    raise RuntimeError("tool broke")


def flood(arguments, state):
    return "9" * 100_000


def not_text(arguments, state):
    return {"value": 7}


def bad_tools():
    return [Tool(name=f.__name__, fn=f) for f in (hang, explode, flood, not_text)]


@pytest.mark.parametrize(
    "call, status, text",
    [
        ("hang", "timeout", "error: hang timed out after 0.3 s"),
        ("explode", "error", "error: explode failed: RuntimeError: tool broke"),
        ("not_text", "error", "error: not_text returned dict, not text"),
        ("missing", "unknown", "error: unknown tool 'missing'; tools: explode, flood, hang, not_text"),
    ],
)
def test_a_failing_tool_becomes_an_error_observation(call, status, text):
    box = ToolBox(bad_tools(), timeout_s=0.3, max_observation_chars=64)
    start = time.monotonic()
    result = asyncio.run(box.call(ToolCall(call, {})))
    assert (result.status, result.text) == (status, text)
    assert time.monotonic() - start < 2.0


def test_a_flood_is_cut_and_counted():
    result = asyncio.run(ToolBox(bad_tools(), max_observation_chars=64).call(ToolCall("flood", {})))
    assert (result.status, result.truncated) == ("ok", True) and 56 <= len(result.text) <= 64
    head, marker, tail = result.text.partition("\n[... ")
    assert set(head) == {"9"} and marker and set(tail.rpartition("cut ...]\n")[2]) == {"9"}  # cut in the middle


def test_arguments_are_checked_against_the_schema():
    box = ToolBox.from_names(["calculator"])
    bad = [
        ({}, "missing ['expression']"),
        ({"expression": "1", "x": 2}, "unexpected ['x']"),
        ({"expression": 3}, "must be a JSON string, got int"),
    ]
    for arguments, message in bad:
        result = asyncio.run(box.call(ToolCall("calculator", arguments)))
        assert result.status == "invalid" and message in result.text
    assert asyncio.run(box.call(ToolCall("calculator", {"expression": "(2+3)*4"}))).text == "20"


def test_hermes_calls_are_parsed_and_malformed_ones_reported():
    fmt, box = FORMATS["hermes"], ToolBox.from_names(["calculator"])
    text = (
        'thinking <tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'
        '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"2\\"}"}</tool_call>'
        "<tool_call>{not json}</tool_call>"
    )
    calls, problems = fmt.parse(text, box, None)
    assert calls == [ToolCall("calculator", {"expression": "1+1"}), ToolCall("calculator", {"expression": "2"})]
    assert len(problems) == 1 and problems[0].startswith("error: the tool call is not JSON")
    assert fmt.parse("the answer is 4", box, None) == ([], [])


def test_the_calculator_refuses_anything_but_bounded_arithmetic():
    assert evaluate("2**10 - 7 // 2") == 1021 and evaluate("-1.5 * 2") == -3.0
    for expression, reason in [
        ("__import__('os')", "not Call"),
        ("9**9**9", "exponent larger"),
        ("1/0", "division"),
        ("a+1", "not Name"),
        ("1+", "not an arithmetic expression"),
    ]:
        with pytest.raises(ValueError, match=reason):
            evaluate(expression)


@pytest.mark.parametrize(
    "expression,reason",
    [
        ("1e999", "out of range"),
        ("1e999-1e999", "out of range"),
        ("-1e999", "out of range"),  # inf and nan literals
        ("1" + "0" * 150, "out of range"),
        ("1e101 * 0", "out of range"),  # a literal past the bound, whatever follows
        ("(-8)**0.5", "not a real number"),
        ("1e100 * 10", "out of range"),
    ],
)
def test_the_calculators_bounds_hold_for_literals_and_results(expression, reason):
    with pytest.raises(ValueError, match=reason):
        evaluate(expression)


def test_the_calculator_keeps_what_is_within_its_bounds():
    assert evaluate("10**64 * 10**36") == 10**100 and evaluate("1e100") == 1e100 and evaluate("2.5e-300") == 2.5e-300


def test_the_python_tool_runs_in_the_sandbox_and_is_killed_on_time():
    assert run_code({"code": "print(sum(range(5)))"}, {}).strip() == "10"
    with pytest.raises(ToolError, match="ZeroDivisionError"):
        run_code({"code": "1/0"}, {})
    start = time.monotonic()
    with pytest.raises(ToolError, match="killed"):
        run_code({"code": "while True: pass"}, {"timeout_s": 1.0})
    assert time.monotonic() - start < 5.0


def test_a_failing_programs_error_and_status_reach_the_policy_past_a_long_output():
    """Printed >= 512 characters, then failed: the observation was 512 characters of output and status ok."""
    box = ToolBox.from_names(["python"])
    result = asyncio.run(box.call(ToolCall("python", {"code": "print('x' * 5000)\nraise KeyError('lost')"})))
    assert result.status == "error" and result.truncated and len(result.text) <= box.max_observation_chars
    assert result.text.startswith("xxx") and "characters cut" in result.text
    assert result.text.rstrip().endswith("KeyError: 'lost'") and "error: exit code 1" in result.text


def test_a_program_cannot_forge_an_infrastructure_error():
    """The sandbox's "unavailable" marker and exit status 71, printed by the program itself: a failed program
    (exit code 71, its own text), not the sandbox unavailable."""
    from hybridflow.sandbox import launcher as sandbox_launcher

    code = (
        f"import sys\nsys.stderr.write({sandbox_launcher.UNAVAILABLE_MARK!r} + ': namespaces\\n')\n"
        f"sys.exit({sandbox_launcher.EXIT_UNAVAILABLE})"
    )
    with pytest.raises(ToolError) as failed:
        run_code({"code": code}, {})
    assert "error: exit code 71" in str(failed.value) and "sandbox is unavailable" not in str(failed.value)


def test_an_observation_is_cut_in_the_middle_keeping_head_and_tail():
    text, cut = cut_middle("a" * 300 + "b" * 400 + "END", 100)
    assert cut and len(text) <= 100 and text.startswith("a") and text.endswith("bEND")
    assert "[... " in text and cut_middle("short", 100) == ("short", False)


def test_concurrent_loops_share_engine_calls(policy):
    engine, tok = policy
    calls = []
    runner = AgentRunner(
        get_agent_loop("tool_calling"), COMPACT, ToolBox.from_names(["reveal"]), tok, 8, tok.pad_token_id
    )
    prompts = tool_prompts(tok, n=4)

    def client(count):
        batcher = GenerationBatcher(
            counted_generate_fn(engine, calls), tok.pad_token_id, engine.eos_token_ids, seed=5, max_wait_s=5.0
        )  # long: only "every loop is waiting" may send a batch
        batcher.expect(count)
        return batcher

    out = runner.run(prompts, client)
    assert len(out) == 16 and calls[0] == 16  # the first turn of all 16 loops: one engine call
    assert sum(calls) == round(out.meta_info["metrics"]["agent/turns/mean"] * 16)  # every turn generated once
    assert len(calls) == 1 + (sum(calls) > 16)  # and the second turns, too, went as one call
    assert out.meta_info["weight_version"] == 3
    extra = out.non_tensor_batch["extra_info"]
    assert len({id(e) for e in extra}) == 16  # one dict per sample, not shared by a prompt's n
    assert sum(e["tool_calls"] for e in extra) == round(out.meta_info["metrics"]["agent/tool_calls/mean"] * 16)
    assert all(
        e["tools_kwargs"] == {"reveal": {"value": h}} for e, h in zip(extra, [7] * 4 + [5] * 4 + [9] * 4 + [6] * 4)
    )
    assert list(out.non_tensor_batch["uid"]) == [str(i) for i in range(4) for _ in range(4)]
    real = out.batch["attention_mask"][:, -8:]
    assert torch.all(out.batch["response_mask"] <= real)  # the loss mask lies inside the real tokens


def test_single_turn_through_the_runner_equals_the_engine(policy):
    engine, tok = policy
    prompts = tool_prompts(tok, n=1, greedy=True)
    runner = AgentRunner(get_agent_loop("single_turn"), {}, ToolBox([]), tok, 6, tok.pad_token_id)

    def client(count):
        batcher = GenerationBatcher(
            counted_generate_fn(engine, []), tok.pad_token_id, engine.eos_token_ids, greedy=True
        )
        batcher.expect(count)
        return batcher

    out = runner.run(prompts, client)
    direct = engine.generate(prompts, n=1, sampling=SamplingParams(max_new_tokens=6), greedy=True)
    for key in ("responses", "response_mask", "attention_mask", "position_ids", "input_ids"):
        assert torch.equal(out.batch[key], direct.batch[key]), key
    torch.testing.assert_close(out.batch["rollout_log_probs"], direct.batch["rollout_log_probs"], rtol=0, atol=1e-6)

"""How a policy writes a tool call, and how the answer is put back into the conversation.

Two call formats (``rollout.agent.options.format`` of the ``tool_calling`` loop):

``hermes``
    The format of Qwen2.5/Qwen3, Hermes and most instruct models' chat
    templates: ``<tool_call>{"name": "calculator", "arguments": {"expression":
    "2+3"}}</tool_call>``, any number per turn; the turn ends at EOS.
``compact``
    For the built-in character-level policy, which cannot write JSON: a turn
    that ends with ``?`` is a call. The text before it is ``name(argument)``,
    ``name``, or nothing (the loop's ``default_tool``, no arguments); ``?`` is
    a stop token, so the turn ends right there.

Observations are rendered by the tokenizer's chat template as ``tool``
messages (:func:`observation_ids`): the tokens the template puts between the
policy's end of turn and the start of its next turn, so the trajectory reads
like the conversation the model would see in deployment.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hybridflow.agents.toolbox import ToolBox, ToolCall

__all__ = ["CallFormat", "FORMATS", "observation_ids"]

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_COMPACT = re.compile(r"^\s*(?:([a-z_][a-z0-9_]*)\s*(?:\((.*)\))?)?\s*$", re.DOTALL)


@dataclass(frozen=True)
class CallFormat:
    """A tool-call syntax: what ends a turn and how its text becomes calls."""

    name: str
    parser: Callable[[str, ToolBox, str | None], tuple[list[ToolCall], list[str]]]
    stop_strings: tuple[str, ...] = ()
    """Text that ends a turn besides EOS (each must be one token of the tokenizer to be used)."""

    def parse(self, text: str, tools: ToolBox, default_tool: str | None) -> tuple[list[ToolCall], list[str]]:
        """The calls in one turn's text and the problems of malformed ones (each an error observation)."""
        return self.parser(text, tools, default_tool)

    def stop_token_ids(self, tokenizer: Any) -> list[int]:
        """The stop strings that are single tokens of ``tokenizer``, as ids."""
        ids = []
        for stop in self.stop_strings:
            encoded = tokenizer.encode(stop, add_special_tokens=False)
            if len(encoded) == 1:
                ids.append(int(encoded[0]))
        return ids


def _parse_hermes(text: str, tools: ToolBox, default_tool: str | None) -> tuple[list[ToolCall], list[str]]:
    calls, problems = [], []
    for body in _HERMES.findall(text):
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as exc:
            problems.append(f"error: the tool call is not JSON ({exc.msg} at character {exc.pos})")
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            problems.append('error: a tool call must be {"name": ..., "arguments": {...}}')
            continue
        arguments = payload.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                problems.append(f"error: the arguments of {payload['name']} are not JSON")
                continue
        calls.append(ToolCall(payload["name"], arguments))
    return calls, problems


def _parse_compact(text: str, tools: ToolBox, default_tool: str | None) -> tuple[list[ToolCall], list[str]]:
    if not text.endswith("?"):
        return [], []
    match = _COMPACT.match(text[:-1])
    if match is None:
        return [], [f"error: cannot read the call {text[:40]!r}; write name(argument)? or ?"]
    name, argument = match.group(1) or default_tool, match.group(2)
    if name is None:
        return [], ["error: no tool named and no default tool"]
    if argument is None:
        return [ToolCall(name, {})], []
    tool = tools.tools.get(name)
    params = list(tool.parameters.get("properties", {})) if tool is not None else []
    key = params[0] if len(params) == 1 else "argument"  # the one parameter a compact call can name
    return [ToolCall(name, {key: argument})], []


FORMATS = {
    fmt.name: fmt for fmt in (CallFormat("hermes", _parse_hermes), CallFormat("compact", _parse_compact, ("?",)))
}


def observation_ids(tokenizer: Any, texts: Sequence[str]) -> list[int]:
    """The tokens that answer a turn's tool calls: what the chat template renders for ``tool`` messages
    ``texts`` after an assistant turn, through the generation prompt of the next assistant turn.

    Found by rendering a conversation with and without the tool messages: the difference, starting right
    after the assistant's end-of-turn token (which the policy sampled itself), is the observation.
    """
    base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    before = tokenizer.apply_chat_template(base, tokenize=False)
    after = tokenizer.apply_chat_template(
        base + [{"role": "tool", "content": text} for text in texts], tokenize=False, add_generation_prompt=True
    )
    if not after.startswith(before):
        raise ValueError("the chat template renders earlier messages differently once a tool message follows")
    cut = len(before)
    end_of_turn = "a" + (tokenizer.eos_token or "")
    found = before.rfind(end_of_turn)
    if tokenizer.eos_token and found >= 0:  # what the template adds after the end token is the observation's
        cut = found + len(end_of_turn)
    return list(tokenizer.encode(after[cut:], add_special_tokens=False))

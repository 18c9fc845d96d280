"""The tools of a rollout, and how a call becomes an observation whatever the tool does.

A tool's function gets model-written arguments and may raise, hang, return
something that is not text, or flood its output. :meth:`ToolBox.call` turns
each of these into an observation the policy reads (``error: ...``) and a
status the trajectory counts, never an exception:

============  ==========================================================
status        when
============  ==========================================================
``ok``        returned a string
``unknown``   no such tool among ``rollout.agent.tools``
``invalid``   arguments missing, unexpected, or of the wrong JSON type
``error``     raised (:class:`~hybridflow.plugins.ToolError`: its message is
              the observation), or returned something other than a string
``timeout``   still running after ``timeout_s``
============  ==========================================================

An observation longer than ``max_observation_chars`` is cut in the middle
(``truncated``): its head and its tail stay, since a program's error and
exit status come last.

Each call runs in its own daemon thread: a hung tool is abandoned (its
thread ends with the process) and the loop moves on. Tools that run code
(``python``) bound their own work in a killable sandbox, so they never hang.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hybridflow.plugins.entries import Tool, ToolError

__all__ = ["ToolBox", "ToolCall", "ToolResult"]

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
}


@dataclass(frozen=True)
class ToolCall:
    """A call the policy wrote, as a parser read it."""

    name: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True)
class ToolResult:
    """What a call returned to the policy (``text``) and how it went (``status``, see the module docstring)."""

    name: str
    text: str
    status: str
    seconds: float = 0.0
    truncated: bool = False

    @property
    def failed(self) -> bool:
        """The observation is an error message, not the tool's answer."""
        return self.status != "ok"


class ToolBox:
    """The configured tools, by name, and a safe way to call them (module docstring).

    :param tools: the resolved tool records.
    :param timeout_s: the longest a call may run.
    :param max_observation_chars: longer observations are cut to this many characters.
    """

    def __init__(self, tools: Sequence[Tool], *, timeout_s: float = 5.0, max_observation_chars: int = 512) -> None:
        self.tools = {tool.name: tool for tool in tools}
        self.timeout_s, self.max_observation_chars = float(timeout_s), int(max_observation_chars)

    @classmethod
    def from_names(cls, names: Sequence[str], **kwargs: Any) -> ToolBox:
        """Tools resolved through the plugin manager (unknown names raise, listing the known tools)."""
        from hybridflow.plugins import get_tool  # noqa: PLC0415 - the plugin manager is loaded on first use

        return cls([get_tool(name) for name in names], **kwargs)

    def schemas(self) -> list[dict[str, Any]]:
        """The tools in the OpenAI ``tools`` format, for a chat template's ``tools=`` argument."""
        return [tool.openai_schema() for tool in self.tools.values()]

    async def call(self, call: ToolCall, state: Mapping[str, Any] | None = None) -> ToolResult:
        """Run one call; ``state`` is the row's ``tools_kwargs`` (tool name -> what its instance knows)."""
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "(none)"
            return ToolResult(call.name, f"error: unknown tool {call.name!r}; tools: {known}", "unknown")
        problem = _check_arguments(tool, call.arguments)
        if problem:
            return ToolResult(call.name, f"error: {problem}", "invalid")
        tool_state = dict((state or {}).get(call.name) or {})
        start = time.monotonic()
        status, value = await _in_daemon_thread(tool.fn, dict(call.arguments), tool_state, self.timeout_s)
        seconds = time.monotonic() - start
        if status == "timeout":
            return ToolResult(call.name, f"error: {call.name} timed out after {self.timeout_s:g} s", "timeout", seconds)
        if status == "error":
            return ToolResult(call.name, f"error: {call.name} failed: {value}", "error", seconds)
        if status == "failed":  # the tool's own account of a failed call
            text, cut = cut_middle(value, self.max_observation_chars)
            return ToolResult(call.name, text, "error", seconds, truncated=cut)
        if not isinstance(value, str):
            return ToolResult(
                call.name, f"error: {call.name} returned {type(value).__name__}, not text", "error", seconds
            )
        text, cut = cut_middle(value, self.max_observation_chars)
        return ToolResult(call.name, text, "ok", seconds, truncated=cut)


def cut_middle(text: str, limit: int) -> tuple[str, bool]:
    """``text`` in at most ``limit`` characters, and whether it was cut: its head (a third) and its tail, with a
    line in between saying how many characters were left out."""
    if len(text) <= limit:
        return text, False
    room = max(limit - len(f"\n[... {len(text)} characters cut ...]\n"), 0)  # the longest the line can be
    head, tail = room // 3, room - room // 3
    marker = f"\n[... {len(text) - room} characters cut ...]\n"
    return (text[:head] + marker + (text[len(text) - tail :] if tail else ""))[:limit], True


def _check_arguments(tool: Tool, arguments: Any) -> str:
    """Why ``arguments`` do not fit the tool's JSON schema, or ``""``."""
    if not isinstance(arguments, Mapping):
        return f"{tool.name} takes an object of arguments, got {type(arguments).__name__}"
    properties = tool.parameters.get("properties", {})
    missing = [name for name in tool.parameters.get("required", ()) if name not in arguments]
    unexpected = [name for name in arguments if name not in properties]
    if missing or unexpected:
        parts = ([f"missing {missing}"] if missing else []) + ([f"unexpected {unexpected}"] if unexpected else [])
        return f"{tool.name} arguments: {', '.join(parts)}; it takes {sorted(properties)}"
    for name, value in arguments.items():
        kind = properties[name].get("type")
        allowed = _JSON_TYPES.get(kind)
        if allowed and (not isinstance(value, allowed) or (kind != "boolean" and isinstance(value, bool))):
            return f"{tool.name} argument {name!r} must be a JSON {kind}, got {type(value).__name__}"
    return ""


async def _in_daemon_thread(fn: Any, arguments: dict, state: dict, timeout_s: float) -> tuple[str, Any]:
    """``("ok", value)``, ``("failed", message)`` (a :class:`ToolError`), ``("error", message)`` or
    ``("timeout", None)`` of ``fn(arguments, state)``."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def settle(outcome: tuple[str, Any]) -> None:
        if not done.done():
            done.set_result(outcome)

    def run() -> None:
        try:
            outcome = ("ok", fn(arguments, state))
        except ToolError as exc:
            outcome = ("failed", str(exc))
        except BaseException as exc:  # noqa: BLE001 - a tool's failure is an observation, whatever it is
            outcome = ("error", f"{type(exc).__name__}: {exc}"[:300])
        try:
            loop.call_soon_threadsafe(settle, outcome)
        except RuntimeError:  # the event loop closed while a hung tool ran
            pass

    threading.Thread(target=run, name="hybridflow-tool", daemon=True).start()
    try:
        return await asyncio.wait_for(done, timeout=timeout_s)
    except TimeoutError:
        return "timeout", None

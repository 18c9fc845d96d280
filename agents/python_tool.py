"""Tool ``python``: run model-written Python in the code verifier's sandbox and return what it printed.

The code runs as a fresh program in :func:`hybridflow.rewards.sandbox.run_python`
(namespaces, a fresh uid, CPU / memory / process / file limits and a
wall-clock kill of the whole process tree), so an infinite loop, a fork bomb
or a flood of output costs at most ``timeout_s`` and never touches the
trainer. The observation is stdout, then stderr's last lines when the program
failed, cut to ``max_output_chars`` (the tool box cuts observations again to
its own limit). Options come from the row's ``tools_kwargs["python"]`` when
present (``timeout_s``, ``memory_mb``), else the defaults below; a machine
without user namespaces runs the program with limits only when
``allow_unisolated`` is set there, as the ``code`` verifier does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hybridflow.plugins import Tool, hookimpl
from hybridflow.rewards.sandbox import SandboxLimits, SandboxUnavailableError, run_python

__all__ = ["run_code"]

DEFAULT_TIMEOUT_S = 3.0
MAX_OUTPUT_CHARS = 2048


def run_code(arguments: Mapping[str, Any], state: Mapping[str, Any]) -> str:
    """Run Python code in a sandbox and return its output."""
    timeout_s = float(state.get("timeout_s", DEFAULT_TIMEOUT_S))
    limits = SandboxLimits(wall_s=timeout_s, cpu_s=max(1, int(timeout_s)), memory_mb=int(state.get("memory_mb", 512)))
    try:
        result = run_python(arguments["code"], limits=limits, allow_unisolated=bool(state.get("allow_unisolated", False)),
                            stdout_limit=MAX_OUTPUT_CHARS)
    except SandboxUnavailableError as exc:
        return f"error: the sandbox is unavailable here ({exc})"
    if result.timed_out:
        return f"error: the program ran past {timeout_s:g} s and was killed"
    text = result.stdout[:MAX_OUTPUT_CHARS]
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-3:])
        text += f"\nerror: exit code {result.returncode}" + (f"\n{tail}" if tail else "")
    return text[:MAX_OUTPUT_CHARS]


@hookimpl
def hybridflow_register_tools(register):
    register(Tool(
        name="python", fn=run_code, description="Run a Python program and return what it prints.",
        parameters={"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    ))

"""Tool ``python``: run model-written Python in the code verifier's sandbox and return what it printed.

The code runs as a fresh program in :func:`hybridflow.sandbox.runner.run_python`
(namespaces, a fresh uid, CPU / memory / process / file limits and a
wall-clock kill of the whole process tree), so an infinite loop, a fork bomb
or a flood of output costs at most ``timeout_s`` and never touches the
trainer. The observation is stdout; when the program failed (a non-zero exit,
killed at its timeout, no sandbox here) the call raises
:class:`~hybridflow.plugins.ToolError` with stdout, the exit status and
stderr's last lines, so its status is ``error`` whatever the program printed.
Long output is cut in the middle, never the status at its end (the tool box
cuts observations again to its own limit, the same way). Options come from the row's ``tools_kwargs["python"]`` when
present (``timeout_s``, ``memory_mb``), else the defaults below; a machine
without user namespaces runs the program with limits only when
``allow_unisolated`` is set there, as the ``code`` verifier does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hybridflow.agents.toolbox import cut_middle
from hybridflow.plugins import Tool, ToolError, hookimpl
from hybridflow.sandbox.runner import SandboxLimits, SandboxUnavailableError, run_python

__all__ = ["run_code"]

DEFAULT_TIMEOUT_S = 3.0
MAX_OUTPUT_CHARS = 2048


def run_code(arguments: Mapping[str, Any], state: Mapping[str, Any]) -> str:
    """Run Python code in a sandbox and return what it printed; :class:`ToolError` when it failed."""
    timeout_s = float(state.get("timeout_s", DEFAULT_TIMEOUT_S))
    limits = SandboxLimits(wall_s=timeout_s, cpu_s=max(1, int(timeout_s)), memory_mb=int(state.get("memory_mb", 512)))
    try:
        result = run_python(
            arguments["code"],
            limits=limits,
            allow_unisolated=bool(state.get("allow_unisolated", False)),
            stdout_limit=MAX_OUTPUT_CHARS,
        )
    except SandboxUnavailableError as exc:  # the launcher's own word (its status channel), not the program's
        raise ToolError(f"error: the sandbox is unavailable here ({exc})") from None
    if result.timed_out:
        status = f"error: the program ran past {timeout_s:g} s and was killed"
    elif result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-3:])
        status = f"error: exit code {result.returncode}" + (f"\n{tail}" if tail else "")
    else:
        return cut_middle(result.stdout, MAX_OUTPUT_CHARS)[0]
    printed, _ = cut_middle(result.stdout, max(MAX_OUTPUT_CHARS - len(status) - 1, 0))
    raise ToolError((printed + "\n" if printed else "") + status[:MAX_OUTPUT_CHARS])


@hookimpl
def hybridflow_register_tools(register):
    register(
        Tool(
            name="python",
            fn=run_code,
            description="Run a Python program and return what it prints.",
            parameters={"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        )
    )

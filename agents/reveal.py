"""Tool ``reveal``: the hidden digit of a synthetic tool-task prompt (:mod:`hybridflow.data.synthetic_tool`).

Each prompt's instance knows one value, ``tools_kwargs["reveal"]["value"]``,
which the prompt shows only as ``?``; the tool takes no arguments and
returns it as text. A prompt without one gets an error observation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hybridflow.plugins import Tool, hookimpl


def reveal(arguments: Mapping[str, Any], state: Mapping[str, Any]) -> str:
    """The value this prompt hides behind its ?."""
    if "value" not in state:
        raise LookupError("this prompt hides nothing")
    return str(state["value"])


@hookimpl
def hybridflow_register_tools(register):
    register(Tool(name="reveal", fn=reveal, description="Show the digit the prompt hides behind its ?."))

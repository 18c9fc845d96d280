"""Agent loops and tools: how a prompt becomes a (multi-turn, tool-using) trajectory.

A loop (``rollout.agent_loop``, an :class:`hybridflow.plugins.AgentLoop`
plugin) gets an :class:`AgentRequest` and a :class:`PolicyClient` and returns
a :class:`Trajectory` whose loss mask marks the tokens the policy sampled.
Tools (``rollout.agent.tools``, :class:`hybridflow.plugins.Tool` plugins) are
called through a :class:`ToolBox`. The driver runs the loops with an
:class:`AgentRunner` (``trainer/agent_rollout.py``). Built-ins: loops
``single_turn`` and ``tool_calling``; tools ``calculator``, ``python`` and
``reveal`` (the synthetic tool task's).
"""

from hybridflow.agents.client import Completion, PolicyClient
from hybridflow.agents.request import AgentRequest
from hybridflow.agents.runner import AgentRunner
from hybridflow.agents.toolbox import ToolBox, ToolCall, ToolResult
from hybridflow.agents.trajectory import Trajectory, assemble_trajectories

__all__ = [
    "AgentRequest",
    "AgentRunner",
    "Completion",
    "PolicyClient",
    "ToolBox",
    "ToolCall",
    "ToolResult",
    "Trajectory",
    "assemble_trajectories",
]

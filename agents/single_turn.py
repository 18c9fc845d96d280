"""``single_turn``: one generation of the prompt, every token the policy's (the default loop).

::

    response  = policy(prompt)            # up to rollout.response_length tokens
    loss_mask = 1 on every response token

It declares ``single_generate``: the driver runs it as one batched engine call
for the whole batch (the n samples of a prompt share its prefill), which is
what this function does for one prompt.
"""

from __future__ import annotations

from hybridflow.agents.client import PolicyClient
from hybridflow.agents.request import AgentRequest
from hybridflow.agents.toolbox import ToolBox
from hybridflow.agents.trajectory import Trajectory
from hybridflow.plugins import AgentLoop, hookimpl


async def single_turn(request: AgentRequest, client: PolicyClient, tools: ToolBox) -> Trajectory:
    """One response to the prompt, sampled by the policy."""
    completion = await client.generate(request.prompt_ids, max_tokens=request.max_response_tokens)
    trajectory = Trajectory()
    trajectory.add_generation(completion)
    trajectory.truncated = completion.finish_reason == "length"
    return trajectory


@hookimpl
def hybridflow_register_agent_loops(register):
    register(AgentLoop(name="single_turn", fn=single_turn, single_generate=True))

"""The plugin system: hook specifications, the manager, lookup by name.

Plugin authors need :data:`hookimpl` and the entry records
(:class:`AdvantageEstimator`, :class:`RewardVerifier`,
:class:`PolicyLoss`, :class:`BatchHook`, :class:`AgentLoop`, :class:`Tool`,
:class:`RolloutEngineEntry`);
the framework uses :func:`get_estimator`, :func:`get_reward_verifier`,
:func:`get_policy_loss`, :func:`get_batch_hook`, :func:`get_agent_loop`,
:func:`get_tool` and :func:`get_rollout_engine`.
"""

from hybridflow.plugins.entries import (
    AdvantageEstimator,
    AgentLoop,
    BatchHook,
    EstimatorInput,
    PolicyLoss,
    RewardVerifier,
    RolloutEngineEntry,
    Tool,
    ToolError,
)
from hybridflow.plugins.hookspecs import hookimpl
from hybridflow.plugins.manager import (
    PluginConflictError,
    PluginManager,
    UnknownNameError,
    get_agent_loop,
    get_batch_hook,
    get_estimator,
    get_plugin_manager,
    get_policy_loss,
    get_reward_verifier,
    get_rollout_engine,
    get_tool,
    reset_plugin_manager,
)

__all__ = [
    "AdvantageEstimator",
    "AgentLoop",
    "BatchHook",
    "EstimatorInput",
    "PluginConflictError",
    "PluginManager",
    "PolicyLoss",
    "RewardVerifier",
    "RolloutEngineEntry",
    "Tool",
    "ToolError",
    "UnknownNameError",
    "get_agent_loop",
    "get_batch_hook",
    "get_estimator",
    "get_plugin_manager",
    "get_policy_loss",
    "get_reward_verifier",
    "get_rollout_engine",
    "get_tool",
    "hookimpl",
    "reset_plugin_manager",
]

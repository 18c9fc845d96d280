"""The plugin system: hook specifications, the manager, lookup by name.

Plugin authors need :data:`hookimpl` and the entry records
(:class:`AdvantageEstimator`, :class:`RewardVerifier`,
:class:`PolicyLoss`, :class:`BatchHook`); the framework uses
:func:`get_estimator`, :func:`get_reward_verifier`,
:func:`get_policy_loss` and :func:`get_batch_hook`.
"""

from hybridflow.plugins.entries import AdvantageEstimator, BatchHook, EstimatorInput, PolicyLoss, RewardVerifier
from hybridflow.plugins.hookspecs import hookimpl
from hybridflow.plugins.manager import (
    PluginConflictError,
    PluginManager,
    UnknownNameError,
    get_batch_hook,
    get_estimator,
    get_plugin_manager,
    get_policy_loss,
    get_reward_verifier,
    reset_plugin_manager,
)

__all__ = [
    "AdvantageEstimator",
    "BatchHook",
    "EstimatorInput",
    "PluginConflictError",
    "PluginManager",
    "PolicyLoss",
    "RewardVerifier",
    "UnknownNameError",
    "get_batch_hook",
    "get_estimator",
    "get_plugin_manager",
    "get_policy_loss",
    "get_reward_verifier",
    "hookimpl",
    "reset_plugin_manager",
]

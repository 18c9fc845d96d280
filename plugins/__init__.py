"""The plugin system: hook specifications, the manager, lookup by name.

Plugin authors need :data:`hookimpl` and the entry records
(:class:`AdvantageEstimator`, :class:`RewardVerifier`); the framework uses
:func:`get_estimator` and :func:`get_reward_verifier`.
"""

from hybridflow.plugins.entries import AdvantageEstimator, RewardVerifier
from hybridflow.plugins.hookspecs import hookimpl
from hybridflow.plugins.manager import (
    PluginConflictError,
    PluginManager,
    UnknownNameError,
    get_estimator,
    get_plugin_manager,
    get_reward_verifier,
    reset_plugin_manager,
)

__all__ = [
    "AdvantageEstimator",
    "PluginConflictError",
    "PluginManager",
    "RewardVerifier",
    "UnknownNameError",
    "get_estimator",
    "get_plugin_manager",
    "get_reward_verifier",
    "hookimpl",
    "reset_plugin_manager",
]

"""The plugin manager: discovery, registration and lookup by name.

Discovery reads the ``hybridflow`` entry-point group of every installed
distribution (hybridflow's own built-ins included) and registers each module
with pluggy. ``HYBRIDFLOW_DISABLE_PLUGIN_AUTOLOAD=1`` keeps only the entry
points of the ``hybridflow`` distribution itself, for hermetic tests, in the
way ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` does for pytest.

Each kind of registry (estimators, reward verifiers, policy losses, batch hooks, agent loops, tools, rollout engines)
is filled lazily,
the first time a name of that kind is looked up, by calling every plugin's
register hook with a callback that records who registered what.
"""

from __future__ import annotations

import difflib
import importlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy

from hybridflow.plugins import hookspecs
from hybridflow.plugins.entries import (
    AdvantageEstimator,
    AgentLoop,
    BatchHook,
    PolicyLoss,
    RewardVerifier,
    RolloutEngineEntry,
    Tool,
)

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "hybridflow"
BUILTIN_DISTRIBUTION = "hybridflow"
DISABLE_AUTOLOAD_ENV = "HYBRIDFLOW_DISABLE_PLUGIN_AUTOLOAD"


@dataclass(frozen=True)
class RegistryKind:
    """One kind of named thing plugins provide, and the hook that collects it."""

    label: str  # for messages: "estimator"
    plural: str
    hook_name: str
    entry_type: type


ESTIMATORS = RegistryKind("estimator", "estimators", "hybridflow_register_estimators", AdvantageEstimator)
REWARD_VERIFIERS = RegistryKind(
    "reward verifier", "reward verifiers", "hybridflow_register_reward_verifiers", RewardVerifier
)
POLICY_LOSSES = RegistryKind("policy loss", "policy losses", "hybridflow_register_policy_losses", PolicyLoss)
BATCH_HOOKS = RegistryKind("batch hook", "batch hooks", "hybridflow_register_batch_hooks", BatchHook)
AGENT_LOOPS = RegistryKind("agent loop", "agent loops", "hybridflow_register_agent_loops", AgentLoop)
TOOLS = RegistryKind("tool", "tools", "hybridflow_register_tools", Tool)
ROLLOUT_ENGINES = RegistryKind(
    "rollout engine", "rollout engines", "hybridflow_register_rollout_engines", RolloutEngineEntry
)
KINDS = (ESTIMATORS, REWARD_VERIFIERS, POLICY_LOSSES, BATCH_HOOKS, AGENT_LOOPS, TOOLS, ROLLOUT_ENGINES)


@dataclass(frozen=True)
class PluginSource:
    """Where a plugin came from: its entry-point name and distribution."""

    plugin: str
    distribution: str
    version: str

    def __str__(self) -> str:
        return f"{self.plugin} ({self.distribution} {self.version})"


@dataclass(frozen=True)
class Registration:
    entry: Any
    source: PluginSource


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be imported or whose register hook raised."""

    source: PluginSource
    stage: str  # "import" or the hook name
    error: str


class UnknownNameError(LookupError):
    """Raised when a config names an estimator or verifier nobody registered."""


class PluginConflictError(LookupError):
    """Raised when two plugins registered the same name and it is looked up."""


@dataclass
class Registry:
    """Everything registered for one :class:`RegistryKind`, by name."""

    kind: RegistryKind
    by_name: dict[str, list[Registration]] = field(default_factory=dict)

    def get(self, name: str) -> Any:
        """The entry registered as ``name``; raises with the known names if none."""
        found = self.by_name.get(name)
        if not found:
            raise UnknownNameError(self._unknown_message(name))
        if len(found) > 1:
            who = " and ".join(f"{r.source.distribution} (plugin {r.source.plugin!r})" for r in found)
            raise PluginConflictError(
                f"{self.kind.label} {name!r} is registered by both {who}; uninstall one of them or "
                f"disable autoload with {DISABLE_AUTOLOAD_ENV}=1"
            )
        return found[0].entry

    def _unknown_message(self, name: str) -> str:
        close = difflib.get_close_matches(name, list(self.by_name), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        known = ", ".join(
            f"{n} [{', '.join(r.source.distribution for r in regs)}]" for n, regs in sorted(self.by_name.items())
        )
        return f"unknown {self.kind.label} {name!r}.{hint} Known {self.kind.plural}: {known or '(none installed)'}"

    def names(self) -> list[str]:
        return sorted(self.by_name)


class PluginManager:
    """Finds plugins, calls their register hooks, and resolves names."""

    def __init__(self, autoload: bool | None = None) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.sources: dict[str, PluginSource] = {}
        self.failures: list[PluginFailure] = []
        self._registries: dict[RegistryKind, Registry] = {}
        if autoload is None:
            autoload = os.environ.get(DISABLE_AUTOLOAD_ENV, "") not in ("1", "true", "yes")
        self.load_entry_points(builtins_only=not autoload)

    def load_entry_points(self, builtins_only: bool = False) -> None:
        """Import and register every ``hybridflow`` entry point (or just ours)."""
        seen: set[tuple[str, str]] = set()
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = ep.dist.name if ep.dist is not None else "<unknown>"
            version = ep.dist.version if ep.dist is not None else "?"
            # The same distribution can be visible twice (an editable install
            # plus its egg-info on sys.path); register it once.
            if (dist, ep.name) in seen or (builtins_only and dist != BUILTIN_DISTRIBUTION):
                continue
            seen.add((dist, ep.name))
            # Entry-point names are chosen per distribution; qualify one that
            # another distribution already uses so both can load.
            plugin_name = ep.name if ep.name not in self.sources else f"{dist}:{ep.name}"
            source = PluginSource(plugin_name, dist, version)
            try:
                module = ep.load()
            except Exception as exc:  # a broken plugin must not take the others down
                self._fail(source, "import", exc)
                continue
            self.register(module, source)

    def register(self, plugin: object, source: PluginSource) -> None:
        """Register one plugin object (a module, usually) under ``source.plugin``."""
        if source.plugin in self.sources:
            raise ValueError(f"a plugin named {source.plugin!r} is already registered by {self.sources[source.plugin]}")
        self.pm.register(plugin, name=source.plugin)
        self.sources[source.plugin] = source
        self._registries.clear()

    def _fail(self, source: PluginSource, stage: str, exc: BaseException) -> None:
        self.failures.append(PluginFailure(source, stage, f"{type(exc).__name__}: {exc}"))
        logger.warning("hybridflow plugin %s failed at %s: %s: %s", source, stage, type(exc).__name__, exc)

    def registry(self, kind: RegistryKind) -> Registry:
        """The filled registry of one kind (built on first use)."""
        if kind not in self._registries:
            self._registries[kind] = self._collect(kind)
        return self._registries[kind]

    def _collect(self, kind: RegistryKind) -> Registry:
        registry = Registry(kind)
        hook = getattr(self.pm.hook, kind.hook_name)
        # Each implementation is called on its own so every registration is
        # attributed to its plugin and one plugin's error stays its own.
        for impl in reversed(hook.get_hookimpls()):
            source = self.sources[impl.plugin_name]
            try:
                impl.function(register=self._register_callback(registry, source))
            except Exception as exc:
                self._fail(source, kind.hook_name, exc)
        return registry

    @staticmethod
    def _register_callback(registry: Registry, source: PluginSource) -> Callable[[Any], None]:
        kind = registry.kind

        def register(entry: Any) -> None:
            if not isinstance(entry, kind.entry_type):
                raise TypeError(
                    f"plugin {source}: {kind.hook_name} must register {kind.entry_type.__name__} objects, "
                    f"got {type(entry).__name__}"
                )
            existing = registry.by_name.setdefault(entry.name, [])
            if any(r.source == source for r in existing):
                raise ValueError(f"plugin {source} registered {kind.label} {entry.name!r} twice")
            existing.append(Registration(entry, source))

        return register

    def registered_by(self, plugin: str) -> dict[str, list[str]]:
        """For one plugin: kind (plural label) -> the names it registered."""
        out: dict[str, list[str]] = {}
        for kind in KINDS:
            for name, regs in self.registry(kind).by_name.items():
                if any(r.source.plugin == plugin for r in regs):
                    out.setdefault(kind.plural, []).append(name)
        return out


_manager: PluginManager | None = None


def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager, created on first use."""
    global _manager
    if _manager is None:
        _manager = PluginManager()
    return _manager


def reset_plugin_manager() -> None:
    """Forget the process-wide manager so the next lookup rediscovers plugins
    (after a ``pip install`` in a test, or a change of the autoload variable)."""
    global _manager
    _manager = None
    importlib.invalidate_caches()  # so newly installed distributions are seen


def get_estimator(name: str) -> AdvantageEstimator:
    """The advantage estimator registered as ``name``.

    Raises :class:`UnknownNameError` listing the known estimators (and the
    closest match) or :class:`PluginConflictError` naming both distributions.
    """
    return get_plugin_manager().registry(ESTIMATORS).get(name)


def get_reward_verifier(name: str) -> RewardVerifier:
    """The reward verifier registered as ``name``; errors as :func:`get_estimator`."""
    return get_plugin_manager().registry(REWARD_VERIFIERS).get(name)


def get_policy_loss(name: str) -> PolicyLoss:
    """The policy loss registered as ``name``; errors as :func:`get_estimator`."""
    return get_plugin_manager().registry(POLICY_LOSSES).get(name)


def get_batch_hook(name: str) -> BatchHook:
    """The batch hook registered as ``name``; errors as :func:`get_estimator`."""
    return get_plugin_manager().registry(BATCH_HOOKS).get(name)


def get_agent_loop(name: str) -> AgentLoop:
    """The agent loop registered as ``name``; errors as :func:`get_estimator`."""
    return get_plugin_manager().registry(AGENT_LOOPS).get(name)


def get_tool(name: str) -> Tool:
    """The tool registered as ``name``; errors as :func:`get_estimator`."""
    return get_plugin_manager().registry(TOOLS).get(name)


def get_rollout_engine(name: str) -> RolloutEngineEntry:
    """The rollout engine registered as ``name``; errors as :func:`get_estimator`."""
    return get_plugin_manager().registry(ROLLOUT_ENGINES).get(name)

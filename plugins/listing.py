"""``hybridflow plugins``: what is installed and what each plugin registered."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hybridflow.plugins.entries import CRITIC_VALUES, GROUP_IDS, AdvantageEstimator, AgentLoop, BatchHook
from hybridflow.plugins.manager import AGENT_LOOPS, BATCH_HOOKS, ESTIMATORS, KINDS, PluginManager, RegistryKind


def format_plugin_table(manager: PluginManager, verbose: bool = False) -> str:
    """A plain-text listing of what is installed, then failures and conflicts.

    By default one table per kind (estimators, reward verifiers, policy losses, batch hooks, agent loops,
    tools): a row per registered name with the distribution and version that registered it and, where the
    kind declares something, what: an estimator's needs (``critic``, ``groups``, the other batch columns it
    reads) and actor defaults, a batch hook's stage, whether an agent loop is one generation. With
    ``verbose`` one block per plugin instead: its distribution and version, the hooks it implements, the
    names it registered per kind, and for every name its options (keyword-only parameters and their
    defaults) and the first line of its docstring. Called by ``hybridflow plugins [--verbose]``.
    """
    lines = (_by_plugin(manager) if verbose else _by_kind(manager)) + _problems(manager)
    return "\n".join(lines) if lines else "no hybridflow plugins installed"


def _estimator_declares(entry: AdvantageEstimator) -> str:
    labels = {GROUP_IDS: "groups", CRITIC_VALUES: "critic"}
    needs = [labels.get(n, n.column + (" (optional)" if n.optional else "")) for n in entry.needs]
    defaults = ", ".join(f"{k}={v}" for k, v in entry.actor_defaults.items())
    return (", ".join(needs) or "-") + (f"; actor defaults: {defaults}" if defaults else "")


def _loop_declares(entry: AgentLoop) -> str:
    return "one generation" if entry.single_generate else "multi-turn"


def _hook_declares(entry: BatchHook) -> str:
    return entry.stage


_DECLARES: dict[RegistryKind, tuple[str, Callable[[Any], str]]] = {
    ESTIMATORS: ("needs", _estimator_declares),
    BATCH_HOOKS: ("stage", _hook_declares),
    AGENT_LOOPS: ("turns", _loop_declares),
}
"""The third column of a kind's table: its header and what an entry of that kind declares."""


def _by_kind(manager: PluginManager) -> list[str]:
    tables = []
    for kind in KINDS:
        header, declares = _DECLARES.get(kind, ("", lambda entry: ""))
        rows = [
            (name, f"{reg.source.distribution} {reg.source.version}", declares(reg.entry))
            for name, regs in sorted(manager.registry(kind).by_name.items())
            for reg in regs
        ]
        if rows:
            tables.append(([(f"{kind.plural} ({len(rows)})", "distribution", header)], rows))
    if not tables:
        return []
    every = [row for heading, rows in tables for row in heading + rows]
    name_width = max(len(row[0]) for row in every) + 2
    dist_width = max(len(row[1]) for row in every)
    lines = []
    for heading, rows in tables:
        for indent, (name, dist, declared) in [("", heading[0]), *(("  ", row) for row in rows)]:
            lines.append(f"{indent}{name:<{name_width - len(indent)}}  {dist:<{dist_width}}  {declared}".rstrip())
    lines.append("(hybridflow plugins --verbose: each plugin's hooks, and each name's options and docstring)")
    return lines


def _by_plugin(manager: PluginManager) -> list[str]:
    lines: list[str] = []
    for plugin_name, source in sorted(manager.sources.items(), key=lambda kv: (kv[1].distribution or "", kv[0])):
        plugin = manager.pm.get_plugin(plugin_name)
        hooks = sorted(h.name for h in manager.pm.get_hookcallers(plugin) or [])
        lines.append(f"{plugin_name}  ({source.distribution} {source.version})")
        lines.append(f"    hooks: {', '.join(hooks) or '-'}")
        for plural, names in manager.registered_by(plugin_name).items():
            lines.append(f"    {plural}: {', '.join(sorted(names))}")
            kind = next(k for k in KINDS if k.plural == plural)
            lines.extend(_describe(manager, kind, plugin_name, name) for name in sorted(names))
    return lines


def _problems(manager: PluginManager) -> list[str]:
    lines = []
    for failure in manager.failures:
        lines.append(f"FAILED {failure.source} at {failure.stage}: {failure.error}")
    for kind in KINDS:
        for name, regs in manager.registry(kind).by_name.items():
            if len(regs) > 1:
                who = ", ".join(str(r.source) for r in regs)
                lines.append(f"CONFLICT {kind.label} {name!r} registered by {who}")
    return lines


def _describe(manager: PluginManager, kind: RegistryKind, plugin: str, name: str) -> str:
    entry = next(r.entry for r in manager.registry(kind).by_name[name] if r.source.plugin == plugin)
    options = ", ".join(f"{k}={v!r}" for k, v in entry.options.items())
    return f"        {name}({options}): {entry.summary or '(no docstring)'}"

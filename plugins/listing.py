"""``hybridflow plugins``: what is installed and what each plugin registered."""

from __future__ import annotations

from hybridflow.plugins.manager import KINDS, PluginManager, RegistryKind


def format_plugin_table(manager: PluginManager, verbose: bool = False) -> str:
    """A plain-text listing: one block per plugin, then failures and conflicts.

    Each block names the plugin, its distribution and version, the hooks it
    implements and the names it registered per kind. With ``verbose`` every
    registered name also gets a line with its options (keyword-only
    parameters and their defaults) and the first line of its docstring.
    Called by ``hybridflow plugins [--verbose]``.
    """
    lines: list[str] = []
    for plugin_name, source in sorted(manager.sources.items(), key=lambda kv: (kv[1].distribution or "", kv[0])):
        plugin = manager.pm.get_plugin(plugin_name)
        hooks = sorted(h.name for h in manager.pm.get_hookcallers(plugin) or [])
        lines.append(f"{plugin_name}  ({source.distribution} {source.version})")
        lines.append(f"    hooks: {', '.join(hooks) or '-'}")
        for plural, names in manager.registered_by(plugin_name).items():
            lines.append(f"    {plural}: {', '.join(sorted(names))}")
            if verbose:
                kind = next(k for k in KINDS if k.plural == plural)
                lines.extend(_describe(manager, kind, plugin_name, name) for name in sorted(names))
    for failure in manager.failures:
        lines.append(f"FAILED {failure.source} at {failure.stage}: {failure.error}")
    for kind in KINDS:
        for name, regs in manager.registry(kind).by_name.items():
            if len(regs) > 1:
                who = ", ".join(str(r.source) for r in regs)
                lines.append(f"CONFLICT {kind.label} {name!r} registered by {who}")
    return "\n".join(lines) if lines else "no hybridflow plugins installed"


def _describe(manager: PluginManager, kind: RegistryKind, plugin: str, name: str) -> str:
    entry = next(r.entry for r in manager.registry(kind).by_name[name] if r.source.plugin == plugin)
    options = ", ".join(f"{k}={v!r}" for k, v in entry.options.items())
    return f"        {name}({options}): {entry.summary or '(no docstring)'}"

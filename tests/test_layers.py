"""The import graph follows the architecture: each package imports only from the layers below it.

The graph is derived from the source (every ``import hybridflow.X`` and ``from hybridflow.X import``,
function-level imports included), so a new shortcut fails here, not in a reviewer's head.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# what the package does not import: the suite, benchmarks, data folders, run outputs, build output and script
NOT_PACKAGE = {"tests", "bench", "templates", "examples", "outputs", "docs", "multirun", "build", "dist", "setup.py"}

# Bottom to top. A package may import from a layer strictly below its own (or from itself); two packages
# of one layer do not import each other, which also rules out cycles between them.
LAYERS: list[set[str]] = [
    {"core"},  # the runtime, the batch, the layout, keys and small shared helpers
    {"plugins", "sandbox"},  # the registry and hookspecs; running untrusted code
    {"configs", "estimators", "losses", "rewards"},  # the config tree (and the roles it selects); plugin code
    # data parses ground truth with the verifiers' own parsers (rewards), so the two never disagree
    {"data", "workers", "agents", "recipes"},
    {
        "testing"
    },  # the contract kit: checks plugins (estimators, losses, verifiers, rollout engines) as workers run them
    {"trainer"},  # the RL driver and its entry point
    {"tools"},  # programs beside the driver
    {"cli"},  # the ``hybridflow`` command: its subcommands are the tools
    {"__main__"},
]
LAYER_OF = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def package_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def source_files() -> list[Path]:
    files = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in NOT_PACKAGE or rel.parts[0].startswith(".") or rel.parts[0].endswith(".egg-info"):
            continue
        if rel == Path("__init__.py"):
            continue
        files.append(path)
    return files


def imported_packages(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found.update(name.split(".")[1] for name in names if name.startswith("hybridflow."))
    return found


def import_graph() -> dict[str, dict[str, list[str]]]:
    """package -> imported package -> the files that import it."""
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in source_files():
        src = package_of(path)
        for dst in imported_packages(path) - {src}:
            graph[src][dst].append(str(path.relative_to(ROOT)))
    return graph


def upward_or_sideways(graph: dict[str, dict[str, list[str]]]) -> list[str]:
    bad = []
    for src, targets in sorted(graph.items()):
        for dst, files in sorted(targets.items()):
            if LAYER_OF[dst] >= LAYER_OF[src]:
                bad.append(f"{src} (layer {LAYER_OF[src]}) imports {dst} (layer {LAYER_OF[dst]}) in {', '.join(files)}")
    return bad


def cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in graph.get(node, {}):
            if state.get(nxt) == "open":
                found.append(path[path.index(nxt) :] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for start in sorted(graph):
        if start not in state:
            visit(start, [start])
    return found


def test_every_package_has_a_layer():
    packages = {package_of(p) for p in source_files()}
    assert packages - set(LAYER_OF) == set(), "a new top-level package needs a place in LAYERS"
    assert {"core", "trainer", "workers", "tools", "sandbox"} <= packages


def test_no_import_goes_up_or_sideways_and_no_cycle():
    graph = import_graph()
    assert upward_or_sideways(graph) == []
    assert cycles(graph) == []


def test_the_checks_see_a_shortcut_and_a_cycle():
    # the two checks are only worth something if they fire: a driver import from a worker, and a loop
    graph = import_graph()
    graph["workers"]["trainer"].append("workers/made_up.py")
    assert any(line.startswith("workers (layer 3) imports trainer (layer 5)") for line in upward_or_sideways(graph))
    assert cycles({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b": []}, "b": {}}) == []


@pytest.mark.parametrize("path", ["trainer/ppo_trainer.py", "workers/rollout/engine.py", "agents/server.py"])
def test_imports_are_found_in_real_files(path):
    assert "core" in imported_packages(ROOT / path)

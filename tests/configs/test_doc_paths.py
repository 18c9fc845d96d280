"""Every repository path and every command the README and docs/ name exists.

A moved module or a renamed bench script leaves a page pointing at nothing; a reader finds out
when they copy the path. This reads the pages, collects each path that names a file of this
repository (``bench/bench_vs_trl.py``, ``configs/roles.py``, ``docs/images/scaling.png``, links
included) and each command in a code span or a ``bash`` block (``hybridflow <subcommand>``,
``make <target>``, ``python -m hybridflow.<module>``, the console scripts), and checks them.
"""

from __future__ import annotations

import configparser
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# a relative path (links from docs/ start with ../) with at least one folder, ending in a file type this repository
# holds
PATH = re.compile(
    r"(?<![\w/.~$:-])((?:\.\./)*(?:[A-Za-z_][\w.-]*/)+[\w.-]*\w\.(?:py|md|yaml|sh|txt|png|cfg|toml|json))\b"
)
# Paths that are not this repository's files, by what they are: what a command writes (a compare
# directory, a sweep), a veRL script quoted for comparison, a plugin template's own tests, a file
# read from inside the sandbox; a config group file is named relative to configs/.
NOT_OURS = (
    re.compile(r"^(cmp|multirun|outputs|checkpoints)/"),
    re.compile(r"^examples/\w+_trainer/"),  # veRL's examples folders (ours have no _trainer folder)
    re.compile(r"^hybridflow/__init__\.py$"),  # as the sandbox would see it (docs/reliability.md)
)
SEARCH_ROOTS = ("", "configs/", "templates/estimator-plugin/", "templates/reward-plugin/", "templates/agent-plugin/")

CODE = re.compile(r"`([^`\n]+)`|```bash\n(.*?)```", re.S)
HYBRIDFLOW_SUBCOMMAND = re.compile(r"(?:^|[\s;(|&])hybridflow\s+([a-z][a-z-]*)")
MAKE_TARGET = re.compile(r"(?:^|[\s;(|&])make\s+([a-z][a-z-]*)\b")
MODULE = re.compile(r"python3?\s+-m\s+(hybridflow(?:\.\w+)*)")
CONSOLE_SCRIPT = re.compile(r"(?:^|[\s/;(|&])(hybridflow-[a-z-]+)")


def paths_named(page: Path) -> set[str]:
    return {m.group(1) for m in PATH.finditer(page.read_text(encoding="utf-8"))}


def exists(path: str, page: Path) -> bool:
    if any(rule.search(path) for rule in NOT_OURS):
        return True
    return (page.parent / path).exists() or any((ROOT / prefix / path).exists() for prefix in SEARCH_ROOTS)


def code_spans(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    return [inline or block for inline, block in CODE.findall(text)]


def cli_subcommands() -> set[str]:
    from hybridflow.cli import build_parser

    parser = build_parser()
    return set(next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices)


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([a-z][a-z-]*):", text, re.M))


def console_scripts() -> set[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = cfg["options.entry_points"]["console_scripts"].strip().splitlines()
    return {line.split("=")[0].strip() for line in lines if "=" in line}


def commands_named(page: Path) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {"hybridflow": set(), "make": set(), "module": set(), "script": set()}
    for span in code_spans(page):
        found["hybridflow"] |= set(HYBRIDFLOW_SUBCOMMAND.findall(span))
        found["make"] |= set(MAKE_TARGET.findall(span))
        found["module"] |= set(MODULE.findall(span))
        found["script"] |= set(CONSOLE_SCRIPT.findall(span))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_path_a_page_names_exists(page):
    assert sorted(p for p in paths_named(page) if not exists(p, page)) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_a_page_names_exists(page):
    named = commands_named(page)
    assert named["hybridflow"] - cli_subcommands() == set()
    assert named["make"] - make_targets() == set()
    assert named["script"] - console_scripts() == set()
    assert [m for m in sorted(named["module"]) if importlib.util.find_spec(m) is None] == []


def test_the_pages_name_paths_and_commands():
    every_path = set().union(*(paths_named(p) for p in PAGES))
    assert {"configs/roles.py", "tests/test_layers.py", "bench/bench_vs_trl.py"} <= every_path
    commands = commands_named(ROOT / "README.md")
    assert {"compare", "plugins"} <= commands["hybridflow"] and {"run", "test", "docs"} <= commands["make"]


def test_a_missing_path_and_command_are_seen(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "See `trainer/foreign_keys.py`, [it](../bench/no_such.py); run `hybridflow frobnicate` "
        "and `make lints`.\n```bash\npython -m hybridflow.no_such_module\nhybridflow-nothing x=1\n```\n"
    )
    assert sorted(p for p in paths_named(page) if not exists(p, page)) == [
        "../bench/no_such.py",
        "trainer/foreign_keys.py",
    ]
    named = commands_named(page)
    assert named["hybridflow"] - cli_subcommands() == {"frobnicate"}
    assert named["make"] - make_targets() == {"lints"}
    assert named["script"] - console_scripts() == {"hybridflow-nothing"}
    assert importlib.util.find_spec("hybridflow.no_such_module") is None


def test_the_readme_is_a_front_page():
    """At most 160 lines: what it is, the two commands, the layout, three paths, the links; the rest is in docs/."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 160, len(lines)

"""The plugin templates work as the docs say: copy, ``pip install -e .``, run their tests, list them.

Each template folder is copied to a temporary directory, installed in
editable mode into this interpreter's environment (as
``docs/writing-an-estimator.md`` tells an author to), its own test file is
run with pytest in a fresh interpreter, and ``hybridflow plugins`` must list
the plugin with its distribution, version and what it registered.
"""

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from hybridflow.plugins import reset_plugin_manager

pytestmark = pytest.mark.serial  # it pip-installs into the venv every other test reads

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


@dataclass(frozen=True)
class Template:
    folder: str
    distribution: str
    module: str
    plugin: str  # the entry-point name
    listing: str  # the line `hybridflow plugins` prints for what it registered
    verbose: str  # the start of its `hybridflow plugins --verbose` line
    more: tuple[str, ...] = ()  # the starts of the lines after those, for a plugin that registers two kinds


ESTIMATOR = Template(
    "estimator-plugin", "hybridflow-my-estimator", "hybridflow_my_estimator", "my_estimator",
    "    estimators: my_estimator", "        my_estimator(clip=1.0): Outcome score minus its group's mean score",
)  # fmt: skip
REWARD = Template(
    "reward-plugin", "hybridflow-my-reward", "hybridflow_my_reward", "my_reward",
    "    reward verifiers: my_reward", "        my_reward(tolerance=4.0): ",
)  # fmt: skip
AGENT = Template(
    "agent-plugin", "hybridflow-my-agent", "hybridflow_my_agent", "my_agent",
    "    agent loops: my_agent",
    "        my_agent(format='hermes', default_tool='', max_think_tokens=0): Think, call at most one tool, then answer",
    ("    tools: my_lookup", "        my_lookup(): Look up a key in this prompt's table"),
)  # fmt: skip


def run(*args, cwd=None):
    env = {k: v for k, v in os.environ.items() if k != "HYBRIDFLOW_DISABLE_PLUGIN_AUTOLOAD"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


@pytest.fixture(params=[ESTIMATOR, REWARD, AGENT], ids=lambda t: t.folder)
def installed(request, tmp_path, monkeypatch):
    template: Template = request.param
    monkeypatch.delenv("HYBRIDFLOW_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    source = tmp_path / template.folder
    shutil.copytree(TEMPLATES / template.folder, source)  # as an author would: a copy, then edit
    result = run(
        "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index", "-e", str(source)
    )
    assert result.returncode == 0, result.stderr
    reset_plugin_manager()
    try:
        yield template, source
    finally:
        run("-m", "pip", "uninstall", "--yes", template.distribution)
        sys.modules.pop(template.module, None)
        reset_plugin_manager()


def test_template_installs_passes_its_tests_and_is_listed(installed):
    template, source = installed

    own_tests = run("-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=source)
    assert own_tests.returncode == 0, own_tests.stdout + own_tests.stderr
    # both of its tests ran (the by-name test needs the install), none skipped
    summary = own_tests.stdout.strip().splitlines()[-1]
    passed = int(summary.split(" passed")[0].split()[-1])
    assert passed >= 2 and "skipped" not in summary and "failed" not in summary, summary

    listing = run("-m", "hybridflow", "plugins", "--verbose")
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    header = lines.index(f"{template.plugin}  ({template.distribution} 0.1.0)")
    block = lines[header + 1 : header + 4 + len(template.more)]
    assert block[1] == template.listing, block
    assert block[2].startswith(template.verbose), block
    assert all(line.startswith(start) for line, start in zip(block[3:], template.more, strict=True)), block


def test_template_tests_fail_clearly_when_not_installed(tmp_path):
    # without the install the by-name test must fail, and say what to do
    source = tmp_path / ESTIMATOR.folder
    shutil.copytree(TEMPLATES / ESTIMATOR.folder, source)
    result = run("-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "registered_by_name", "--rootdir", str(source),
                 str(source / "tests"), cwd=source)  # fmt: skip
    assert result.returncode == 1, result.stdout
    assert "run `pip install -e .` in the plugin folder first" in result.stdout

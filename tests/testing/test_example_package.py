"""The contract-kit example package works as its README says: install, run its own tests, which use the kit's fixtures.

``examples/contract-kit-example`` is copied to a temporary directory (so no
build output lands in the checkout), installed in editable mode without
touching the network, and its tests run with pytest in a fresh interpreter
from that directory: the fixtures must come from hybridflow's ``pytest11``
entry point alone, since the package has no conftest and imports nothing of
the kit. With the plugin switched off (``-p no:hybridflow``) the same tests
cannot find the fixtures.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import editable_install

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.serial,
]  # serial: it pip-installs into the venv every other test reads

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "contract-kit-example"
DISTRIBUTION = "hybridflow-kit-example"
CONTRACT_TESTS = (
    "test_group_rank_keeps_the_estimator_contract",
    "test_ppo_k3_keeps_the_loss_contract",
    "test_yes_no_keeps_the_verifier_contract",
)


def run(*args, cwd=None):
    # the example's by-name lookups need third-party plugins loaded
    env = {k: v for k, v in os.environ.items() if k != "HYBRIDFLOW_DISABLE_PLUGIN_AUTOLOAD"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=170, cwd=cwd, env=env)


@pytest.fixture
def installed_example(tmp_path):
    with editable_install(EXAMPLE, tmp_path, DISTRIBUTION, "hybridflow_kit_example") as source:
        yield source


def test_example_package_passes_its_own_tests_through_the_kit_fixtures(installed_example):
    own = run("-m", "pytest", "-v", "-p", "no:cacheprovider", cwd=installed_example)
    assert own.returncode == 0, own.stdout + own.stderr
    summary = own.stdout.strip().splitlines()[-1]
    assert "6 passed" in summary and "skipped" not in summary, summary  # three by hand, three through the kit
    for name in CONTRACT_TESTS:
        assert f"tests/test_kit_example.py::{name} PASSED" in own.stdout, own.stdout

    # without hybridflow's pytest plugin the contract tests have no fixtures: they come from the entry point
    off = run("-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:hybridflow", cwd=installed_example)
    assert off.returncode == 1, off.stdout
    assert "fixture 'check_estimator' not found" in off.stdout
    assert "3 passed, 3 errors" in off.stdout

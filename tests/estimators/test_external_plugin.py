"""The example plugin package, installed with pip as a user would."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hybridflow.core import DataProto
from hybridflow.estimators import compute_advantage
from hybridflow.plugins import UnknownNameError, get_plugin_manager, reset_plugin_manager
from hybridflow.plugins.manager import ESTIMATORS

pytestmark = pytest.mark.serial  # it pip-installs into the venv every other test reads

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "estimator-plugin"
DIST = "hybridflow-group-median"


def pip(*args):
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture
def installed_example(tmp_path, monkeypatch):
    monkeypatch.delenv("HYBRIDFLOW_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    source = tmp_path / "estimator-plugin"
    shutil.copytree(EXAMPLE, source)  # build in a copy: keep build/ and egg-info out of the repo
    result = pip("install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index", str(source))
    assert result.returncode == 0, result.stderr
    reset_plugin_manager()
    try:
        yield
    finally:
        pip("uninstall", "--yes", DIST)
        sys.modules.pop("hybridflow_group_median", None)
        reset_plugin_manager()


def test_example_plugin_round_trip(installed_example):
    # group g: scores 3, 0, 1, 10 -> median (1 + 3) / 2 = 2 ; group h: 5, 7, 6 -> median 6
    scores = [3.0, 0.0, 1.0, 10.0, 5.0, 7.0, 6.0]
    rewards = torch.zeros(7, 3)
    rewards[:, 1] = torch.tensor(scores)
    mask = torch.ones(7, 3)
    mask[4, 2] = 0
    data = DataProto.from_dict({"token_level_rewards": rewards, "response_mask": mask}, {"uid": ["g"] * 4 + ["h"] * 3})
    out = compute_advantage(data, "group_median", scale=0.5)
    expected = torch.tensor([1.0, -2.0, -1.0, 8.0, -1.0, 1.0, 0.0]) * 0.5
    assert torch.allclose(out.batch["advantages"][:, 0], expected)
    assert out.batch["advantages"][4, 2] == 0

    [reg] = get_plugin_manager().registry(ESTIMATORS).by_name["group_median"]
    assert reg.source.distribution == DIST

    listing = subprocess.run(
        [sys.executable, "-m", "hybridflow", "plugins"], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    # its row in the estimators' table: the name, the distribution that registered it, what it needs
    assert re.search(rf"^  group_median +{DIST} 0\.1\.0 +groups$", listing, re.M), listing

    assert pip("uninstall", "--yes", DIST).returncode == 0
    reset_plugin_manager()
    with pytest.raises(UnknownNameError, match="unknown estimator 'group_median'"):
        compute_advantage(data, "group_median")

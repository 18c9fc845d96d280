"""The verifier against scores worked out by hand, and its registration by name.

Run after ``pip install -e .`` (the second test needs the installed entry point).
"""

from importlib import metadata

import pytest

from hybridflow.plugins import get_plugin_manager, get_reward_verifier
from hybridflow.plugins.manager import REWARD_VERIFIERS

from hybridflow_my_reward import my_reward_score

DISTRIBUTION = "hybridflow-my-reward"


@pytest.mark.parametrize(
    "response,truth,tolerance,score,exact",
    [
        ("8", "8", 4.0, 1.0, 1.0),  # exact
        (" 7 because", "8", 4.0, 0.75, 0.0),  # 1 - 1/4
        ("5", "8", 2.0, 0.0, 0.0),  # 1 - 3/2 < 0 -> 0
        ("-2", "1", 6.0, 0.5, 0.0),  # 1 - 3/6
        ("x8", "8", 4.0, 0.0, 0.0),  # no leading integer
        ("8", "eight", 4.0, 0.0, 0.0),  # ground truth not an integer
    ],
)
def test_scores_by_hand(response, truth, tolerance, score, exact):
    out = my_reward_score("synthetic/arithmetic", response, truth, None, tolerance=tolerance)
    assert out == {"score": pytest.approx(score), "exact": exact}


def test_registered_by_name():
    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise AssertionError(f"{DISTRIBUTION} is not installed; run `pip install -e .` in the plugin folder first") from None

    entry = get_reward_verifier("my_reward")
    assert entry.fn is my_reward_score
    assert entry.options == {"tolerance": 4.0}
    [registration] = get_plugin_manager().registry(REWARD_VERIFIERS).by_name["my_reward"]
    assert (registration.source.distribution, registration.source.version) == (DISTRIBUTION, version)

"""The verifier against scores worked out by hand, its registration by name, and hybridflow's contract.

Run after ``pip install -e .`` (the last two tests need the installed entry
point). ``check_reward_verifier`` is a fixture of hybridflow's pytest plugin
(``hybridflow.testing``), loaded by pytest wherever hybridflow is installed.
"""

from importlib import metadata

import pytest
from hybridflow_my_reward import my_reward_score

from hybridflow.plugins import get_plugin_manager, get_reward_verifier
from hybridflow.plugins.manager import REWARD_VERIFIERS

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
        raise AssertionError(
            f"{DISTRIBUTION} is not installed; run `pip install -e .` in the plugin folder first"
        ) from None

    entry = get_reward_verifier("my_reward")
    assert entry.fn is my_reward_score
    assert entry.options == {"tolerance": 4.0}
    [registration] = get_plugin_manager().registry(REWARD_VERIFIERS).by_name["my_reward"]
    assert (registration.source.distribution, registration.source.version) == (DISTRIBUTION, version)


def test_keeps_the_verifier_contract(check_reward_verifier):
    # run as the reward manager runs it (worker processes, a timeout): finite scores, deterministic,
    # these cases exactly, and no exception on empty, 1 MB or non-ASCII text, as the docstring promises
    check_reward_verifier(
        "my_reward",
        cases=[("8", "8", 1.0), (" 7 because", "8", 0.75), ("x8", "8", 0.0), ("8", "eight", 0.0)],
        odd_responses_may_raise=False,
    )

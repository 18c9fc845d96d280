"""The estimator against numbers worked out by hand, its registration by name, and hybridflow's contract.

Run after ``pip install -e .`` (the last two tests need the installed entry
point). ``check_estimator`` is a fixture of hybridflow's pytest plugin
(``hybridflow.testing``), loaded by pytest wherever hybridflow is installed.
"""

from importlib import metadata

import torch
from hybridflow_my_estimator import my_estimator_advantage

from hybridflow.plugins import get_estimator, get_plugin_manager
from hybridflow.plugins.manager import ESTIMATORS

DISTRIBUTION = "hybridflow-my-estimator"


def test_advantages_by_hand():
    # group 0: scores 1, 0, 0, 3 -> mean 1 -> centred 0, -1, -1, 2 -> clip 1.5: 0, -1, -1, 1.5
    # group 1: scores 2, 0     -> mean 1 -> centred 1, -1
    # group 2: score 5 alone   -> centred 0
    scores = torch.tensor([1.0, 0.0, 0.0, 3.0, 2.0, 0.0, 5.0])
    rewards = torch.zeros(7, 3)
    rewards[:, 2] = scores  # an outcome reward sits on the last response token
    mask = torch.ones(7, 3)
    mask[3, 2] = 0.0  # a shorter response: its padding gets no advantage
    index = torch.tensor([0, 0, 0, 0, 1, 1, 2])

    advantages, returns = my_estimator_advantage(rewards, mask, index, clip=1.5)

    expected = torch.tensor([0.0, -1.0, -1.0, 1.5, 1.0, -1.0, 0.0])
    assert torch.allclose(advantages[:, 0], expected)
    assert torch.allclose(advantages[:, 1], expected)
    assert advantages[3, 2] == 0.0
    assert torch.equal(returns, advantages)

    # the default clip of 1.0 caps the 2.0 of row 3
    default, _ = my_estimator_advantage(rewards, mask, index)
    assert default[3, 0] == 1.0


def test_registered_by_name():
    try:
        version = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise AssertionError(
            f"{DISTRIBUTION} is not installed; run `pip install -e .` in the plugin folder first"
        ) from None

    entry = get_estimator("my_estimator")
    assert entry.fn is my_estimator_advantage
    assert entry.needs_groups and not entry.needs_critic
    assert entry.options == {"clip": 1.0}
    [registration] = get_plugin_manager().registry(ESTIMATORS).by_name["my_estimator"]
    assert (registration.source.distribution, registration.source.version) == (DISTRIBUTION, version)


def test_keeps_the_estimator_contract(check_estimator):
    # shapes, finite values, zero on padding, row and group order, equal scores -> 0, edge cases;
    # a failure names the property, the input and the numbers
    check_estimator("my_estimator")
    check_estimator("my_estimator", options={"clip": 0.1})

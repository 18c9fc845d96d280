"""The contract kit's pytest plugin: its checks as fixtures, in every test session where hybridflow is installed.

Registered in hybridflow's metadata under pytest's ``pytest11`` entry-point
group as ``hybridflow``, so a plugin package's tests request the fixtures
by name, with no import and no conftest; ``pytest -p no:hybridflow`` turns
it off, and ``pytest -p hybridflow`` turns it back on under
``PYTEST_DISABLE_PLUGIN_AUTOLOAD``. Each fixture is the check function of
:mod:`hybridflow.testing` itself; its keywords declare the properties a
formula does not imply.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import hybridflow.testing as kit


@pytest.fixture
def check_estimator() -> Callable[..., kit.ContractReport]:
    """``check_estimator(name_or_record, *, options=None, zero_on_masked=True, equal_rewards_give_zero=None,
    rejects=(), seed=0)``: the advantage-estimator contract (:mod:`hybridflow.testing.estimator_checks`)."""
    return kit.check_estimator


@pytest.fixture
def check_policy_loss() -> Callable[..., kit.ContractReport]:
    """``check_policy_loss(name_or_record, *, options=None, zero_advantage_gives_zero_gradient=True,
    policy_gradient_at_ratio_one=True, seed=0)``: the policy-loss contract (:mod:`hybridflow.testing.loss_checks`)."""
    return kit.check_policy_loss


@pytest.fixture
def check_reward_verifier() -> Callable[..., kit.ContractReport]:
    """``check_reward_verifier(name_or_record, *, cases=(), ground_truth=None, kwargs=None,
    odd_responses_may_raise=True, timeout_s=10.0, ...)``: the verifier contract
    (:mod:`hybridflow.testing.verifier_checks`)."""
    return kit.check_reward_verifier


@pytest.fixture
def check_rollout_engine() -> Callable[..., kit.ContractReport]:
    """``check_rollout_engine(name_or_record, *, config_overrides=None, log_prob_atol=1e-4, device="cpu")``: the
    rollout-engine contract (:mod:`hybridflow.testing.rollout_engine_checks`)."""
    return kit.check_rollout_engine

"""Samples whose reward failed stay out of the advantage and the loss (trainer/reward_failures.py); hand-computed."""

import logging
import math

import numpy as np
import pytest
import torch

from hybridflow.core import DataProto
from hybridflow.core.keys import (
    ADVANTAGES,
    RESPONSE_MASK,
    RETURNS,
    REWARD_FAILED,
    TOKEN_LEVEL_REWARDS,
    UID,
    VALUES,
)
from hybridflow.trainer.reward_failures import (
    FailedSteps,
    RewardUnavailableError,
    advantages_without_failures,
    rows_to_train,
)


def batch_of(scores, uids, failed=None, width=2):
    """One row per score, the score on the last of ``width`` valid tokens; ``failed`` rows marked."""
    rewards = torch.zeros(len(scores), width)
    rewards[:, -1] = torch.tensor(scores, dtype=torch.float32)
    columns = {
        TOKEN_LEVEL_REWARDS: rewards,
        RESPONSE_MASK: torch.ones(len(scores), width),
        VALUES: torch.zeros_like(rewards),
    }
    if failed is not None:
        columns[REWARD_FAILED] = torch.tensor(failed, dtype=torch.bool)
    return DataProto.from_dict(columns, {UID: np.array(uids, dtype=object)})


def test_a_failed_sample_leaves_its_grpo_groups_mean_and_std():
    """Group a: scores 1, 0, 1 and a failure (scored 0 as timeout_score would); group b: 1, 0, untouched.
    Over the three scored samples of a: mean 2/3, unbiased std sqrt(1/3), so A = +-(1/3)/sqrt(1/3), -(2/3)/sqrt(1/3)."""
    batch = batch_of([1, 0, 1, 0, 1, 0], ["a", "a", "a", "a", "b", "b"], [False, False, False, True, False, False])
    batch, trained, metrics = advantages_without_failures(batch, "grpo", {})
    std = math.sqrt(1 / 3)
    expected = [(1 / 3) / std, -(2 / 3) / std, (1 / 3) / std, 0.0, 0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5)]
    assert batch.batch[ADVANTAGES][:, -1].tolist() == pytest.approx(expected, abs=1e-5)
    assert trained.tolist() == [True, True, True, False, True, True]
    assert batch.batch[RESPONSE_MASK].sum(-1).tolist() == [2, 2, 2, 0, 2, 2]  # out of the loss too
    assert batch.batch[RETURNS][3].tolist() == [0.0, 0.0]
    assert metrics == {"reward/infra_failed_frac": pytest.approx(1 / 6), "reward/groups_dropped": 0.0}


def test_scored_as_a_wrong_answer_the_failure_would_have_shifted_the_group():
    """on_failure=score (no reward_failed column): the failure's 0 enters group a: mean 1/2, std sqrt(1/3)."""
    batch = batch_of([1, 0, 1, 0], ["a"] * 4)
    batch, trained, metrics = advantages_without_failures(batch, "grpo", {})
    std = math.sqrt(1 / 3)
    assert batch.batch[ADVANTAGES][:, -1].tolist() == pytest.approx([0.5 / std, -0.5 / std] * 2, abs=1e-5)
    assert trained.all() and metrics == {}


def test_a_failed_sample_leaves_the_others_leave_one_out_baselines():
    """RLOO over the scored 1, 0, 1: A_i = s_i - mean of the other two: 1 - 1/2, 0 - 1, 1 - 1/2."""
    batch = batch_of([1, 0, 1, 5], ["a"] * 4, [False, False, False, True])
    batch, _, _ = advantages_without_failures(batch, "rloo", {})
    assert batch.batch[ADVANTAGES][:, -1].tolist() == pytest.approx([0.5, -1.0, 0.5, 0.0])


def test_a_failed_sample_leaves_the_whitening_of_a_critics_advantages():
    """GAE (gamma = lam = 1, values 0, one token): A = the scores 1 and 3, whitened over those two:
    mean 2, unbiased variance 2, so -+1/sqrt(2); the failure's 100 would have dominated both."""
    batch = batch_of([1, 3, 100], ["a", "b", "c"], [False, False, True], width=1)
    batch, trained, metrics = advantages_without_failures(batch, "gae", {})
    assert batch.batch[ADVANTAGES][:, 0].tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2), 0.0], abs=1e-6)
    assert batch.batch[RETURNS][:, 0].tolist() == pytest.approx([1.0, 3.0, 0.0])
    assert metrics["reward/groups_dropped"] == 1.0  # group c has no row left


def test_a_group_left_with_one_scored_sample_is_dropped_when_the_estimator_compares_samples():
    failed = torch.tensor([False, True, False, False, False])
    uids = np.array(["a", "a", "b", "b", "c"], dtype=object)  # c: a group of one that lost nothing
    assert rows_to_train(failed, uids, groups=True).tolist() == [False, False, True, True, True]
    assert rows_to_train(failed, uids, groups=False).tolist() == [True, False, True, True, True]
    batch = batch_of([1, 0, 1, 0, 1], uids.tolist(), failed.tolist())
    batch, _, metrics = advantages_without_failures(batch, "grpo", {})
    assert batch.batch[RESPONSE_MASK].sum(-1).tolist() == [0, 0, 2, 2, 2]
    assert metrics["reward/groups_dropped"] == 1.0


def test_a_step_whose_every_reward_failed_trains_nothing_and_three_in_a_row_stop_the_run(caplog):
    steps = FailedSteps(limit=3)
    none, some = torch.zeros(4, dtype=torch.bool), torch.tensor([True, False, False, False])
    with caplog.at_level(logging.WARNING):
        assert not steps.trains(none, 1) and not steps.trains(none, 2)
    assert "step 2: no sample to train on (every reward failed, or left its group with fewer than two" in caplog.text
    assert "scored); the step trains nothing (2 of 3 such steps in a row)" in caplog.text
    assert steps.trains(some, 3)  # a step with a row to train resets the count
    assert not steps.trains(none, 4) and not steps.trains(none, 5)
    with pytest.raises(
        RewardUnavailableError, match="3 steps in a row \\(the last: step 6\\) had no sample to train on"
    ):
        steps.trains(none, 6)
    batch = batch_of([0, 0], ["a", "a"], [True, True])
    batch, trained, metrics = advantages_without_failures(batch, "grpo", {})
    assert not trained.any() and batch.batch[ADVANTAGES].abs().sum() == 0
    assert metrics == {"reward/infra_failed_frac": 1.0, "reward/groups_dropped": 1.0}

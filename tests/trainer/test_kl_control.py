import math

import pytest
import torch

from hybridflow.configs.schema import KLControlConfig
from hybridflow.core import DataProto
from hybridflow.trainer.kl_control import KLController, apply_kl_penalty


def test_fixed_controller_never_moves():
    ctl = KLController.from_config(KLControlConfig(type="fixed", kl_coef=0.05))
    ctl.update(current_kl=10.0, n_steps=100)
    assert ctl.value == 0.05


def test_adaptive_controller_follows_ziegler():
    ctl = KLController.from_config(KLControlConfig(type="adaptive", kl_coef=0.1, target_kl=1.0, horizon=100))
    ctl.update(current_kl=1.1, n_steps=10)  # error 0.1
    assert ctl.value == pytest.approx(0.1 * (1 + 0.1 * 10 / 100))
    ctl.update(current_kl=5.0, n_steps=10)  # error clipped to 0.2
    assert ctl.value == pytest.approx(0.1 * 1.01 * 1.02)


def test_bad_controller_type():
    with pytest.raises(ValueError, match="allowed: fixed, adaptive"):
        KLController.from_config(KLControlConfig(type="pid"))


def batch_for_penalty():
    # row 0: two valid tokens, d = log pi - log pi_ref = 0.5, 0.25; row 1: one valid token (d = 0.5) and a
    # masked one whose d = -2 must count for nothing
    return DataProto.from_dict(
        {
            "token_level_scores": torch.tensor([[0.0, 1.0], [0.0, 0.0]]),
            "old_log_probs": torch.tensor([[-1.0, -1.0], [-2.0, -3.0]]),
            "ref_log_probs": torch.tensor([[-1.5, -1.25], [-2.5, -1.0]]),
            "response_mask": torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
        }
    )


def test_penalty_subtracts_beta_times_kl_on_valid_tokens():
    batch = batch_for_penalty()
    metrics = apply_kl_penalty(batch, KLController(0.1), "k1")
    expected = torch.tensor([[0.0 - 0.1 * 0.5, 1.0 - 0.1 * 0.25], [0.0 - 0.1 * 0.5, 0.0]])
    assert torch.allclose(batch.batch["token_level_rewards"], expected)
    # the metric is the mean over sequences of each sequence's mean KL over its valid tokens
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(((0.5 + 0.25) / 2 + 0.5 / 1) / 2)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1
    assert KLController(0.1).adaptive is False  # a controller given only its value is a fixed one


def test_adaptive_controller_lowers_the_coefficient_at_most_by_the_clip():
    ctl = KLController.from_config(KLControlConfig(type="adaptive", kl_coef=0.1, target_kl=1.0, horizon=100))
    ctl.update(current_kl=0.9, n_steps=10)  # error -0.1
    assert ctl.value == pytest.approx(0.1 * (1 - 0.1 * 10 / 100))
    ctl.update(current_kl=0.0, n_steps=10)  # error -1, clipped to -0.2
    assert ctl.value == pytest.approx(0.1 * 0.99 * 0.98)


def test_the_metric_averages_each_sequence_over_its_own_valid_tokens():
    """Three rows of four tokens (the sums over rows and over tokens differ), one row with no valid token: it
    counts as zero KL, not as a division by zero."""
    d = torch.tensor([[0.5, 0.25, 0.0, 0.0], [1.0, 1.0, 1.0, 0.5], [0.75, 0.75, 0.75, 0.75]])
    batch = DataProto.from_dict(
        {
            "token_level_scores": torch.zeros(3, 4),
            "old_log_probs": d - 1.0,
            "ref_log_probs": torch.full((3, 4), -1.0),
            "response_mask": torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]),
        }
    )
    metrics = apply_kl_penalty(batch, KLController(0.1), "k1")
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(((0.5 + 0.25) / 2 + 3.5 / 4 + 0.0) / 3)


def test_penalty_with_k3_and_the_adaptive_controller():
    batch = batch_for_penalty()
    k3 = [math.exp(-d) - 1 + d for d in (0.5, 0.25, 0.5)]  # exp(log pi_ref - log pi) - 1 - (log pi_ref - log pi)
    ctl = KLController(0.2, adaptive=True, target_kl=0.01, horizon=100)
    metrics = apply_kl_penalty(batch, ctl, "k3")
    expected = torch.tensor([[-0.2 * k3[0], 1.0 - 0.2 * k3[1]], [-0.2 * k3[2], 0.0]])
    assert torch.allclose(batch.batch["token_level_rewards"], expected, atol=1e-6)
    current = ((k3[0] + k3[1]) / 2 + k3[2]) / 2
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(current, rel=1e-5)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.2  # the coefficient this batch was penalized with
    assert ctl.value == pytest.approx(0.2 * (1 + 0.2 * 2 / 100))  # KL far above target: error clipped to +0.2


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


def test_penalty_subtracts_beta_times_kl_on_valid_tokens():
    batch = DataProto.from_dict({
        "token_level_scores": torch.tensor([[0.0, 1.0], [0.0, 0.0]]),
        "old_log_probs": torch.tensor([[-1.0, -1.0], [-2.0, -3.0]]),
        "ref_log_probs": torch.tensor([[-1.5, -0.5], [-2.0, -1.0]]),
        "response_mask": torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
    })
    metrics = apply_kl_penalty(batch, KLController(0.1), "k1")
    assert torch.allclose(batch.batch["token_level_rewards"], torch.tensor([[-0.05, 1.05], [0.0, 0.0]]))
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(((0.5 - 0.5) / 2 + 0.0) / 2)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.1

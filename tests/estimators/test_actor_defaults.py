"""An estimator's ``actor_defaults`` hold only what the trainer applies (``configs/roles.py``): ``loss_agg_mode``.

Any other key would be silently ignored, so it is refused when the ``AdvantageEstimator`` is built, with the key
and the allowed ones named. Dr.GRPO declares its aggregation and not ``loss_scale_factor``: that constant's
default is the run's ``rollout.response_length`` (veRL's Dr.GRPO setting), not a number of the estimator's.
"""

import pytest
import torch

from hybridflow.configs.roles import resolve_loss_agg_mode, resolve_loss_scale_factor
from hybridflow.configs.schema import PPOConfig
from hybridflow.plugins import AdvantageEstimator, get_estimator, hookimpl
from hybridflow.plugins.entries import ACTOR_DEFAULT_KEYS
from hybridflow.plugins.manager import ESTIMATORS, PluginManager, PluginSource


def advantage(token_level_rewards, response_mask):
    return token_level_rewards, token_level_rewards


def test_an_unapplied_actor_default_is_refused_at_registration_naming_it():
    with pytest.raises(ValueError) as raised:
        AdvantageEstimator(
            name="my_est",
            fn=advantage,
            actor_defaults={"loss_agg_mode": "token-mean", "entropy_coeff": 0.01, "clip_ratio": 0.2},
        )
    assert str(raised.value) == (
        "estimator 'my_est': actor_defaults sets ['clip_ratio', 'entropy_coeff'], which the "
        "trainer does not apply; allowed: loss_agg_mode"
    )


def test_loss_scale_factor_is_not_an_estimator_default():
    with pytest.raises(ValueError, match=r"actor_defaults sets \['loss_scale_factor'\]"):
        AdvantageEstimator(name="my_est", fn=advantage, actor_defaults={"loss_scale_factor": 512})


def test_the_applied_key_is_accepted_and_applied():
    assert ACTOR_DEFAULT_KEYS == ("loss_agg_mode",)
    entry = AdvantageEstimator(name="my_est", fn=advantage, actor_defaults={"loss_agg_mode": "seq-mean-token-mean"})
    assert entry.actor_defaults == {"loss_agg_mode": "seq-mean-token-mean"}
    assert AdvantageEstimator(name="my_est", fn=advantage).actor_defaults == {}


def test_a_plugin_declaring_another_key_fails_at_registration_and_is_reported():
    class Plugin:
        @hookimpl
        def hybridflow_register_estimators(self, register):
            register(AdvantageEstimator(name="bad_est", fn=advantage, actor_defaults={"use_kl_loss": False}))

    manager = PluginManager(autoload=False)
    manager.register(Plugin(), PluginSource("bad-plugin", "test", None))
    assert "bad_est" not in manager.registry(ESTIMATORS).names()
    [failure] = manager.failures
    assert failure.stage == "hybridflow_register_estimators"
    assert "actor_defaults sets ['use_kl_loss']" in failure.error and "allowed: loss_agg_mode" in failure.error


def test_dr_grpo_gets_its_mode_and_the_response_length_as_its_constant():
    config = PPOConfig()
    config.algorithm.adv_estimator = "dr_grpo"
    config.actor_rollout_ref.rollout.response_length = 24
    assert get_estimator("dr_grpo").actor_defaults == {"loss_agg_mode": "seq-mean-token-sum-norm"}
    assert resolve_loss_agg_mode(config) == "seq-mean-token-sum-norm"
    assert resolve_loss_scale_factor(config) == 24
    advantages, _ = get_estimator("dr_grpo").fn(
        torch.tensor([[1.0], [0.0]]), torch.ones(2, 1), index=torch.tensor([0, 0])
    )
    assert advantages.flatten().tolist() == [0.5, -0.5]  # no std division

"""The README's headline claim, tested: the default job's policy learns the synthetic task by RL alone.

The default job (GRPO, 2 CPU ranks, builtin tiny model, 16 prompts x 8
samples), cut to 120 steps: greedy validation accuracy must rise by at least
0.5 (measured on a 2-core machine: 0.0 at step 0, about 0.65 at step 100,
about a minute of training). The same job with the advantages negated (a
test-only estimator: every update then pushes *away* from rewarded
responses) must not learn in a third as many steps, so the test fails for an update whose sign is wrong.
"""

from pathlib import Path
from types import ModuleType

import pytest
from omegaconf import OmegaConf

from hybridflow.configs import CONFIG_DIR
from hybridflow.configs.schema import PPOConfig
from hybridflow.estimators.grpo import grpo_advantage
from hybridflow.plugins import AdvantageEstimator, get_plugin_manager, hookimpl, reset_plugin_manager
from hybridflow.plugins.manager import PluginSource
from hybridflow.trainer.config_checks import check_config
from hybridflow.trainer.main import build_and_fit

pytestmark = pytest.mark.slow

STEPS = 120


def negated_grpo(token_level_rewards, response_mask, index):
    """GRPO with the sign flipped: rewarded responses become less likely."""
    advantages, returns = grpo_advantage(token_level_rewards, response_mask, index)
    return -advantages, -returns


@pytest.fixture
def negated_estimator():
    """``negated_grpo`` registered in this process (the estimator runs on the driver)."""
    plugin = ModuleType("negated_grpo_plugin")

    @hookimpl
    def hybridflow_register_estimators(register):
        register(AdvantageEstimator(name="negated_grpo", fn=negated_grpo, needs_groups=True))

    plugin.hybridflow_register_estimators = hybridflow_register_estimators
    get_plugin_manager().register(plugin, PluginSource("negated_grpo_plugin", "tests", "0"))
    yield "negated_grpo"
    reset_plugin_manager()


def default_job(tmp_path, estimator, steps=STEPS):
    cfg = OmegaConf.structured(PPOConfig)
    job = OmegaConf.load(Path(CONFIG_DIR) / "ppo_trainer.yaml")
    for key in ("actor_rollout_ref.actor.optim.lr", "actor_rollout_ref.rollout.response_length"):
        OmegaConf.update(cfg, key, OmegaConf.select(job, key))  # the default job's own values
    for key, value in {
        "algorithm.adv_estimator": estimator,
        "data.synthetic_dir": str(tmp_path / "data"),
        "trainer.total_training_steps": steps,
        "trainer.test_freq": steps // 2,
    }.items():
        OmegaConf.update(cfg, key, value)
    config = OmegaConf.to_object(cfg)
    check_config(config)
    return config


def test_the_default_job_learns_and_a_sign_flipped_update_does_not(ray_session, tmp_path, negated_estimator):
    learned = build_and_fit(default_job(tmp_path, "grpo"), tmp_path / "grpo")
    # a third as long (a minute less of the suite): a flipped update must not gain at all
    flipped = build_and_fit(default_job(tmp_path, negated_estimator, STEPS // 3), tmp_path / "flipped")
    before, after = learned.val_before["val/accuracy"], learned.val_after["val/accuracy"]
    assert after - before >= 0.5, (before, after)
    assert flipped.val_after["val/accuracy"] <= flipped.val_before["val/accuracy"] + 0.05, (
        flipped.val_before, flipped.val_after)

"""The README's headline claim, tested: the default job's policy learns the synthetic task by RL alone.

The default job (GRPO, 2 CPU ranks, builtin tiny model, 16 prompts x 8
samples), cut to 100 steps: greedy validation accuracy must rise by at least
0.5. The same job with the advantages negated (a test-only estimator: every
update then pushes *away* from rewarded responses), run for 80 steps, must not
gain at all, so the test fails for an update whose sign is wrong: 80 steps is
where a correct update first passes the bar on the test's seed.

Measured 2026-12-04 on a 2-core machine, the default job with validation every
10 steps: the step at which correct GRPO's accuracy first reaches 0.5 (from 0.0
at step 0) is 80 for seed 0, the test's (0.52; 0.65 at 100, 0.95 at 120), and
80, 120, 70 and 90 for seeds 1 to 4 (at 120: 0.76, 0.70, 0.66, 0.98). At step
40, where the control once stopped, correct GRPO had 0.0 to 0.36 (seed 0:
0.15; seeds 2 to 4: 0.0, which the control's bar would have passed). Negated,
seeds 0 to 2 stayed at 0.0 at every one of those points through step 120.
The two runs were 120 steps each until 2026-12-06; cut to 100 and 80 to keep
the suite inside its time (the test was ~10% of it).
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

STEPS = 100
CONTROL_STEPS = 80


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


def default_job(tmp_path, estimator, steps):
    cfg = OmegaConf.structured(PPOConfig)
    job = OmegaConf.load(Path(CONFIG_DIR) / "ppo_trainer.yaml")
    for key in ("actor_rollout_ref.actor.optim.lr", "actor_rollout_ref.rollout.response_length"):
        OmegaConf.update(cfg, key, OmegaConf.select(job, key))  # the default job's own values
    for key, value in {
        "algorithm.adv_estimator": estimator,
        "data.synthetic_dir": str(tmp_path / "data"),
        "trainer.total_training_steps": steps,
        "trainer.test_freq": steps,
    }.items():
        OmegaConf.update(cfg, key, value)
    config = OmegaConf.to_object(cfg)
    check_config(config)
    return config


def test_the_default_job_learns_and_a_sign_flipped_update_does_not(ray_session, tmp_path, negated_estimator):
    learned = build_and_fit(default_job(tmp_path, "grpo", STEPS), tmp_path / "grpo")
    # as long as the correct run needs to pass the bar (step 80 on seed 0): a flipped update must not gain at all
    flipped = build_and_fit(default_job(tmp_path, negated_estimator, CONTROL_STEPS), tmp_path / "flipped")
    before, after = learned.val_before["val/accuracy"], learned.val_after["val/accuracy"]
    assert after - before >= 0.5, (before, after)
    assert flipped.val_after["val/accuracy"] <= flipped.val_before["val/accuracy"] + 0.05, (
        flipped.val_before,
        flipped.val_after,
    )

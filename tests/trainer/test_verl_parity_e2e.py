"""veRL's loss keys through the real trainer: Dr.GRPO's constant, the critic's aggregation, the bypass mode.

Two steps of the default job on one CPU rank each; the numbers themselves are checked by hand in
``tests/workers/test_loss_scale_factor.py`` and ``tests/losses/test_bypass.py``, here that the workers take the
keys (a worker that dropped one would still train: the metrics show it did not).
"""

import json
import math

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from hybridflow.configs import CONFIG_DIR
from hybridflow.configs.schema import register_configs
from hybridflow.trainer.config_checks import check_config
from hybridflow.trainer.main import build_and_fit

pytestmark = pytest.mark.slow


def run(tmp_path, *overrides, steps=2):
    register_configs()
    base = [
        f"data.synthetic_dir={tmp_path}/data",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=0",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "trainer.n_gpus_per_node=1",
    ]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        config = OmegaConf.to_object(compose("ppo_trainer", overrides=[*base, *overrides]))
    check_config(config)
    build_and_fit(config, tmp_path / "run")
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


def test_dr_grpo_with_the_bypass_reinforce_loss_trains(ray_session, tmp_path):
    steps = run(
        tmp_path,
        "algorithm.adv_estimator=dr_grpo",
        "actor_rollout_ref.actor.loss_scale_factor=16",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl+",
        "algorithm.rollout_correction.bypass_mode=true",
        "algorithm.rollout_correction.loss_type=reinforce",
        "algorithm.rollout_correction.rollout_is=token",
        # the untrained policy's groups often score alike (advantage 0): an entropy term moves it anyway
        "actor_rollout_ref.actor.entropy_coeff=0.01",
        "actor_rollout_ref.actor.optim.lr=0.01",
    )
    for m in steps:
        assert math.isfinite(m["actor/pg_loss"]) and m["actor/kl_loss"] >= 0
        # the weights are the actor's, pi_current / pi_rollout: the second mini-batch of a step sees weights the
        # first one moved. The driver's (pi_old / pi_rollout, the same fp32 numbers here) would all be 1.
        assert m["rollout_corr/rollout_is_max"] > 1 + 1e-6 or m["rollout_corr/rollout_is_min"] < 1 - 1e-6


def test_the_critic_aggregates_with_its_own_mode(ray_session, tmp_path):
    """One mini-batch a step: at step 1 (same batch, same weights) the sequence mean of token sums is the token
    mean times the tokens per sequence, the mean response length."""
    one = "actor_rollout_ref.actor.ppo_mini_batch_size=8"
    token = run(tmp_path / "token", "algorithm.adv_estimator=gae", one, steps=1)[0]
    seq = run(tmp_path / "seq", "algorithm.adv_estimator=gae", one, "critic.loss_agg_mode=seq-mean-token-sum", steps=1)[
        0
    ]
    assert seq["response_length/mean"] == token["response_length/mean"]
    assert seq["critic/vf_loss"] == pytest.approx(token["critic/vf_loss"] * token["response_length/mean"], rel=1e-4)


def test_dr_grpo_divides_by_the_response_length_unless_a_constant_is_set(ray_session, tmp_path):
    """One mini-batch a step, so step 1's numbers come from the same batch under the same weights: the entropy
    term, aggregated as the loss is, halves when the constant doubles (the default job's responses: 4 tokens)."""
    common = (
        "algorithm.adv_estimator=dr_grpo",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.entropy_coeff=0.01",
        "actor_rollout_ref.rollout.response_length=4",
    )
    default = run(tmp_path / "default", *common, steps=1)[0]
    doubled = run(tmp_path / "doubled", *common, "actor_rollout_ref.actor.loss_scale_factor=8", steps=1)[0]
    assert default["actor/entropy"] > 0
    assert default["actor/entropy"] == pytest.approx(2 * doubled["actor/entropy"], rel=1e-5)

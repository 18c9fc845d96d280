"""``actor.recompute_old_log_prob``: when the rollout's own log-probs serve as ``old_log_probs``.

``auto`` skips the recompute only where the two are the same numbers (the
built-in engine in the training dtype); the e2e test checks that a 3-step run
with the rollout's log-probs trains like one that recomputes them.
"""

import pytest
from support import read_metrics, small_config

from hybridflow.configs.schema import PPOConfig
from hybridflow.core.keys import SUM_PI_SQUARED
from hybridflow.plugins import get_estimator
from hybridflow.trainer.estimator_inputs import InputPlan, input_problems, recompute_old_log_prob
from hybridflow.trainer.main import build_and_fit


def config_with(**changes) -> PPOConfig:
    config = PPOConfig()
    for dotted, value in changes.items():
        *path, key = dotted.split(".")
        section = config
        for name in path:
            section = getattr(section, name)
        setattr(section, key, value)
    return config


@pytest.mark.parametrize(
    "changes, recompute",
    [
        ({}, False),  # built-in engine, fp32 everywhere: the same numbers
        ({"actor_rollout_ref.rollout.name": "vllm"}, True),  # other kernels
        ({"actor_rollout_ref.actor.fsdp_config.param_dtype": "bfloat16"}, True),  # training computes in bf16
        ({"actor_rollout_ref.model.dtype": "bfloat16"}, True),  # both compute in bf16: their roundings differ
        ({"actor_rollout_ref.actor.fsdp_config.param_dtype": "float32"}, False),  # the model's own dtype
        ({"algorithm.rollout_correction.rollout_is": "token"}, True),  # the correction compares the two
        ({"trainer.rollout_mode": "one_step_off"}, True),  # the rollout's weights are a step older
        ({"trainer.rollout_mode": "async"}, True),
        ({"actor_rollout_ref.actor.recompute_old_log_prob": "True"}, True),  # Hydra's true, as a string
        ({"actor_rollout_ref.actor.recompute_old_log_prob": "false", "actor_rollout_ref.rollout.name": "vllm"}, False),
    ],
)
def test_auto_reuses_only_the_same_numbers(changes, recompute):
    assert recompute_old_log_prob(config_with(**changes), needs_pass=False) is recompute


def test_an_estimator_that_needs_the_pass_recomputes_and_false_is_refused_for_it():
    config = config_with(**{"algorithm.adv_estimator": "optimal_token_baseline"})
    estimator = get_estimator("optimal_token_baseline")
    assert SUM_PI_SQUARED in {need.column for need in estimator.needs}
    assert InputPlan.for_estimator(estimator, config).recompute_old_log_prob
    config.actor_rollout_ref.actor.recompute_old_log_prob = "false"
    problems = input_problems(estimator, config)
    assert any("recompute_old_log_prob=false" in p and "sum_pi_squared" in p for p in problems), problems


def test_a_bad_value_names_the_key():
    config = config_with(**{"actor_rollout_ref.actor.recompute_old_log_prob": "sometimes"})
    assert any("recompute_old_log_prob='sometimes'" in p for p in config.actor_rollout_ref.actor.problems())


@pytest.mark.slow
def test_rollout_log_probs_train_like_a_recompute(ray_session, tmp_path):
    runs = {}
    for setting in ("true", "auto"):
        config = small_config(
            tmp_path / setting,
            **{
                "actor_rollout_ref.actor.recompute_old_log_prob": setting,
                "trainer.logger": ["jsonl"],
            },
        )
        build_and_fit(config, tmp_path / setting / "run")
        runs[setting] = read_metrics(tmp_path / setting / "run")
    for true, auto in zip(runs["true"], runs["auto"]):
        assert "memory/old_log_prob/peak_gb" in true and "memory/old_log_prob/peak_gb" not in auto  # no worker call
        for key in ("actor/pg_loss", "actor/surrogate_gain", "actor/grad_norm", "actor/entropy", "score/mean"):
            assert auto[key] == pytest.approx(true[key], abs=1e-5), (key, auto[key], true[key])
        # the update's first forward against the rollout's log-probs: float noise
        assert auto["rollout/log_prob_gap_max"] < 1e-4 and true["rollout/log_prob_gap_max"] < 1e-4
        assert auto["driver/bytes_sent"] < true["driver/bytes_sent"]  # one call fewer

"""Recipes and declared estimator inputs through the real trainer: DAPO, ReMax, OTB, GDPO, rollout correction.

Each run is two or three steps of the default job (2 CPU ranks, builtin tiny model) composed from the config
tree as a user's command would be; the metrics show the declared work happened.
"""

import inspect
import json

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import hybridflow.trainer.ppo_trainer as ppo_trainer
from hybridflow.configs import CONFIG_DIR
from hybridflow.configs.schema import register_configs
from hybridflow.trainer.config_checks import check_config
from hybridflow.trainer.main import build_and_fit

pytestmark = pytest.mark.slow


def run(tmp_path, *overrides, steps=3):
    register_configs()
    base = [
        f"data.synthetic_dir={tmp_path}/data",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=0",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "trainer.n_gpus_per_node=1",
    ]  # one rank: the recipes, not the layout, are under test
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        config = OmegaConf.to_object(compose("ppo_trainer", overrides=[*base, *overrides]))
    check_config(config)
    build_and_fit(config, tmp_path / "run")
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


def test_dapo_is_an_experiment_and_a_hook_with_dynamic_sampling_active(ray_session, tmp_path):
    steps = run(tmp_path, "experiment=dapo")
    dropped = sum(m["batch_hooks/dynamic_sampling/dropped_groups"] for m in steps)
    assert dropped > 0  # the untrained policy scores many groups alike
    assert max(m["batch_hooks/rollout_batches"] for m in steps) >= 2  # so the step rolled out more prompts
    for m in steps:
        kept, rolled = m["batch_hooks/dynamic_sampling/kept_groups"], m["batch_hooks/rollout_batches"]
        assert (
            kept + m["batch_hooks/topped_up"] >= 8
            and rolled * 8 == kept + m["batch_hooks/dynamic_sampling/dropped_groups"]
        )
        assert m["reward/overlong/frac"] >= 0  # overlong shaping on
    # fit() and the train step know no recipe: DAPO lives in a YAML and a plugin
    source = inspect.getsource(ppo_trainer).lower()
    assert "dapo" not in source and "dynamic_sampling" not in source


@pytest.mark.parametrize(
    "overrides,metrics",
    [
        # a greedy baseline (remax) and rollout correction in one job: two declared inputs, one run
        (
            ["algorithm.adv_estimator=remax", "algorithm.rollout_correction.rollout_is=token"],
            ["reward/greedy_baseline/mean", "rollout_corr/rollout_is_mean"],
        ),
        (["algorithm.adv_estimator=optimal_token_baseline"], ["advantages/mean"]),
        (
            [
                "algorithm.adv_estimator=gdpo",
                "+reward.route={synthetic/arithmetic:{arithmetic:0.9,format:0.1}}",
                "reward.component_keys=[arithmetic/score,format/score]",
            ],
            ["advantages/mean"],
        ),
    ],
)
def test_declared_inputs_are_provided(ray_session, tmp_path, overrides, metrics):
    steps = run(tmp_path, *overrides, steps=2)
    for metric in metrics:
        assert all(metric in m for m in steps), metric
        if metric.startswith("rollout_corr"):  # the built-in engine samples with the training weights: w = 1
            assert all(abs(m[metric] - 1.0) < 1e-4 for m in steps)

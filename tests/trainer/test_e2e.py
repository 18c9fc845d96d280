"""End-to-end: the real trainer on a local Ray instance, 2 CPU ranks, a builtin tiny model.

Each estimator runs three steps of the whole loop (rollout, log-probs,
reward, advantage, update); the run's metrics.jsonl is read back.
"""

import json
import math

import pytest
from omegaconf import OmegaConf

from hybridflow.configs.schema import PPOConfig
from hybridflow.trainer.config_checks import check_config
from hybridflow.trainer.main import build_and_fit

pytestmark = pytest.mark.slow


def small_config(tmp_path, **overrides):
    cfg = OmegaConf.structured(PPOConfig)
    base = {
        "data.synthetic_dir": str(tmp_path / "data"),
        "data.train_batch_size": 4,
        "data.val_batch_size": 64,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
        "actor_rollout_ref.rollout.n": 4,
        "actor_rollout_ref.rollout.response_length": 4,
        "trainer.total_training_steps": 3,
        "trainer.test_freq": 0,
    }
    for key, value in {**base, **overrides}.items():
        OmegaConf.update(cfg, key, value)
    config = OmegaConf.to_object(cfg)
    check_config(config)
    return config


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "estimator", ["grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gae"]
)
def test_estimator_trains_end_to_end(ray_session, tmp_path, estimator):
    config = small_config(tmp_path, **{"algorithm.adv_estimator": estimator})
    summary = build_and_fit(config, tmp_path / "run")
    assert summary.steps == 3
    steps = read_metrics(tmp_path / "run")
    assert [m["step"] for m in steps] == [1, 2, 3]
    for m in steps:
        for key in ("actor/pg_loss", "actor/grad_norm", "score/mean", "timing_s/gen", "timing_s/update", "perf/tokens_per_s"):
            assert math.isfinite(m[key]), (key, m[key])
    norms = [m["actor/param_norm"] for m in steps]
    assert len(set(norms)) == 3  # the weights change every step
    if estimator == "gae":
        assert all(math.isfinite(m["critic/vf_loss"]) for m in steps)
        assert len({m["critic/param_norm"] for m in steps}) == 3
    else:
        assert "critic/vf_loss" not in steps[0]

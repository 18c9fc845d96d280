"""Memory settings through the real trainer: offload changes no number, each stage reports its peak memory.

2 CPU ranks, GAE (a critic) and a KL loss (a reference), so every role offloads. On a CPU the device and the
host are the same memory, so the moves are copies into host buffers with the role's storages freed between
stages (tests/workers/test_offload.py checks the storages); what this shows is that the stages bring back
exactly the state they left.
"""

import json
import math

import pytest
from omegaconf import OmegaConf

from hybridflow.configs.schema import PPOConfig
from hybridflow.trainer.config_checks import check_config
from hybridflow.trainer.main import build_and_fit

pytestmark = pytest.mark.slow

COMPARED = (
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/grad_norm",
    "actor/param_norm",
    "critic/vf_loss",
    "critic/grad_norm",
    "score/mean",
)
OFFLOAD = {
    f"{role}.fsdp_config.{what}": True
    for role in ("actor_rollout_ref.actor", "critic")
    for what in ("param_offload", "optimizer_offload")
} | {"actor_rollout_ref.ref.fsdp_config.param_offload": True, "actor_rollout_ref.rollout.offload_weights": True}


def run(tmp_path, name, **overrides):
    cfg = OmegaConf.structured(PPOConfig)
    for key, value in {
        "data.synthetic_dir": str(tmp_path / "data"),
        "data.train_batch_size": 4,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        "actor_rollout_ref.rollout.n": 4,
        "actor_rollout_ref.rollout.response_length": 4,
        "trainer.total_training_steps": 3,
        "trainer.test_freq": 0,
        "trainer.n_gpus_per_node": 1,  # one rank: each costs the suite a process start
        "algorithm.adv_estimator": "gae",
        "actor_rollout_ref.actor.use_kl_loss": True,
        # the old-log-prob pass runs (and offloads) only when it recomputes
        "actor_rollout_ref.actor.recompute_old_log_prob": "true",
        **overrides,
    }.items():
        OmegaConf.update(cfg, key, value)
    config = OmegaConf.to_object(cfg)
    check_config(config)
    build_and_fit(config, tmp_path / name)
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def test_offload_on_and_off_give_identical_losses_and_every_stage_reports_its_peak(ray_session, tmp_path):
    plain, offloaded = run(tmp_path, "plain"), run(tmp_path, "offloaded", **OFFLOAD)
    for a, b in zip(plain, offloaded, strict=True):
        for key in COMPARED:
            assert a[key] == b[key], (a["step"], key, a[key], b[key])
        for stage in ("gen", "old_log_prob", "ref", "values", "update"):
            assert 0 < b[f"memory/{stage}/peak_gb"] < 64, stage


# only that both run through the trainer (critic included); the dtypes held, computed, reduced and stepped, and the
# update losses' gap to fp32's, are tests/trainer/test_mixed_precision.py's
def test_mixed_precision_and_activation_checkpointing_train(ray_session, tmp_path):
    steps = run(
        tmp_path,
        "bf16",
        **{
            "actor_rollout_ref.actor.fsdp_config.param_dtype": "bfloat16",
            "critic.fsdp_config.param_dtype": "bfloat16",
            "actor_rollout_ref.model.enable_gradient_checkpointing": True,
        },
    )
    assert all(math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["critic/vf_loss"]) for m in steps)
    assert len({m["actor/param_norm"] for m in steps}) == 3  # fp32 master weights move every step

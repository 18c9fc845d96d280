"""Exact resume: a run stopped at a checkpoint and resumed trains exactly as one that never stopped.

12 prompts in batches of 4 make 3 steps an epoch; stopping after step 2 is
mid-epoch, after step 3 is an epoch boundary (where a known bug elsewhere
resumes into an empty epoch and silently trains zero steps).
"""

import json

import pytest
from omegaconf import OmegaConf
from support import read_trail

from hybridflow.configs.schema import PPOConfig
from hybridflow.data.synthetic import generate_synthetic
from hybridflow.trainer.checkpoint import list_checkpoints
from hybridflow.trainer.main import build_and_fit, format_summary

pytestmark = pytest.mark.slow

COMPARED = ("score/mean", "actor/pg_loss", "actor/grad_norm", "actor/param_norm", "actor/ppo_kl", "critic/vf_loss")


def config(files, steps, resume="auto", estimator="grpo", test_freq=0):
    cfg = OmegaConf.structured(PPOConfig)
    for key, value in {
        "data.train_files": [files["train"]],
        "data.val_files": [files["val"]],
        "data.train_batch_size": 4,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
        "actor_rollout_ref.actor.shuffle": True,
        "actor_rollout_ref.rollout.n": 4,
        "actor_rollout_ref.rollout.response_length": 4,
        "algorithm.adv_estimator": estimator,
        "trainer.total_epochs": 3,
        "trainer.total_training_steps": steps,
        "trainer.test_freq": test_freq,
        "trainer.save_freq": 1,
        "trainer.max_ckpt_to_keep": 1,
        "trainer.resume_mode": resume,
    }.items():
        OmegaConf.update(cfg, key, value)
    return OmegaConf.to_object(cfg)


def metrics(run_dir):
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {m["step"]: m for m in lines}


# stopped after step 2 of 4 (mid-epoch: 3 steps an epoch), with the actor's and the critic's state (gae); two
# steps to reproduce, the second across the epoch boundary (where the data order is drawn again). Validated
# before training and every 2 steps: the stopped run validated and logged its last step, the resumed one must
# not log it again. The stopped run is then made one that went on past its checkpoint and was killed (steps it
# logged after it, and a line cut short): the resumed run drops them and logs each step once.
def test_resumed_run_equals_uninterrupted_run(ray_session, tmp_path, stop_at=2, estimator="gae"):
    files = generate_synthetic(str(tmp_path / "data"), train_size=12, val_size=8, seed=0)
    straight = build_and_fit(config(files, 4, "disable", estimator, test_freq=2), tmp_path / "straight")
    assert straight.steps == 4
    first = build_and_fit(config(files, stop_at, "disable", estimator, test_freq=2), tmp_path / "resumed")
    assert first.steps == stop_at
    assert [step for step, _ in list_checkpoints(tmp_path / "resumed" / "checkpoints")] == [stop_at]
    with (tmp_path / "resumed" / "metrics.jsonl").open("a") as logged:  # killed at step 4, after logging 3
        logged.write(json.dumps({"step": stop_at + 1, "score/mean": 99.0}) + '\n{"step": 4, "scor')
    with (tmp_path / "resumed" / "trained_prompts.jsonl").open("a") as trail:  # and after step 3's update
        trail.write(json.dumps({"step": stop_at + 1, "epoch": 0, "prompt_id": 99}) + "\n")
    second_config = config(files, 4, "auto", estimator, test_freq=2)
    second = build_and_fit(second_config, tmp_path / "resumed")
    assert second.steps == 4
    # the summary says what is true of a resumed run: the first run's validation before training (test_freq is 2)
    rows = dict(line.split("  ", 1) for line in format_summary(second, second_config).splitlines() if "  " in line)
    before = f"{first.val_before['val/accuracy']:.3f} (the first run's, at step 0)"
    assert rows["validation accuracy before"].strip() == before
    assert rows["steps"].strip() == f"4 (resumed at step {stop_at})"
    assert rows["prompts trained"].strip().startswith("16 (12 distinct, epochs 0-1): ")
    expected, got = metrics(tmp_path / "straight"), metrics(tmp_path / "resumed")
    lines = [json.loads(line) for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2, 3, 4]  # each step logged once: resumed, not restarted
    assert [m["step"] for m in lines if "val/accuracy" in m] == [0, 2, 4]
    for step in range(stop_at + 1, 5):
        for key in COMPARED:
            if key in expected[step]:
                assert got[step][key] == pytest.approx(expected[step][key], rel=1e-5, abs=1e-7), (step, key)
    # the audit trail: the prompts the uninterrupted run trained on, each once per epoch, with the same weights
    trail = read_trail(tmp_path / "straight")
    assert read_trail(tmp_path / "resumed") == trail
    assert [(r["step"], r["epoch"]) for r in trail] == [(s, 0) for s in (1, 2, 3) for _ in range(4)] + [(4, 1)] * 4
    assert sorted(r["prompt_id"] for r in trail if r["epoch"] == 0) == list(range(12))
    assert all(r["weight_version"] == [r["step"] - 1] * 2 and r["samples"] == 4 for r in trail)


# LoRA (actor_rollout_ref.model.lora_rank): the checkpoint holds the adapters and their optimizer state, the
# reference is the model with its adapters off (no reference group), and a resumed run trains exactly as before.
# With offload (and dynamic batch sizes) the actor's state sits in host memory between stages: the checkpoint must
# bring it back to save it and to load into it (without, saving the empty storages crashed the worker and loading
# into them failed). Only that variant runs: a LoRA run without offload saves and loads the same adapter state
# through the same calls minus the moves (a plain variant ran here too until the suite passed its 20 minutes; the
# full-parameter resume above covers a checkpoint without offload).
@pytest.mark.parametrize(
    "extra",
    [
        {
            "actor_rollout_ref.actor.use_dynamic_bsz": True,
            "actor_rollout_ref.actor.fsdp_config.param_offload": True,
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload": True,
        },
    ],
    ids=["dynamic-bsz-offload"],
)
def test_a_lora_run_resumed_equals_the_uninterrupted_one(ray_session, tmp_path, extra):
    files = generate_synthetic(str(tmp_path / "data"), train_size=12, val_size=8, seed=0)

    def lora(steps, resume):
        cfg = OmegaConf.structured(config(files, steps, resume))
        for key, value in {
            "actor_rollout_ref.model.lora_rank": 4,
            "actor_rollout_ref.model.lora_alpha": 8.0,
            "actor_rollout_ref.actor.optim.lr": 1e-2,
            "actor_rollout_ref.actor.use_kl_loss": True,
            "trainer.n_gpus_per_node": 1,  # the sharded save and load across ranks: the test above
            **extra,
        }.items():
            OmegaConf.update(cfg, key, value)
        return OmegaConf.to_object(cfg)

    straight = build_and_fit(lora(3, "disable"), tmp_path / "straight")
    assert straight.steps == 3
    assert build_and_fit(lora(2, "disable"), tmp_path / "resumed").steps == 2
    assert build_and_fit(lora(3, "auto"), tmp_path / "resumed").steps == 3
    expected, got = metrics(tmp_path / "straight"), metrics(tmp_path / "resumed")
    assert expected[3]["actor/kl_loss"] > 0  # the reference (adapters off) and the policy have parted
    for key in (*COMPARED, "actor/kl_loss"):
        if key in expected[3]:
            assert got[3][key] == pytest.approx(expected[3][key], rel=1e-5, abs=1e-7), key

"""Split placement and the pipelined rollout modes, end to end on CPU ranks (trainer.rollout_mode).

The rollout runs on a rank of its own, the trainer on another; weights cross
between them after every update over the transfer group. With
``max_staleness=0`` the asynchronous machinery must train exactly as the
synchronous loop does; with ``max_staleness=1`` samples are at most one
version old, corrected by truncated importance weights, and a resumed run
draws the in-flight batches again.
"""

import json
import math

import pytest
from support import read_metrics, small_config

from hybridflow.trainer.main import build_and_fit

pytestmark = pytest.mark.slow

COMPARED = (
    "score/mean",
    "actor/pg_loss",
    "actor/grad_norm",
    "actor/entropy",
    "actor/ppo_kl",
    "response_length/mean",
    "rollout/log_prob_gap_max",
)


def digit_reward(tmp_path):
    path = tmp_path / "digit_share.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
        "    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)\n"
    )
    return str(path)


def run(tmp_path, name, **overrides):
    base = {
        "reward.custom_reward_function.path": digit_reward(tmp_path),
        "trainer.n_gpus_per_node": 1,
        "actor_rollout_ref.rollout.max_num_seqs": 6,
        "actor_rollout_ref.rollout.response_length": 8,
        "actor_rollout_ref.actor.ppo_epochs": 2,
        "actor_rollout_ref.actor.recompute_old_log_prob": "true",
    }
    build_and_fit(small_config(tmp_path, **{**base, **overrides}), tmp_path / name)
    return read_metrics(tmp_path / name)


LORA = {
    "actor_rollout_ref.model.lora_rank": 4,
    "actor_rollout_ref.model.lora_alpha": 8.0,
    "actor_rollout_ref.actor.optim.lr": 3e-3,
}


@pytest.mark.parametrize("adapters", [{}, LORA], ids=["full", "lora"])
def test_async_with_staleness_zero_trains_as_the_synchronous_loop(ray_session, tmp_path, adapters):
    """Colocated sync on one rank vs split async (1 + 1 ranks) with max_staleness=0: the same numbers each step.

    Both decode 16 rows in 6 slots (the engine's refilling call vs the stream, one request at a time), the
    rollout's weights arrive over the transfer group: any difference in them, in the seeds or the samples
    shows in the losses. With LoRA the split rollout receives the merged weights (base + scaled BA).
    """
    sync = run(tmp_path, "sync", **adapters)
    split = run(
        tmp_path,
        "split",
        **{"trainer.placement": "split", "trainer.rollout_mode": "async", "trainer.max_staleness": 0, **adapters},
    )
    assert len(sync) == len(split) == 3
    assert len({m["score/mean"] for m in sync}) > 1  # the policy and its scores move
    for a, b in zip(sync, split):
        for key in COMPARED:
            assert math.isclose(a[key], b[key], rel_tol=1e-6, abs_tol=1e-7), (a["step"], key, a[key], b[key])
        assert b["async/staleness_max"] == 0
        assert b["weight_sync/bytes"] > 0 and b["weight_sync/seconds"] > 0
        # AdamW holds two moments per trained parameter: twice the parameters in full, a sliver with adapters
        assert (b["actor/optimizer_state_bytes_per_rank"] < b["actor/param_bytes_per_rank"]) == bool(adapters)


def test_async_with_staleness_one_is_corrected_bounded_and_resumes(ray_session, tmp_path):
    """max_staleness=1 with token-level truncated importance weights: batch 2 trains on samples one version old
    (or partly newer, had the new weights arrived mid-sample), never older; the checkpoint after step 2 keeps the
    loader at the trained batches, and the resumed run draws batch 3 again and trains steps 3 and 4."""
    overrides = {
        "trainer.placement": "split",
        "trainer.rollout_mode": "async",
        "trainer.max_staleness": 1,
        "algorithm.rollout_correction.rollout_is": "token",
        "trainer.save_freq": 2,
        "data.train_batch_size": 2,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
    }
    first = run(tmp_path, "async", **{**overrides, "trainer.total_training_steps": 2})
    assert first[0]["async/staleness_max"] == 0  # batch 1 was submitted at version 0 and trains at version 0
    assert 0 < first[1]["async/staleness_mean"] <= 1 and first[1]["async/staleness_max"] == 1
    for m in first:
        assert (
            "rollout_corr/rollout_is_mean" in m and m["timing_s/trainer_idle"] >= 0 and m["timing_s/rollout_idle"] >= 0
        )
    driver = json.loads((tmp_path / "async" / "checkpoints" / "global_step_2" / "driver.json").read_text())
    assert (
        driver["rollout_batches"] == 2 and driver["loader"]["index"] == 2
    )  # the trained batches (none past the last step was drawn)
    resumed = run(tmp_path, "async", **{**overrides, "trainer.total_training_steps": 4})
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]  # the first run's two lines, then the resumed steps
    assert all(m["async/staleness_max"] <= 1 for m in resumed)
    # the audit trail: two prompts a step, none trained twice in its epoch (the in-flight batch was drawn again,
    # not replayed after the trained ones), each from weights at most one version behind the step's trainer
    trail = [json.loads(line) for line in (tmp_path / "async" / "trained_prompts.jsonl").read_text().splitlines()]
    assert [r["step"] for r in trail] == [1, 1, 2, 2, 3, 3, 4, 4]
    assert len({(r["epoch"], r["prompt_id"]) for r in trail}) == 8
    assert all(r["step"] - 2 <= r["weight_version"][0] <= r["weight_version"][1] <= r["step"] - 1 for r in trail)

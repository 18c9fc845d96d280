"""A run whose driver is killed by SIGKILL, then started again with the same command, ends as if nothing happened:
the same prompts trained on, each step's audit lines once, bitwise-equal final weights (issue 52).

The driver is ``hybridflow-train`` in a process of its own; it is killed as soon as the audit trail has a line of
step ``k`` (after that step's update, before its checkpoint), so the rerun resumes from the checkpoint of step
``k - 1`` and must drop what the killed run wrote past it. Only the synchronous mode runs here for now: each mode
costs three runs of a fresh Ray instance (about a minute of the suite).
"""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file

pytestmark = pytest.mark.slow

TRAIN = [sys.executable, "-m", "hybridflow.trainer.main"]
STEPS = 4


def command(run_dir, data_dir):
    return [
        *TRAIN,
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.response_length=4",
        "trainer.n_gpus_per_node=1",
        "trainer.test_freq=0",
        f"trainer.total_training_steps={STEPS}",
        "trainer.save_freq=1",
        "trainer.save_hf_on_end=true",
        "trainer.logger=[jsonl]",
        f"data.synthetic_dir={data_dir}",
        f"hydra.run.dir={run_dir}",
    ]


def env():
    return {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "WANDB_API_KEY", "WANDB_MODE")}


def trail(run_dir):
    return [json.loads(line) for line in (run_dir / "trained_prompts.jsonl").read_text().splitlines()]


def run_to_the_end(run_dir, data_dir):
    out = subprocess.run(command(run_dir, data_dir), env=env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]


def kill_at_step(run_dir, data_dir, step):
    """Start the run; SIGKILL its driver once the audit trail has a line of ``step``."""
    with open(run_dir.parent / f"{run_dir.name}.log", "w") as log:
        driver = subprocess.Popen(command(run_dir, data_dir), env=env(), stdout=log, stderr=subprocess.STDOUT)
        audit = run_dir / "trained_prompts.jsonl"
        deadline = time.monotonic() + 240
        while not (audit.is_file() and f'"step": {step},' in audit.read_text()):
            assert driver.poll() is None, f"the run ended before step {step}: {driver.returncode}"
            assert time.monotonic() < deadline, "no audit line of the step in 240 s"
            time.sleep(0.05)
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)


def test_a_run_killed_by_sigkill_and_started_again_ends_as_the_uninterrupted_one(tmp_path):
    data = tmp_path / "data"
    run_to_the_end(tmp_path / "straight", data)
    step = random.Random(52).choice([2, 3])  # a seeded draw: the point is not chosen to suit the code
    kill_at_step(tmp_path / "killed", data, step)
    killed_lines = trail(tmp_path / "killed")
    assert max(r["step"] for r in killed_lines) == step  # killed past its last checkpoint (step - 1) ...
    run_to_the_end(tmp_path / "killed", data)  # ... and started again with the same command
    assert trail(tmp_path / "killed") == trail(tmp_path / "straight")  # every prompt, step and weight version, once
    straight = load_file(tmp_path / "straight" / "hf_model" / "model.safetensors")
    resumed = load_file(tmp_path / "killed" / "hf_model" / "model.safetensors")
    assert straight.keys() == resumed.keys()
    assert all(straight[name].equal(resumed[name]) for name in straight), "the final weights differ"
    metrics = [json.loads(line)["step"] for line in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert metrics == list(range(1, STEPS + 1))  # each step logged once

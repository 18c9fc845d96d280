"""A run whose driver is killed by SIGKILL, then started again with the same command, ends as if nothing happened:
the same prompts trained on, each step's audit lines once, bitwise-equal final weights (issue 52).

The driver is ``hybridflow-train`` in a process of its own; it is killed once step ``k``'s audit lines are written
(after that step's update, before its checkpoint), so the rerun resumes from the checkpoint of step ``k - 1`` and
must drop what the killed run wrote past it. The synchronous run is then killed a second time, once the checkpoint
of step ``k + 1`` is in place (its weights synced, the next generation not begun), and started a third time (with
vLLM too). The off-policy modes are killed once, with batches in flight. The driver stops itself at each point and
waits there for the kill (``driver_that_pauses.py``).

`make test` runs the synchronous mode with the built-in engine; the other modes, and every mode with vLLM, are
marked ``kill_modes`` and run by ``make test-kill`` (each costs three runs of a fresh Ray instance, about a
minute, and the suite stands at its 20 minutes).
"""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file
from support import read_metrics, read_trail

pytestmark = pytest.mark.slow

TRAIN = [sys.executable, "-m", "hybridflow.trainer.main"]
PAUSING_DRIVER = [sys.executable, str(Path(__file__).with_name("driver_that_pauses.py"))]
STEPS = 5  # the second kill, after the checkpoint of step 3 or 4, comes before a generation


SPLIT = ["trainer.placement=split", "algorithm.rollout_correction.rollout_is=token"]
VLLM = [
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.enforce_eager=true",
    "actor_rollout_ref.rollout.enable_sleep_mode=false",
    "actor_rollout_ref.model.path=builtin:tiny-qwen2-h32",
]
# the off-policy modes: the rollout on a rank of its own, batches submitted ahead (that many in flight when the
# driver dies, drawn again by the resumed run)
OFF_POLICY = {
    "async-2": [*SPLIT, "trainer.rollout_mode=async", "trainer.max_staleness=2"],
    "async-1": [*SPLIT, "trainer.rollout_mode=async", "trainer.max_staleness=1"],
    "one_step_off": [*SPLIT, "trainer.rollout_mode=one_step_off"],
}
MODES = {"sync": [], "vllm": VLLM, **OFF_POLICY, **{f"vllm-{mode}": [*VLLM, *o] for mode, o in OFF_POLICY.items()}}
AHEAD = {"async-2": 2, "async-1": 1, "one_step_off": 1}
# the modes `make test` leaves out (a minute of the suite each; `make test-kill` runs them)
OTHER_MODE = pytest.mark.kill_modes


def command(run_dir, data_dir, mode="sync"):
    return [
        *TRAIN,
        *MODES[mode],
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


def run_to_the_end(run_dir, data_dir, mode="sync"):
    out = subprocess.run(command(run_dir, data_dir, mode), env=env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]


def kill_when(run_dir, data_dir, pause, mode="sync"):
    """Start the run (again, in ``run_dir``) with a driver that stops for good at ``pause`` (``audit:<step>``: after
    that step's update, before its checkpoint; ``checkpoint:<step>``: once its checkpoint is in place); SIGKILL it
    there. The driver stops itself (``driver_that_pauses.py``): a kill timed from outside can land late."""
    paused = run_dir.parent / f"{run_dir.name}.paused"
    paused.unlink(missing_ok=True)
    pausing = {**env(), "HYBRIDFLOW_TEST_PAUSE": pause, "HYBRIDFLOW_TEST_PAUSED": str(paused)}
    with open(run_dir.parent / f"{run_dir.name}.log", "a") as log:
        driver = subprocess.Popen(
            [*PAUSING_DRIVER, *command(run_dir, data_dir, mode)[len(TRAIN) :]],
            env=pausing,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 240
        while not paused.is_file():
            assert driver.poll() is None, f"the run ended before {pause}: {driver.returncode}"
            assert time.monotonic() < deadline, f"not at {pause} in 240 s"
            time.sleep(0.05)
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)


@pytest.mark.parametrize("mode", ["sync", pytest.param("vllm", marks=OTHER_MODE)])
def test_a_run_killed_by_sigkill_and_started_again_ends_as_the_uninterrupted_one(tmp_path, mode):
    data = tmp_path / "data"
    run_to_the_end(tmp_path / "straight", data, mode)
    step = random.Random(52).choice([2, 3])  # a seeded draw: the point is not chosen to suit the code
    killed = tmp_path / "killed"
    kill_when(killed, data, f"audit:{step}", mode)
    assert max(r["step"] for r in read_trail(killed)) == step  # killed past its last checkpoint (step - 1) ...
    # ... started again with the same command, and killed again once the checkpoint of the next step is in place
    kill_when(killed, data, f"checkpoint:{step + 1}", mode)
    assert max(r["step"] for r in read_trail(killed)) == step + 1
    run_to_the_end(killed, data, mode)  # ... and started a third time
    assert read_trail(tmp_path / "killed") == read_trail(
        tmp_path / "straight"
    )  # every prompt, step and weight version, once
    straight = load_file(tmp_path / "straight" / "hf_model" / "model.safetensors")
    resumed = load_file(tmp_path / "killed" / "hf_model" / "model.safetensors")
    assert straight.keys() == resumed.keys()
    assert all(straight[name].equal(resumed[name]) for name in straight), "the final weights differ"
    assert [m["step"] for m in read_metrics(tmp_path / "killed")] == list(range(1, STEPS + 1))  # each step once


@pytest.mark.parametrize(
    "mode",
    [pytest.param(m, marks=OTHER_MODE) for m in MODES if m not in ("sync", "vllm")],
)
def test_an_off_policy_run_killed_with_batches_in_flight_trains_on_the_same_prompts(tmp_path, mode):
    """The rollout split off and ahead of the trainer (async with staleness 2 or 1, one step off): the killed
    driver had batches generating from older weights; the resumed run draws them again from its checkpoint's
    loader position and generates them with the checkpoint's weights. So each step trains on the same prompts as
    the uninterrupted run, each once, but not from the same weight versions: the weights cannot be bitwise equal
    (the versions of the batches in flight are not in the checkpoint). One step off, the trail's versions differ
    only for the steps the rerun drew again; in async mode new weights enter between any two decode steps, so which
    version a token had depends on timing in either run, and only its bound is checked."""
    data, ahead = tmp_path / "data", AHEAD[mode.removeprefix("vllm-")]
    run_to_the_end(tmp_path / "straight", data, mode)
    step = random.Random(522).choice([2, 3])
    kill_when(tmp_path / "killed", data, f"audit:{step}", mode)
    run_to_the_end(tmp_path / "killed", data, mode)
    straight, resumed = read_trail(tmp_path / "straight"), read_trail(tmp_path / "killed")

    def prompts(lines):
        return [(r["step"], r["epoch"], r["prompt_id"], r["samples_trained"]) for r in lines]

    assert prompts(resumed) == prompts(straight)  # the same prompts, steps and epochs, each once
    epoch_0 = [r["prompt_id"] for r in resumed if r["epoch"] == 0]
    assert len(epoch_0) == len(set(epoch_0))  # none trained twice in its epoch
    for r in resumed:  # every sample within `ahead` versions of the trainer that trained on it
        assert r["step"] - 1 - ahead <= r["weight_version"][0] <= r["weight_version"][1] <= r["step"] - 1, r
    if mode.endswith("one_step_off"):  # a batch's version is fixed when it is submitted
        redrawn = {r["step"] for r, s in zip(resumed, straight) if r["weight_version"] != s["weight_version"]}
        assert redrawn <= set(range(step, step + ahead)), redrawn  # only batches that were in flight at the kill
    assert [m["step"] for m in read_metrics(tmp_path / "killed")] == list(range(1, STEPS + 1))  # each step once

"""Runs that restart themselves (``trainer.max_restarts``, issue 52): three injected faults in one run, each followed
by a restart from the last checkpoint, end with the uninterrupted run's weights; ``faults.jsonl`` names each.

The policy's unit tests drive :func:`fit_with_restarts` with a stand-in for one attempt that raises the errors the
wait for ranks raises (no Ray); the end-to-end test injects real faults into real workers (subclasses of the real
workers that act in one call on one rank, as tests/trainer/test_stalls.py does).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from ray.exceptions import RayActorError
from safetensors.torch import load_file
from support import faulty, read_metrics, read_trail, small_config

from hybridflow.core import WorkerError, WorkerStalledError
from hybridflow.trainer.main import build_and_fit
from hybridflow.trainer.restarts import FAULTS_FILE, fit_with_restarts, read_faults
from hybridflow.workers.actor import worker as actor_module
from hybridflow.workers.rollout import worker as rollout_module


# ------------------------------------------------------------------ the policy, without Ray
def attempts(*outcomes):
    """A stand-in for one attempt: each call takes the next outcome (an error to raise, or the summary to return)
    and records the config it was given."""
    seen = []

    def fit(config):
        seen.append(config.trainer.resume_mode)
        outcome = outcomes[len(seen) - 1]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return fit, seen


def config(max_restarts, resume_mode="disable"):
    return SimpleNamespace(trainer=SimpleNamespace(max_restarts=max_restarts, resume_mode=resume_mode))


def error(kind, step, role="actor", method="update_actor", rank=1):
    """The error the wait for ranks raises (core/rank_wait.py), with the step the trainer sets on it."""
    causes = {"died": RayActorError(), "failed": RuntimeError("Timed out waiting for the collective\nat gloo")}
    cls = WorkerStalledError if kind == "stalled" else WorkerError
    still = ("rank 0 (node n, pid 7): in actor.update_actor for 10.2 s",)
    err = cls(f"{role}.{method} failed on rank {rank}: {kind}\ndetails", role, method, rank, causes.get(kind), still)
    err.step = step
    return err


def test_each_fault_is_a_line_and_the_restarts_resume_from_the_latest_checkpoint(tmp_path):
    done = SimpleNamespace(restarts=None)
    fit, seen = attempts(error("died", 2), error("stalled", 3, "rollout", "generate_sequences", 0), done)
    assert fit_with_restarts(fit, config(3), tmp_path) is done
    assert done.restarts == 2
    assert seen == ["disable", "auto", "auto"]  # what the first attempt was told, then the latest checkpoint
    faults = read_faults(tmp_path)
    assert [(f["step"], f["kind"], f["role"], f["method"], f["rank"], f["restart"]) for f in faults] == [
        (2, "died", "actor", "update_actor", 1, 1),
        (3, "stalled", "rollout", "generate_sequences", 0, 2),
    ]
    assert faults[0]["message"] == "actor.update_actor failed on rank 1: died"  # the error's first line
    assert faults[0]["still_in_call"] == ["rank 0 (node n, pid 7): in actor.update_actor for 10.2 s"]
    assert faults[0]["cause"].startswith("RayActorError") and faults[1]["cause"] == ""  # a stall raised nothing


def test_past_max_restarts_the_last_fault_stops_the_run_and_is_recorded(tmp_path):
    fit, seen = attempts(error("died", 2), error("died", 4))
    with pytest.raises(WorkerError, match="rank 1: died"):
        fit_with_restarts(fit, config(1), tmp_path)
    assert len(seen) == 2
    assert [f["restart"] for f in read_faults(tmp_path)] == [1, 0]  # 0: no restart followed


def test_without_restarts_the_error_stops_the_run_as_before(tmp_path):
    fit, _ = attempts(error("stalled", 1))
    with pytest.raises(WorkerStalledError):
        fit_with_restarts(fit, config(0), tmp_path)
    assert [f["kind"] for f in read_faults(tmp_path)] == ["stalled"]


def test_an_error_of_the_workers_code_again_at_the_same_step_is_not_restarted_again(tmp_path):
    fit, seen = attempts(error("failed", 3), error("failed", 3), SimpleNamespace())
    with pytest.raises(WorkerError):
        fit_with_restarts(fit, config(5), tmp_path)
    assert len(seen) == 2  # one restart (it may have been a peer's fault), not five
    assert read_faults(tmp_path)[0]["cause"] == "RuntimeError: Timed out waiting for the collective"
    # a process that died again at the same step may be the machine's: restarted up to the bound
    fit, seen = attempts(error("died", 3), error("died", 3), SimpleNamespace())
    fit_with_restarts(fit, config(5), tmp_path / "again")
    assert len(seen) == 3


# ------------------------------------------------------------------ three real faults in one run
STEPS = 5


def run_config(tmp_path, max_restarts):
    return small_config(
        tmp_path,
        **{
            "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
            "actor_rollout_ref.rollout.n": 2,
            "trainer.placement": "split",
            "trainer.total_training_steps": STEPS,
            "trainer.save_freq": 1,
            "trainer.save_hf_on_end": True,
            "trainer.max_restarts": max_restarts,
            "trainer.timeouts.heartbeat_s": 0.5,
            "trainer.timeouts.stall_s": 5.0,
            "trainer.timeouts.weight_sync_s": 10.0,
        },
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_run_with_three_faults_restarts_itself_and_ends_as_the_uninterrupted_one(ray_session, monkeypatch, tmp_path):
    """One training rank, the rollout on a rank of its own, a checkpoint a step. Attempt 1: the training rank is
    SIGKILLed in step 2's update. Attempt 2 (from step 1's checkpoint): the rollout's rank is SIGKILLed generating
    step 3. Attempt 3 (from step 2's): the rollout's rank, alive, never joins the broadcast of step 3's weights,
    and the trainer's side times out. Attempt 4 (from step 2's) finishes."""
    straight = build_and_fit(run_config(tmp_path, 0), tmp_path / "straight")

    killed, rollout_killed, stalled = (tmp_path / f"{name}.json" for name in ("killed", "rollout", "stalled"))
    actor_cls = faulty(actor_module.ActorRolloutWorker, "update_actor", 0, 2, "kill", killed)
    # receive_weights: call 1 as an attempt starts (or resumes), then one after each update
    rollout_cls = faulty(rollout_module.RolloutWorker, "generate_sequences", 0, 2, "kill", rollout_killed, killed)
    rollout_cls = faulty(rollout_cls, "receive_weights", 0, 2, "sleep", stalled, after=rollout_killed)
    monkeypatch.setattr(actor_module, "ActorRolloutWorker", actor_cls)
    monkeypatch.setattr(rollout_module, "RolloutWorker", rollout_cls)
    run = tmp_path / "faulty"
    summary = build_and_fit(run_config(tmp_path, 3), run)

    assert summary.restarts == 3 and summary.steps == STEPS
    faults = read_faults(run)
    assert [(f["step"], f["kind"], f["role"], f["method"], f["rank"], f["restart"]) for f in faults] == [
        (2, "died", "actor", "update_actor", 0, 1),
        (3, "died", "rollout", "generate_sequences", 0, 2),
        (3, "failed", "actor", "send_weights", 0, 3),
    ], faults
    assert "Timed out" in faults[2]["cause"], faults[2]
    assert summary.resumed_at == 2
    a = load_file(straight.hf_export / "model.safetensors")
    b = load_file(summary.hf_export / "model.safetensors")
    assert a.keys() == b.keys() and all(a[name].equal(b[name]) for name in a), "the final weights differ"
    assert read_trail(run) == read_trail(tmp_path / "straight")  # every prompt, step and weight version, once
    assert [m["step"] for m in read_metrics(run)] == list(range(1, STEPS + 1))  # each step logged once
    assert not (tmp_path / "straight" / FAULTS_FILE).exists()

"""A run with a rank that stalls ends within its documented bound, naming the rank and the stage, its last
checkpoint intact, and a resume then finishes it (``trainer.timeouts``; ``docs/reliability.md``).

Three stalls, each in step 2 of 2 (step 1's checkpoint is on disk): a training rank stopped with SIGSTOP in its
update, the rollout's rank (``trainer.placement=split``) stopped as the weights of step 2 arrive, and a training
rank that never reaches its update's collectives (alive, answering the heartbeat: its peer's collective times
out). The faults are injected by subclasses of the real workers that act in one call on one rank; the resumed
runs use the real ones. The third stall leaves the checkpoint the first leaves, in the same layout, so only the
first two resume (each run costs the suite half a minute).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
from omegaconf import OmegaConf
from support import faulty

from hybridflow.configs.schema import PPOConfig
from hybridflow.core import WorkerError, WorkerStalledError
from hybridflow.data.synthetic import generate_synthetic
from hybridflow.trainer.checkpoint import list_checkpoints
from hybridflow.trainer.main import build_and_fit
from hybridflow.workers.actor import worker as actor_module
from hybridflow.workers.rollout import worker as rollout_module

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

HEARTBEAT_S, STALL_S, COLLECTIVE_S = 0.5, 5.0, 10.0  # with room for a loaded 2-core machine


def config(files, placement="colocated"):
    cfg = OmegaConf.structured(PPOConfig)
    for key, value in {
        "data.train_files": [files["train"]],
        "data.val_files": [files["val"]],
        "data.train_batch_size": 4,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
        "actor_rollout_ref.rollout.n": 2,
        "actor_rollout_ref.rollout.response_length": 4,
        "trainer.total_training_steps": 2,
        "trainer.test_freq": 0,
        "trainer.save_freq": 1,
        "trainer.placement": placement,
        "trainer.n_gpus_per_node": 1 if placement == "split" else 2,  # the split case stalls the rollout's rank
        "trainer.timeouts.heartbeat_s": HEARTBEAT_S,
        "trainer.timeouts.stall_s": STALL_S,
        "trainer.timeouts.collective_s": COLLECTIVE_S,
    }.items():
        OmegaConf.update(cfg, key, value)
    return OmegaConf.to_object(cfg)


@pytest.fixture
def files(tmp_path):
    return generate_synthetic(str(tmp_path / "data"), train_size=8, val_size=4, seed=0)


def stalled_run(monkeypatch, tmp_path, files, module, name, method, rank, call, action, placement="colocated"):
    """Run with the fault; returns (the error, seconds from the fault to the error, the faulty rank's pid)."""
    record = tmp_path / "fault.json"
    monkeypatch.setattr(module, name, faulty(getattr(module, name), method, rank, call, action, record))
    try:
        with pytest.raises(WorkerError) as info:
            build_and_fit(config(files, placement), tmp_path / "run")
        ended = time.time()
    finally:
        monkeypatch.undo()
        fault = json.loads(record.read_text()) if record.exists() else None
        if fault is not None:  # the run is over: nothing of it may linger for the next test
            try:
                os.kill(fault["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert fault is not None, "the fault never fired"
    return info.value, ended - fault["at"], fault["pid"]


def resume_finishes(tmp_path, files, placement="colocated") -> None:
    """Step 1's checkpoint is the last one on disk; a rerun in the run directory loads it and trains step 2."""
    root = tmp_path / "run" / "checkpoints"
    assert [step for step, _ in list_checkpoints(root)] == [1]
    resumed = config(files, placement)
    resumed.trainer.timeouts.stall_s = 60.0  # the bound is the stalled run's to show: a loaded machine once held a
    # rank's Python lock for 5 s while it loaded the checkpoint here, and the resume failed as a stall
    summary = build_and_fit(resumed, tmp_path / "run")
    assert summary.resumed_at == 1 and summary.steps == 2
    assert [step for step, _ in list_checkpoints(root)] == [1, 2]


def test_a_training_rank_stopped_in_its_update_is_named_within_the_heartbeats_bound(
    ray_session, monkeypatch, tmp_path, files
):
    err, waited, pid = stalled_run(
        monkeypatch, tmp_path, files, actor_module, "ActorRolloutWorker", "update_actor", 1, 2, "stop"
    )
    assert isinstance(err, WorkerStalledError), err
    assert re.match(rf"actor\.update_actor: rank 1 \(node [\d.]+ \w+, pid {pid}\) stopped answering", str(err)), err
    assert waited < HEARTBEAT_S + STALL_S + 4.0, waited
    resume_finishes(tmp_path, files)


def test_the_rollout_rank_stopped_during_a_weight_sync_is_named_within_the_heartbeats_bound(
    ray_session, monkeypatch, tmp_path, files
):
    # receive_weights calls: 1 at start, 2 after step 1's update, 3 after step 2's
    err, waited, pid = stalled_run(
        monkeypatch,
        tmp_path,
        files,
        rollout_module,
        "RolloutWorker",
        "receive_weights",
        0,
        3,
        "stop",
        placement="split",
    )
    assert isinstance(err, WorkerStalledError), err
    assert re.match(rf"rollout\.receive_weights: rank 0 \(node [\d.]+ \w+, pid {pid}\) stopped answering", str(err)), (
        err
    )
    assert waited < HEARTBEAT_S + STALL_S + 4.0, waited  # not the sender's weight_sync_s (600 s)
    resume_finishes(tmp_path, files, placement="split")


def test_a_training_rank_that_never_reaches_its_collectives_is_named_when_its_peers_time_out(
    ray_session, monkeypatch, tmp_path, files
):
    err, waited, pid = stalled_run(
        monkeypatch, tmp_path, files, actor_module, "ActorRolloutWorker", "update_actor", 1, 2, "sleep"
    )
    message = str(err)
    assert not isinstance(err, WorkerStalledError) and err.rank == 0, message  # alive, so the collective's bound
    assert message.startswith("actor.update_actor failed on rank 0") and "Timed out" in message, message
    assert re.search(
        rf"still in the call when it failed.*\n  rank 1 \(node [\d.]+ \w+, pid {pid}\): in "
        r"actor\.update_actor for [\d.]+ s",
        message,
    ), message
    assert waited < COLLECTIVE_S + 6.0, waited
    # step 1's checkpoint is the last on disk; resuming from it is the first test's (same layout, same loader)
    assert [step for step, _ in list_checkpoints(tmp_path / "run" / "checkpoints")] == [1]

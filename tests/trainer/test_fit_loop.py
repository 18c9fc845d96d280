"""The driver loop's edges, with stand-ins for the worker groups: closing, Ctrl-C, validation sampling."""

import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hybridflow.core import DataProto, WorkerStalledError
from hybridflow.core.keys import DATA_SOURCE
from hybridflow.rewards.manager import RewardOutput
from hybridflow.trainer.launch import Progress
from hybridflow.trainer.ppo_trainer import PPOTrainer


class Recorder:
    def __init__(self):
        self.closed = 0

    def close(self):
        self.closed += 1


def loop(tmp_path, error):
    """A PPOTrainer-shaped object whose steps raise ``error``."""

    def _fit(summary):
        raise error

    return SimpleNamespace(
        _fit=_fit,
        tracking=Recorder(),
        global_step=7,
        total_steps=400,
        checkpoint_root=tmp_path / "checkpoints",
        agents=None,
    )


def test_loggers_are_closed_when_a_step_raises(tmp_path):
    trainer = loop(tmp_path, RuntimeError("worker died"))
    with pytest.raises(RuntimeError, match="worker died"):
        PPOTrainer.fit(trainer)
    assert trainer.tracking.closed == 1


def test_ctrl_c_says_where_it_stopped_and_which_checkpoint_is_left(tmp_path, caplog):
    (tmp_path / "checkpoints" / "global_step_5").mkdir(parents=True)
    trainer = loop(tmp_path, KeyboardInterrupt())
    with caplog.at_level(logging.ERROR), pytest.raises(KeyboardInterrupt):
        PPOTrainer.fit(trainer)
    assert trainer.tracking.closed == 1
    assert "interrupted at step 7 of 400; last checkpoint: " in caplog.text and "global_step_5" in caplog.text


def test_a_workers_failure_says_where_it_stopped_and_which_checkpoint_is_left(tmp_path, caplog):
    (tmp_path / "checkpoints" / "global_step_5").mkdir(parents=True)
    stall = WorkerStalledError(
        "actor.update_actor: rank 1 (...) stopped answering the heartbeat\nmore", "actor", "update_actor", 1, None
    )
    trainer = loop(tmp_path, stall)
    with caplog.at_level(logging.ERROR), pytest.raises(WorkerStalledError):
        PPOTrainer.fit(trainer)
    assert trainer.tracking.closed == 1
    assert (
        "stopped at step 8 of 400 by a worker: actor.update_actor: rank 1 (...) stopped answering the heartbeat\n"
        "last checkpoint: "
    ) in caplog.text and "global_step_5" in caplog.text


class FakeActor:
    """Records the meta_info of every generate call and answers "1" to every prompt."""

    def __init__(self):
        self.calls = []

    def generate_sequences(self, prompts):
        self.calls.append(dict(prompts.meta_info))
        rows = len(prompts)
        return DataProto.from_dict(
            {"responses": torch.ones(rows, 1, dtype=torch.long)}, {DATA_SOURCE: np.array(["s"] * rows, dtype=object)}
        )


class FakePrompts:
    def __len__(self):
        return 5

    def batch(self, indices, pad_id):
        return DataProto.from_dict({"input_ids": torch.zeros(len(indices), 2, dtype=torch.long)})


@pytest.mark.parametrize("val_greedy", [True, False])
def test_validation_decodes_as_rollout_val_greedy_says(val_greedy):
    rollout = SimpleNamespace(val_greedy=val_greedy)
    config = SimpleNamespace(
        actor_rollout_ref=SimpleNamespace(rollout=rollout),
        data=SimpleNamespace(val_batch_size=2),
        trainer=SimpleNamespace(seed=3, log_val_generations=0),
    )
    actor = FakeActor()
    scores = iter([torch.tensor([[1.0], [0.0]]), torch.tensor([[1.0], [1.0]]), torch.tensor([[0.0]])])

    def rewards(out):  # the verifiers' scores are the reward: (reward, verified) as PPOTrainer.rewards returns them
        token_scores = next(scores)
        verified = RewardOutput(
            token_scores.sum(-1),
            torch.ones_like(token_scores),
            {},
            [{"score": float(s)} for s in token_scores.sum(-1)],
            [True] * len(out),
        )
        return verified, verified

    trainer = SimpleNamespace(
        config=config,
        rollout_group=actor,
        val_prompts=FakePrompts(),
        pad_id=0,
        tokenizer=None,
        agents=None,
        rewards=rewards,
        global_step=4,
        _seed=lambda: 3 * 100_003 + 4,
    )
    trainer.generate = lambda prompts: PPOTrainer.generate(trainer, prompts)
    metrics = PPOTrainer.validate(trainer)
    assert [c["greedy"] for c in actor.calls] == [val_greedy] * 3
    assert [c["n"] for c in actor.calls] == [1, 1, 1]
    assert len({c["seed"] for c in actor.calls}) == 3  # sampled validation draws differently per batch
    assert metrics["val/accuracy"] == pytest.approx(3 / 5)


def test_progress_in_a_redirected_log_is_one_line_per_tenth(caplog, monkeypatch):
    monkeypatch.setattr("sys.stderr.isatty", lambda: False)
    progress = Progress(total=25, initial=3)
    with caplog.at_level(logging.INFO, logger="hybridflow.trainer.launch"):
        for _ in range(22):
            progress.update(score=0.5)
    progress.close()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("training: step")]
    assert lines == [f"training: step {s}/25 score=0.500" for s in (4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 25)]


def test_only_a_first_batch_whose_every_sample_raised_stops_the_run():
    from hybridflow.trainer.config_checks import ConfigError
    from hybridflow.trainer.ppo_trainer import refuse_a_broken_verifier

    def verified(errors, rows=3):
        return RewardOutput(torch.zeros(rows), torch.ones(rows, 2), {}, [{}] * rows, [True] * rows, tuple(errors))

    refuse_a_broken_verifier(verified(["KeyError: 'x'"] * 2))  # one sample scored: the function works
    refuse_a_broken_verifier(verified([], rows=0))  # nothing scored
    with pytest.raises(ConfigError, match=r"\(3\): KeyError: 'x' \(2x\); ImportError: no y \(1x\)"):
        refuse_a_broken_verifier(verified(["KeyError: 'x'", "ImportError: no y", "KeyError: 'x'"]))

"""A real 2-job sweep with Hydra's joblib launcher: both jobs at once, each with its own local Ray.

Also checks what each job's loggers got: W&B offline runs grouped by the
sweep and named by the swept override, TensorBoard scalars equal to
metrics.jsonl.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.tools.sweep import SUMMARY_FILE, read_statuses

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
TINY_RUN = [  # as in test_sweep.py, but one step (two Ray instances share the 2 cores), validated before and after
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.response_length=4",
    "trainer.total_training_steps=1",
    "trainer.test_freq=1",
]


def _tracking_tests():
    spec = importlib.util.spec_from_file_location("_tracking_tests", HERE / "test_tracking.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_joblib_launcher_runs_two_jobs_side_by_side(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "WANDB_MODE", "RAY_ADDRESS")}
    cmd = [
        str(Path(sys.executable).parent / "hybridflow-train"),
        "--multirun",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "trainer.seed=0,1",
        *TINY_RUN,
        "trainer.n_gpus_per_node=1",  # one rank per job: two jobs already share the 2 cores
        f"data.synthetic_dir={tmp_path / 'data'}",
        "trainer.logger=[jsonl,wandb,tensorboard]",
    ]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stderr[-3000:]

    [sweep_dir] = (tmp_path / "multirun").iterdir()  # the default sweep dir of configs/ppo_trainer.yaml
    assert re.fullmatch(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d", sweep_dir.name)
    statuses = read_statuses(sweep_dir)
    assert [(s["num"], s["name"], s["status"]) for s in statuses] == [(0, "seed=0", "ok"), (1, "seed=1", "ok")]
    # two Ray instances, both up at once: each connected before the other let go
    assert statuses[0]["ray_node_id"] != statuses[1]["ray_node_id"]
    assert max(s["ray_up_at"] for s in statuses) < min(s["ray_down_at"] for s in statuses)
    assert "2 jobs: 2 ok, 0 failed" in (sweep_dir / SUMMARY_FILE).read_text()

    tracking = _tracking_tests()
    for status in statuses:
        job_dir = Path(status["job_dir"])
        metrics = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
        train_steps = [(m["step"], m["score/mean"]) for m in metrics if "score/mean" in m]
        assert [step for step, _ in train_steps] == [1]
        final_val = [m["val/accuracy"] for m in metrics if "val/accuracy" in m][-1]
        assert status["val_accuracy"] == pytest.approx(final_val)

        events = EventAccumulator(str(job_dir / "tensorboard"), size_guidance={"scalars": 0})
        events.Reload()
        assert [(e.step, e.value) for e in events.Scalars("score/mean")] == [
            (step, pytest.approx(value)) for step, value in train_steps
        ]

        run, history = tracking.wandb_run_record(job_dir)
        assert (run.display_name, run.run_group) == (status["name"], sweep_dir.name)
        assert tracking.history_of(history, "score/mean") == [
            (step, pytest.approx(value)) for step, value in train_steps
        ]
        plugins = {item.key: json.loads(item.value_json) for item in run.config.update}["installed_plugins"]
        assert plugins["grpo"].startswith("hybridflow ")

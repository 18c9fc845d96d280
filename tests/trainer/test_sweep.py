"""Sweeps survive failing jobs: status files, the summary callback, and a real failing multirun."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from hybridflow.configs import CONFIG_DIR
from hybridflow.tools.sweep import SUMMARY_FILE, SweepSummary, read_statuses
from hybridflow.trainer.config_checks import ConfigError
from hybridflow.trainer.multirun import ERROR_FILE, STATUS_FILE, SweepJob, error_line, run_sweep_job

# A few-step job of the real trainer (see tests/trainer/test_e2e.py); the
# validation before and after the 2 steps gives a final accuracy.
TINY_RUN = [
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.rollout.response_length=4",
    "trainer.total_training_steps=2",
    "trainer.test_freq=2",
    "trainer.n_gpus_per_node=1",  # one rank: what a sweep does with its jobs does not depend on their ranks
]


def job(tmp_path, num, overrides):
    return SweepJob(
        sweep_dir=tmp_path,
        job_dir=tmp_path / str(num),
        num=num,
        overrides=overrides,
        swept_keys=frozenset({"algorithm.adv_estimator"}),
    )


def test_a_failing_job_is_recorded_not_raised(tmp_path):
    def broken() -> float:
        raise ValueError("first line\nunknown estimator 'x'")

    score = run_sweep_job(
        broken, job(tmp_path, 1, ["algorithm.adv_estimator=x", "trainer.seed=3"]), {"ray_node_id": "n1"}
    )
    assert math.isnan(score)
    status = json.loads((tmp_path / "1" / STATUS_FILE).read_text())
    assert status["status"] == "failed" and status["num"] == 1
    assert status["name"] == "adv_estimator=x,seed=3"
    assert status["error"] == "ValueError: unknown estimator 'x'"  # the traceback's last line
    assert status["val_accuracy"] is None and status["ray_node_id"] == "n1"
    assert status["ended_at"] - status["started_at"] == pytest.approx(status["wall_time_s"])
    traceback_text = (tmp_path / "1" / ERROR_FILE).read_text()
    assert traceback_text.startswith("Traceback") and "in broken" in traceback_text


def test_an_ok_job_records_its_accuracy(tmp_path):
    assert run_sweep_job(lambda: 0.375, job(tmp_path, 0, ["algorithm.adv_estimator=rloo"])) == 0.375
    status = json.loads((tmp_path / "0" / STATUS_FILE).read_text())
    assert (status["status"], status["val_accuracy"], status["name"]) == ("ok", 0.375, "adv_estimator=rloo")
    assert not (tmp_path / "0" / ERROR_FILE).exists()
    run_sweep_job(lambda: float("nan"), job(tmp_path, 2, ["algorithm.adv_estimator=gae"]))  # validation off
    assert json.loads((tmp_path / "2" / STATUS_FILE).read_text())["val_accuracy"] is None


def test_error_line_of_a_one_line_and_a_multi_line_error():
    assert error_line(KeyError("k")) == "KeyError: 'k'"
    assert error_line(ConfigError("invalid config:\n  - a=1 bad\n  - b=2 bad")) == "ConfigError: - b=2 bad"
    assert error_line(RuntimeError()) == "RuntimeError"


def test_summary_lists_each_job_of_this_sweep_and_exits_non_zero_on_failure(tmp_path, capsys):
    from omegaconf import OmegaConf

    run_sweep_job(lambda: 0.5, job(tmp_path, 5, ["algorithm.adv_estimator=stale"]))  # an older sweep in the same dir
    old = json.loads((tmp_path / "5" / STATUS_FILE).read_text())
    old["started_at"] -= 3600
    (tmp_path / "5" / STATUS_FILE).write_text(json.dumps(old))

    callback = SweepSummary()
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    callback.on_multirun_start(config)
    run_sweep_job(lambda: 0.625, job(tmp_path, 0, ["algorithm.adv_estimator=grpo"]))

    def broken() -> float:
        raise ConfigError("invalid config:\n  - algorithm.adv_estimator: unknown estimator 'bad' | see docs")

    run_sweep_job(broken, job(tmp_path, 1, ["algorithm.adv_estimator=bad"]))
    with pytest.raises(SystemExit, match=r"1 of 2 sweep jobs failed \(jobs 1\)"):
        callback.on_multirun_end(config)
    text = (tmp_path / SUMMARY_FILE).read_text()
    assert text in capsys.readouterr().out
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| job")]
    assert rows[0].startswith("| 0 | adv_estimator=grpo | ok | 0.625 | ")
    assert rows[1].startswith("| 1 | adv_estimator=bad | failed | - | ")
    assert rows[1].endswith("| ConfigError: - algorithm.adv_estimator: unknown estimator 'bad' \\| see docs |")
    assert len(rows) == 2 and "2 jobs: 1 ok, 1 failed" in text
    assert [r["num"] for r in read_statuses(tmp_path)] == [0, 1, 5]


def test_summary_of_a_clean_sweep_does_not_exit(tmp_path):
    from omegaconf import OmegaConf

    callback = SweepSummary()
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    callback.on_multirun_start(config)
    run_sweep_job(lambda: 1.0, job(tmp_path, 0, ["algorithm.adv_estimator=grpo"]))
    callback.on_multirun_end(config)
    assert "1 jobs: 1 ok, 0 failed" in (tmp_path / SUMMARY_FILE).read_text()


def test_a_single_run_exits_with_the_message_and_no_traceback(capsys):
    from hybridflow.configs.schema import register_configs
    from hybridflow.trainer.main import hydra_main

    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose("ppo_trainer", overrides=["algorithm.adv_estimator=not_an_estimator"])
    with pytest.raises(SystemExit) as exit_:
        hydra_main(cfg)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "algorithm.adv_estimator: unknown estimator 'not_an_estimator'" in err and "Traceback" not in err


@pytest.mark.slow
def test_failing_jobs_do_not_stop_a_real_sweep(tmp_path):
    """4 jobs: two fail their config check, one fails after its Ray started, the last one trains."""
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "WANDB_MODE", "RAY_ADDRESS")}
    sweep_dir = tmp_path / "sweep"
    cmd = [
        str(Path(sys.executable).parent / "hybridflow-train"),
        "--multirun",
        "algorithm.adv_estimator=not_an_estimator,grpo",
        "trainer.nnodes=2,1",
        *TINY_RUN,
        "trainer.n_gpus_per_node=1",  # one rank: the sweep, not the job, is under test
        f"data.synthetic_dir={tmp_path / 'data'}",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)
    assert out.returncode == 1, out.stderr[-3000:]
    assert "3 of 4 sweep jobs failed (jobs 0, 1, 2)" in out.stderr

    statuses = {s["num"]: s for s in read_statuses(sweep_dir)}
    assert {n: (s["name"], s["status"]) for n, s in statuses.items()} == {
        0: ("adv_estimator=not_an_estimator,nnodes=2", "failed"),
        1: ("adv_estimator=not_an_estimator,nnodes=1", "failed"),
        2: ("adv_estimator=grpo,nnodes=2", "failed"),
        3: ("adv_estimator=grpo,nnodes=1", "ok"),
    }
    for num in (0, 1):
        assert statuses[num]["error"].startswith(
            "ConfigError: - algorithm.adv_estimator: unknown estimator 'not_an_estimator'"
        )
        assert "ray_node_id" not in statuses[num]  # failed before Ray
    # two nodes asked of a one-node local Ray: fails after Ray started, naming the keys
    assert statuses[2]["error"].startswith("ConfigError: - trainer.nnodes=2 x trainer.n_gpus_per_node=")
    assert "Traceback" in (sweep_dir / "2" / ERROR_FILE).read_text()
    # build_and_fit stopped that Ray itself, and the next job started a fresh instance
    assert "Ray was still connected" not in (sweep_dir / "2" / "main.log").read_text()
    assert statuses[2]["ray_down_at"] <= statuses[3]["ray_up_at"]
    assert statuses[2]["ray_node_id"] != statuses[3]["ray_node_id"]

    metrics = [json.loads(line) for line in (sweep_dir / "3" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "actor/pg_loss" in m] == [1, 2]
    final_val = [m["val/accuracy"] for m in metrics if "val/accuracy" in m][-1]
    assert statuses[3]["val_accuracy"] == pytest.approx(final_val)

    summary = (sweep_dir / SUMMARY_FILE).read_text()
    assert summary in out.stdout
    assert "4 jobs: 1 ok, 3 failed" in summary
    assert f"| 3 | adv_estimator=grpo,nnodes=1 | ok | {final_val:.3f} | " in summary
    assert "| 0 | adv_estimator=not_an_estimator,nnodes=2 | failed | - | " in summary
    assert "unknown estimator 'not_an_estimator'" in summary.splitlines()[-4]


def test_synthetic_data_of_each_seed_has_its_own_directory(tmp_path):
    """Parallel jobs with different seeds must not read each other's split of the task."""
    import pyarrow.parquet as pq
    from omegaconf import OmegaConf

    from hybridflow.configs.schema import PPOConfig
    from hybridflow.trainer.main import resolve_data_files

    def files(seed):
        cfg = OmegaConf.structured(PPOConfig)
        OmegaConf.update(cfg, "data.synthetic_dir", str(tmp_path / "data"))
        OmegaConf.update(cfg, "trainer.seed", seed)
        return resolve_data_files(OmegaConf.to_object(cfg))

    (train0,), (val0,) = files(0)
    (train1,), (val1,) = files(1)
    assert (train0, val1) == (str(tmp_path / "data/seed0/train.parquet"), str(tmp_path / "data/seed1/val.parquet"))
    prompts0 = pq.read_table(val0).column("prompt").to_pylist()
    assert prompts0 != pq.read_table(val1).column("prompt").to_pylist()  # the seed picks the split
    assert files(0) == ([train0], [val0]) and pq.read_table(val0).column("prompt").to_pylist() == prompts0
    assert sorted(p.name for p in (tmp_path / "data" / "seed0").iterdir()) == ["train.parquet", "val.parquet"]

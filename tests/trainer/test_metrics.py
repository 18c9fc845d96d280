import json
import time

import pytest
import torch

from hybridflow.core import DataProto
from hybridflow.trainer.metrics import StageTimer, compute_data_metrics, throughput_metrics
from hybridflow.trainer.tracking import RunInfo, Tracking


def finished_batch():
    return DataProto.from_dict(
        {
            "response_mask": torch.tensor([[1, 1, 1], [1, 0, 0]]),
            "attention_mask": torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 0, 0]]),
            "token_level_scores": torch.tensor([[0.0, 0.0, 1.0], [0.2, 0.0, 0.0]]),
            "advantages": torch.tensor([[1.0, 1.0, 1.0], [-3.0, 9.0, 9.0]]),
        }
    )


def test_data_metrics_hand_computed():
    m = compute_data_metrics(finished_batch())
    assert m["score/mean"] == pytest.approx(0.6)
    assert m["score/accuracy"] == 0.5
    assert m["response_length/mean"] == 2.0 and m["response_length/max"] == 3.0
    assert m["response_length/clip_ratio"] == 0.5
    assert m["prompt_length/mean"] == pytest.approx(((4 - 3) + (3 - 1)) / 2)
    # masked advantages (the 9s) are ignored
    assert m["advantages/max"] == 1.0 and m["advantages/min"] == -3.0 and m["advantages/mean"] == pytest.approx(0.0)


def test_timer_accumulates_per_stage():
    timer = StageTimer()
    for _ in range(2):
        with timer("gen"):
            time.sleep(0.02)
    with timer("adv"):
        pass
    m = timer.metrics()
    assert sorted(m) == ["timing_s/adv", "timing_s/gen"]
    assert 0.04 <= m["timing_s/gen"] < 1.0 and m["timing_s/adv"] < 0.02


def test_throughput_counts_all_attended_tokens():
    m = throughput_metrics(finished_batch(), step_seconds=2.0, world_size=2)
    assert m["perf/total_tokens"] == 7 and m["perf/tokens_per_s"] == 3.5 and m["perf/tokens_per_s_per_rank"] == 1.75


def test_jsonl_sink_writes_every_metric(tmp_path):
    tracking = Tracking(["jsonl", "console"], RunInfo(tmp_path))
    tracking.log({"score/mean": 0.5, "bad": float("nan")}, step=1)
    tracking.log({"score/mean": 0.75}, step=2)
    tracking.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": 1, "score/mean": 0.5, "bad": "nan"}, {"step": 2, "score/mean": 0.75}]


def test_unknown_logger_lists_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match=r"unknown back-end\(s\) \['wandbb'\]; allowed: console, jsonl, wandb"):
        Tracking(["wandbb"], RunInfo(tmp_path))


def test_wandb_runs_offline_without_an_account(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    info = RunInfo(tmp_path, project="p", name="adv_estimator=rloo,seed=1", group="sweep", config={"lr": 0.5})
    tracking = Tracking(["wandb"], info)
    tracking.log({"score/mean": 0.25}, step=1)
    tracking.close()
    [run_dir] = (tmp_path / "wandb").glob("offline-run-*")
    [records] = run_dir.glob("run-*.wandb")
    data = records.read_bytes()
    assert b"score/mean" in data and b"adv_estimator=rloo,seed=1" in data and b"sweep" in data

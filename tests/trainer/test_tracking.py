"""Metric sinks: TensorBoard event files read back, W&B offline runs named from the config or the sweep."""

import json
import struct
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from hybridflow.configs.schema import PPOConfig
from hybridflow.trainer.config_checks import ConfigError, check_config
from hybridflow.trainer.multirun import job_run_name, logger_names, short_keys
from hybridflow.trainer.tracking import (
    SINKS,
    JsonlSink,
    RunInfo,
    TensorBoardSink,
    Tracking,
    WandbSink,
    drop_steps_after,
    read_step,
)

STEPS = [
    {"score/mean": 0.25, "actor/pg_loss": -0.5, "note": "not a number"},
    {"score/mean": 0.5, "actor/pg_loss": -0.25, "note": "still not"},
    {"score/mean": 0.75, "actor/pg_loss": 0.125, "val/accuracy": 0.375},
]


def read_wandb_records(path):
    """Records of a W&B transaction log (``run-*.wandb``), parsed with W&B's own protobuf classes.

    The file is a 7-byte header (``:W&B``, magic, version) then LevelDB-log
    style 32 KiB blocks of chunks: crc32 (4 bytes), length (2), type
    (1: full, 2: first, 3: middle, 4: last).
    """
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_run_record(run_dir):
    """(run record, history records) of the one offline W&B run under ``run_dir/wandb``."""
    [log] = Path(run_dir, "wandb").glob("offline-run-*/run-*.wandb")
    records = list(read_wandb_records(log))
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    history = [r.history for r in records if r.WhichOneof("record_type") == "history"]
    return run, history


def history_of(history, key):
    """(step, value) of ``key`` in W&B history records (a key with "/" is stored as its parts)."""
    found = []
    for record in history:
        items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.item}
        if key in items:
            found.append((items["_step"], items[key]))
    return found


def test_tensorboard_sink_writes_scalars_per_step_and_the_config(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    info = RunInfo(
        run_dir=tmp_path,
        name="adv_estimator=rloo,seed=1",
        group="sweep-a",
        config={"algorithm": {"adv_estimator": "rloo"}, "installed_plugins": {"rloo": "hybridflow 0.1.0"}},
    )
    tracking = Tracking(["jsonl", "tensorboard"], info)
    for step, metrics in enumerate(STEPS, start=1):
        tracking.log(metrics, step)
    tracking.close()

    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert sorted(scalars) == ["actor/pg_loss", "score/mean", "val/accuracy"]  # the strings are left out
    assert [(e.step, e.value) for e in events.Scalars("score/mean")] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert [(e.step, e.value) for e in events.Scalars("actor/pg_loss")] == [(1, -0.5), (2, -0.25), (3, 0.125)]
    assert [(e.step, e.value) for e in events.Scalars("val/accuracy")] == [(3, 0.375)]
    [text] = events.Tensors("config/text_summary")
    shown = text.tensor_proto.string_val[0].decode()
    assert shown.startswith("run `adv_estimator=rloo,seed=1` in group `sweep-a`")
    config = json.loads("\n".join(line[4:] for line in shown.split("\n\n", 1)[1].splitlines()))
    assert config == {"algorithm": {"adv_estimator": "rloo"}, "installed_plugins": {"rloo": "hybridflow 0.1.0"}}
    # the jsonl sink beside it got the same numbers
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["actor/pg_loss"] for r in rows] == [-0.5, -0.25, 0.125]


def test_missing_tensorboard_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # makes the import fail as if not installed
    with pytest.raises(ImportError, match=r"pip install 'hybridflow\[tensorboard\]'"):
        TensorBoardSink(RunInfo(run_dir=tmp_path))


def test_config_checks_accept_every_sink_name_and_reject_others():
    assert set(SINKS) == {"console", "jsonl", "wandb", "tensorboard"}
    cfg = OmegaConf.structured(PPOConfig)
    OmegaConf.update(cfg, "trainer.logger", ["console", "tensorboard"])
    check_config(OmegaConf.to_object(cfg))
    OmegaConf.update(cfg, "trainer.logger", ["tensorbord"])
    with pytest.raises(
        ConfigError, match=r"trainer.logger has \['tensorbord'\]; allowed: console, jsonl, wandb, tensorboard"
    ):
        check_config(OmegaConf.to_object(cfg))


def test_wandb_offline_run_has_the_configured_group_and_name(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    info = RunInfo(
        run_dir=tmp_path,
        project="proj-x",
        name="lr=0.001,seed=2",
        group="my-sweep",
        config={"trainer": {"seed": 2}, "installed_plugins": {"grpo": "hybridflow 0.1.0"}},
    )
    tracking = Tracking(["wandb"], info)
    [sink] = [s for s in tracking.sinks if isinstance(s, WandbSink)]
    assert (sink.run.name, sink.run.group, sink.run.project) == ("lr=0.001,seed=2", "my-sweep", "proj-x")
    tracking.log({"score/mean": 0.5}, 1)
    tracking.log({"score/mean": 0.75}, 2)
    tracking.close()
    run, history = wandb_run_record(tmp_path)
    assert (run.display_name, run.run_group, run.project) == ("lr=0.001,seed=2", "my-sweep", "proj-x")
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["installed_plugins"] == {"grpo": "hybridflow 0.1.0"}
    assert config["trainer"] == {"seed": 2}
    assert history_of(history, "score/mean") == [(1, 0.5), (2, 0.75)]


def test_single_run_names_outside_a_sweep():
    assert logger_names(None, None, "default") == (None, "default")
    assert logger_names("grp", "explicit", "default") == ("grp", "explicit")


def test_short_keys_keep_just_enough_of_each_key():
    assert short_keys(["algorithm.adv_estimator", "trainer.seed"]) == ["adv_estimator", "seed"]
    assert short_keys(["actor_rollout_ref.actor.optim.lr", "critic.optim.lr", "trainer.seed"]) == [
        "actor.optim.lr",
        "critic.optim.lr",
        "seed",
    ]


def test_job_run_name_keeps_swept_overrides_and_the_seed():
    job = ["algorithm.adv_estimator=rloo", "trainer.total_training_steps=200", "trainer.seed=1"]
    assert job_run_name(job, frozenset({"algorithm.adv_estimator", "trainer.seed"})) == "adv_estimator=rloo,seed=1"
    # a fixed seed stays in the name; other fixed overrides do not
    assert job_run_name(job, frozenset({"algorithm.adv_estimator"})) == "adv_estimator=rloo,seed=1"
    # swept keys unknown (another sweeper): every override of the job
    assert job_run_name(job, None) == "adv_estimator=rloo,total_training_steps=200,seed=1"
    assert job_run_name([], None) is None


def test_group_override_is_named_by_its_group():
    name = job_run_name(["model@actor_rollout_ref.model=tiny", "trainer.seed=0"], frozenset({"model"}))
    assert name == "model=tiny,seed=0"


TABLE = [["<bos><|user|>1+2=<|assistant|>", "3<eos>", "3", 1.0], ["a | b\nc", "x", "y", 0.0]]


def test_every_sink_records_a_table(tmp_path, monkeypatch, caplog):
    """One table through ``Tracking.log_table`` lands in all four sinks, row for row."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hybridflow.trainer.tracking import GENERATION_COLUMNS

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    tracking = Tracking(["console", "jsonl", "wandb", "tensorboard"], RunInfo(run_dir=tmp_path))
    with caplog.at_level("INFO", logger="hybridflow.metrics"):
        tracking.log({"score/mean": 0.5}, 3)
        tracking.log_table("val/generations", GENERATION_COLUMNS, TABLE, 3)
    tracking.close()
    lines = [r.getMessage() for r in caplog.records if "val/generations" in r.getMessage()]
    assert lines == [
        "step 3 val/generations[0]: prompt='<bos><|user|>1+2=<|assistant|>' response='3<eos>' ground_truth='3' score=1",
        "step 3 val/generations[1]: prompt='a | b\\nc' response='x' ground_truth='y' score=0",
    ]
    rows = [json.loads(line) for line in (tmp_path / "val_generations.jsonl").read_text().splitlines()]
    assert rows == [{"step": 3, **dict(zip(GENERATION_COLUMNS, row))} for row in TABLE]
    # W&B: the history record of step 3 points at a table file in the offline run holding the rows
    _, history = wandb_run_record(tmp_path)
    [(step, path)] = history_of(history, "val/generations/path")
    [(_, nrows)] = history_of(history, "val/generations/nrows")
    assert (step, nrows) == (3, 2)
    [files] = Path(tmp_path, "wandb").glob("offline-run-*/files")
    table = json.loads((files / path).read_text())
    assert table["columns"] == list(GENERATION_COLUMNS)
    assert table["data"] == TABLE
    # TensorBoard: a markdown table as text, the cells' pipes escaped and newlines flattened
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    [text] = events.Tensors("val/generations/text_summary")
    assert text.step == 3
    assert text.tensor_proto.string_val[0].decode().splitlines() == [
        "| prompt | response | ground_truth | score |",
        "|---|---|---|---|",
        "| <bos><\\|user\\|>1+2=<\\|assistant\\|> | 3<eos> | 3 | 1.0 |",
        "| a \\| b c | x | y | 0.0 |",
    ]


def test_console_cuts_long_text_cells(caplog):
    from hybridflow.trainer.tracking import CONSOLE_TEXT_CHARS, ConsoleSink

    with caplog.at_level("INFO", logger="hybridflow.metrics"):
        ConsoleSink().log_table("t", ["text", "n"], [["x" * (CONSOLE_TEXT_CHARS + 50), 0.123456]], 1)
    [record] = caplog.records
    assert record.getMessage() == f"step 1 t[0]: text='{'x' * CONSOLE_TEXT_CHARS}...' n=0.1235"


def read_lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.mark.parametrize("backends", [["console"], ["console", "wandb"], ["jsonl", "console"]])
def test_metrics_jsonl_is_written_whatever_the_logger_lists(tmp_path, monkeypatch, backends):
    """``hybridflow compare`` and a resume read ``metrics.jsonl``: a run that lists only console (and W&B) still
    writes it, and one that lists ``jsonl`` writes each step once."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    tracking = Tracking(backends, RunInfo(run_dir=tmp_path))
    for step, metrics in enumerate(STEPS, start=1):
        tracking.log(metrics, step)
    tracking.close()
    assert sum(isinstance(s, JsonlSink) for s in tracking.sinks) == 1
    logged = [(r["step"], r["score/mean"]) for r in read_lines(tmp_path / "metrics.jsonl")]
    assert logged == [(1, 0.25), (2, 0.5), (3, 0.75)]


def test_drop_steps_after_rewrites_the_file_without_later_steps_and_a_torn_line(tmp_path):
    """A run killed at step 38 that resumes from its step-30 checkpoint: steps 31..38 go, and the line the kill cut
    short; the file is replaced in one rename (no temporary file left beside it)."""
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": step, "score/mean": step / 100}) for step in range(39)]
    path.write_text("\n".join(lines) + '\n{"step": 39, "score/me')  # killed mid-write
    assert drop_steps_after(path, 30) == 9
    assert [r["step"] for r in read_lines(path)] == list(range(31))
    assert read_lines(path)[30] == {"step": 30, "score/mean": 0.3}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
    before = path.stat().st_mtime_ns
    assert drop_steps_after(path, 30) == 0 and path.stat().st_mtime_ns == before  # nothing to drop: untouched
    assert drop_steps_after(tmp_path / "missing.jsonl", 30) == 0 and not (tmp_path / "missing.jsonl").exists()


def test_rewind_drops_later_steps_of_metrics_and_tables_and_logs_on_after_them(tmp_path):
    from hybridflow.trainer.tracking import GENERATION_COLUMNS, GENERATIONS_TABLE

    first = Tracking(["console"], RunInfo(run_dir=tmp_path))
    for step in range(4):  # checkpoint at 2, killed after logging 3
        first.log({"score/mean": step / 10, **({"val/accuracy": 0.25} if step == 0 else {})}, step)
        first.log_table(GENERATIONS_TABLE, GENERATION_COLUMNS, [["p", "r", "t", float(step)]], step)
    first.close()
    resumed = Tracking(["console"], RunInfo(run_dir=tmp_path))  # opened before the checkpoint is loaded
    resumed.rewind(2)
    resumed.log({"score/mean": 0.99}, 3)
    resumed.log_table(GENERATIONS_TABLE, GENERATION_COLUMNS, [["p", "r", "t", 9.0]], 3)
    resumed.close()
    assert [(r["step"], r["score/mean"]) for r in read_lines(tmp_path / "metrics.jsonl")] == [
        (0, 0.0),
        (1, 0.1),
        (2, 0.2),
        (3, 0.99),
    ]
    assert [(r["step"], r["score"]) for r in read_lines(tmp_path / "val_generations.jsonl")] == [
        (0, 0.0),
        (1, 1.0),
        (2, 2.0),
        (3, 9.0),
    ]
    assert read_step(tmp_path / "metrics.jsonl", 0) == {"score/mean": 0.0, "val/accuracy": 0.25}
    assert read_step(tmp_path / "metrics.jsonl", 7) == {} and read_step(tmp_path / "missing.jsonl", 0) == {}

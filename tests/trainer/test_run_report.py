"""A run tells its user where things are: the run directory, each checkpoint, the summary; nothing left behind by a
config error; log lines above the progress bar, not in it."""

import io
import json
import logging
import os
import re
import subprocess
import sys

import pytest

from hybridflow.trainer import launch

TRAIN = [sys.executable, "-m", "hybridflow.trainer.main"]
SMALL = [
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.rollout.n=4",
    "trainer.test_freq=0",
    "trainer.n_gpus_per_node=1",  # one rank: each costs the suite a process start
]


def clean_env():
    return {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "WANDB_API_KEY", "WANDB_MODE")}


def summary_rows(stdout: str) -> dict[str, str]:
    """The rows of the summary table (``trainer/main.py`` ``format_summary``), name -> value."""
    table = stdout.split("hybridflow run summary", 1)[1].splitlines()[2:]
    return {name: value for name, value in (re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in table if line)}


# veRL's spellings of its example scripts (sized for the tiny model), which the run must take as written
# (tests/trainer/test_verl_command_line.py has each key's translation on its own, trainer.save_freq=-1 included)
VERL = [
    "data.max_response_length=4",
    "data.filter_overlong_prompts=True",
    "data.truncation='error'",
    "trainer.critic_warmup=0",
    "critic.model.path=builtin:tiny-qwen2",
    "actor_rollout_ref.rollout.mode=async",
    "critic.model.fsdp_config.param_offload=False",
    "+trainer.val_before_train=False",
]


@pytest.mark.slow
def test_a_run_prints_its_directory_and_each_checkpoint_and_writes_metrics_with_console_only(tmp_path):
    """``hybridflow-train`` in a fresh directory, Hydra's default run directory, ``trainer.logger=[console]``,
    written as a veRL script writes it: data files as plain strings, veRL's keys (one line each at start)."""
    from hybridflow.data import SYNTHETIC_GENERATORS

    files = SYNTHETIC_GENERATORS["arithmetic"][1](str(tmp_path / "data"), seed=0)
    verl = [f"data.train_files={files['train']}", f"data.val_files={files['val']}", *VERL]
    # validation after the last step only (test_freq past the run): val_before_train=False is seen to act
    small = [a for a in SMALL if not a.startswith("trainer.test_freq=")] + [
        "trainer.test_freq=5",
        "data.val_batch_size=8",
    ]
    out = subprocess.run(
        [
            *TRAIN,
            *small,
            "trainer.total_training_steps=2",
            "trainer.save_freq=1",
            "trainer.logger=[console]",
            "actor_rollout_ref.model.path=builtin:tiny-qwen2",
            *verl,
        ],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    said = [line for line in out.stderr.splitlines() if line.startswith("hybridflow-train: ")]
    assert len(said) == len(verl), said  # one line per veRL spelling, none refused
    [run_dir] = (tmp_path / "outputs").glob("*/*")  # outputs/<date>/<time>
    console = out.stdout + out.stderr
    # the default trainer.device=auto, found on this machine (no GPU) and said before the run starts
    assert "trainer.device=auto: cpu (no GPU visible to torch on this machine" in console
    assert console.index("trainer.device=auto") < console.index("run directory:")
    assert f"run directory: {run_dir}\n" in console
    ckpts = [run_dir / "checkpoints" / f"global_step_{step}" for step in (1, 2)]
    for step, path in zip((1, 2), ckpts):
        assert f"saved checkpoint of step {step}: {path}\n" in console
        assert path.is_dir()
    rows = summary_rows(out.stdout)
    assert rows["run directory"] == str(run_dir)
    assert rows["checkpoints"] == f"2 saved, 2 kept, last: {ckpts[-1]}"
    assert rows["hf export"] == "none (trainer.save_hf_on_end=false)"
    assert rows["validation accuracy before"] == "not run (trainer.val_before_train=false)"
    # only the console was asked for, and metrics.jsonl is there (what hybridflow compare reads)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    assert "val/accuracy" not in lines[0] and "val/accuracy" in lines[1]


# a one-step run with a bad value: were the value ever accepted, the test fails in seconds, not after 400 steps
BAD = ["actor_rollout_ref.rollout.n=0", "trainer.total_training_steps=1", "trainer.test_freq=0"]


def test_a_config_error_leaves_no_run_directory(tmp_path):
    out = subprocess.run(
        [*TRAIN, *BAD, f"data.synthetic_dir={tmp_path}/data"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    assert "actor_rollout_ref.rollout.n=0 must be >= 1" in out.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == []  # not even outputs/<date>/


def test_a_config_error_keeps_a_run_directory_that_holds_anything_else(tmp_path):
    """A run directory given with ``hydra.run.dir`` that holds the user's own file (or an earlier run's) stays."""
    run_dir = tmp_path / "runs" / "mine"
    run_dir.mkdir(parents=True)
    (run_dir / "notes.txt").write_text("mine")
    out = subprocess.run(
        [*TRAIN, *BAD, f"data.synthetic_dir={tmp_path}/data", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr[-3000:]
    assert (run_dir / "notes.txt").read_text() == "mine" and (run_dir / ".hydra" / "config.yaml").is_file()


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_log_lines_print_above_the_progress_bar_not_into_it(monkeypatch, caplog):
    """On a terminal the bar redraws its line without a newline; a log line written straight after it would
    continue that line (``training: 50%|... 1/2 [...]saved checkpoint ...``)."""
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    caplog.set_level(logging.INFO)
    handler = logging.StreamHandler(sys.stderr)  # a console handler as Hydra installs one (there on stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    log = logging.getLogger("hybridflow.test_progress")
    try:
        with launch.Progress(total=2, initial=0) as progress:
            progress.update(score=0.5)
            log.info("saved checkpoint of step 1: /runs/x")
            progress.update(score=0.75)
        log.info("after the bar")
        assert handler in root.handlers  # the console handler is given back
    finally:
        root.removeHandler(handler)
    lines = terminal.getvalue().split("\n")
    [line] = [line for line in lines if "saved checkpoint" in line]
    assert line.split("\r")[-1] == "saved checkpoint of step 1: /runs/x"  # the bar was cleared first
    assert "after the bar" in lines


def test_the_summary_says_what_is_true_of_a_resumed_run_and_where_the_export_went(tmp_path):
    """A run killed at step 38 resumed from its step-30 checkpoint with ``test_freq`` 50: validation before was not
    run by this run, and not because of test_freq (the first run's step-0 numbers, when logged, are shown instead:
    ``test_resume.py``)."""
    from omegaconf import OmegaConf

    from hybridflow.configs.schema import PPOConfig
    from hybridflow.trainer.main import format_summary
    from hybridflow.trainer.ppo_trainer import RunSummary

    config = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(PPOConfig), {"trainer": {"test_freq": 50}}))
    last = tmp_path / "checkpoints" / "global_step_40"
    summary = RunSummary(
        steps=40,
        run_dir=tmp_path,
        resumed_at=30,
        checkpoints=[tmp_path / "x", last],
        checkpoints_kept=2,
        hf_export=tmp_path / "hf_model",
        val_after={"val/accuracy": 0.5},
    )
    rows = summary_rows(format_summary(summary, config))
    assert rows["validation accuracy before"] == "not run (resumed at step 30)"
    assert rows["validation accuracy after"] == "0.500"
    assert rows["steps"] == "40 (resumed at step 30)"
    assert rows["checkpoints"] == f"2 saved, 2 kept, last: {last}"
    assert rows["hf export"] == str(tmp_path / "hf_model")
    config.trainer.test_freq = config.trainer.save_freq = 0
    rows = summary_rows(format_summary(RunSummary(steps=3, run_dir=tmp_path), config))
    assert rows["validation accuracy before"] == "not run (trainer.test_freq=0)" and rows["steps"] == "3"
    assert rows["checkpoints"] == "none saved (trainer.save_freq=0)"
    assert rows["trained"] == "all parameters"
    assert rows["prompts trained"] == "none recorded"
    lines = [{"step": s, "epoch": s // 3, "prompt_id": p} for s in (1, 2, 3) for p in (2 * s % 5, 4)]
    (tmp_path / "trained_prompts.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    rows = summary_rows(format_summary(RunSummary(steps=3, run_dir=tmp_path), config))  # ids 2, 4, 4, 4, 1, 4
    assert rows["prompts trained"] == f"6 (3 distinct, epochs 0-1): {tmp_path / 'trained_prompts.jsonl'}"
    config.actor_rollout_ref.model.lora_rank = 8
    rows = summary_rows(format_summary(RunSummary(steps=3, run_dir=tmp_path), config))
    assert rows["trained"] == (
        "LoRA adapters (rank 8, alpha 16); no reference group: the reference is the model with its adapters off"
    )

"""Every bad setting of ``bench/bad_settings.py`` is refused before Ray starts, naming its key.

In process, the way ``hybridflow-train`` goes: the overrides against the
schema, then the composed config's check, then (for the cases that need the
data) the data files as they load and the prompt sets against the batch size.
Two cases also go through the real command: exit status 2, at most 5 lines,
no traceback, a few seconds. Every case of issue 27 (settings that were found
in a worker, by Ray or by Hydra) gives its message in process, and one case of
each stage that refuses them goes through the real command: exit 2 within
20 s, no traceback, the key named.
"""

import importlib.util
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from hybridflow.configs import CONFIG_DIR
from hybridflow.configs.overrides import override_problems
from hybridflow.configs.schema import register_configs
from hybridflow.trainer.config_checks import ConfigError, check_datasets, config_problems, dataset_rows

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bad_settings", ROOT / "bench" / "bad_settings.py")
bad_settings = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bad_settings)


def refusal(overrides: list[str], tmp_path: Path) -> list[str]:
    """What stops this run before Ray: the first stage that has something to say."""
    problems = override_problems(overrides)
    if problems:
        return problems
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        config = OmegaConf.to_object(compose("ppo_trainer", overrides=overrides))
    problems = config_problems(config)
    if problems:
        return problems
    from hybridflow.trainer.main import resolve_data_files
    from hybridflow.trainer.prompt_loader import PromptSet
    from hybridflow.workers.models import load_tokenizer

    config.data.synthetic_dir = str(tmp_path / "data")
    train_files, val_files = resolve_data_files(config)
    tokenizer = load_tokenizer(config.actor_rollout_ref.model.path)
    try:
        train_rows, _ = dataset_rows(config.data, train_files, val_files)
        train = PromptSet.from_rows(train_rows, tokenizer, config.data.max_prompt_length)
        check_datasets(config, len(train), 1, {"train": train_files, "val": val_files})
    except ConfigError as err:
        return str(err).splitlines()[1:]
    return []


def keys(overrides: list[str]) -> list[str]:
    return [o.key_or_group for o in OverridesParser.create().parse_overrides(overrides)]


@pytest.mark.parametrize("label,overrides", bad_settings.CASES, ids=[label for label, _ in bad_settings.CASES])
def test_refused_before_ray_naming_the_key(label, overrides, tmp_path):
    (tmp_path / "not_a_checkpoint").mkdir()
    bad_settings.bad_data_files(tmp_path)
    with bad_settings.busy_port() as port:
        args = bad_settings.filled(bad_settings.BASE + overrides, tmp_path, port)
        problems = refusal(args, tmp_path)
    assert problems, f"{label}: nothing refused {overrides}"
    named = [k for k in keys(args[len(bad_settings.BASE) :]) if any(k in p or k.split(".")[-1] in p for p in problems)]
    assert named, (label, problems)


@pytest.mark.parametrize(
    "override,expected",
    [
        ("actor_rollout_ref.actor.optim.lr=-0.001", "actor_rollout_ref.actor.optim.lr=-0.001 must be > 0"),
        ("trainer.total_trainig_steps=3", "did you mean trainer.total_training_steps?"),
    ],
)
def test_the_command_exits_2_in_a_few_lines_without_a_traceback(override, expected, tmp_path):
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "hybridflow.trainer.main", override],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    seconds = time.perf_counter() - start
    text = (out.stdout + out.stderr).strip()
    assert out.returncode == 2, text
    assert expected in text and "Traceback" not in text
    assert len(text.splitlines()) <= 5, text
    assert seconds < 30  # imports only: nothing started


# What the message of each case of issue 27 says (the key first; the file's name for a data file)
ISSUE_27_MESSAGES = {
    "typo in a policy loss option": [
        "actor_rollout_ref.actor.policy_loss_options has ['clip_ratio_hgh']; policy loss 'vanilla' takes {"
    ],
    "text for a policy loss option": [
        "actor_rollout_ref.actor.policy_loss_options.clip_ratio_high='high' is text; policy loss 'vanilla' takes a "
        "number there (default 0.2)"
    ],
    "true for an estimator option": [
        "algorithm.estimator_options.epsilon=True is true or false; estimator 'grpo' takes a number there"
    ],
    "text for an agent loop option": [
        "actor_rollout_ref.rollout.agent.options.max_turns='two' is text; agent loop 'tool_calling' takes an integer"
    ],
    "a number for a batch hook option": [
        "algorithm.batch_hook_options['dynamic_sampling'].metric=1 is an integer; hook 'dynamic_sampling' takes text"
    ],
    "missing train file": ["  - data.train_files: ", "missing.parquet: no such file; allowed: parquet files"],
    "zero-byte train file": ["  - data.train_files: ", "zero.parquet: the file is empty (0 bytes)"],
    "train file of no rows": ["  - data.train_files: ", "no_rows.parquet: the file has no rows"],
    "train file without a prompt column": ["  - data.train_files: ", "no_prompt.parquet: missing column(s) ['prompt']"],
    "text file named .parquet": ["  - data.train_files: ", "text.parquet: not a readable parquet file"],
    "validation file without a prompt column": [
        "  - data.val_files: ",
        "no_prompt.parquet: missing column(s) ['prompt']",
    ],
    "more rollout ranks than the machine holds": [
        "trainer.rollout_ranks=1024 with trainer.placement=split",
        "but this machine has",
        "lower trainer.rollout_ranks",
    ],
    "server on a busy port": ["actor_rollout_ref.rollout.server.port=", "is in use", "or 0 to let the server pick one"],
    "server on an address not of this machine": [
        "actor_rollout_ref.rollout.server.host='192.0.2.1' is not an address of this machine",
        "use a local address",
    ],
}


def run_command(label: str, overrides: list[str], tmp_path: Path) -> dict:
    """One case through the real ``hybridflow-train`` in a directory of its own (Hydra's outputs go there)."""
    case_dir = tmp_path / label.replace(" ", "_")
    (case_dir / "not_a_checkpoint").mkdir(parents=True)
    bad_settings.bad_data_files(case_dir)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "HYDRA_FULL_ERROR")}
    with bad_settings.busy_port() as port:
        args = bad_settings.filled(bad_settings.BASE + overrides, case_dir, port)
        cmd = [str(Path(sys.executable).parent / "hybridflow-train"), *args, f"data.synthetic_dir={case_dir}/data"]
        start = time.perf_counter()
        out = subprocess.run(cmd, cwd=case_dir, env=env, capture_output=True, text=True, timeout=120)
    return {
        "label": label,
        "rc": out.returncode,
        "seconds": time.perf_counter() - start,
        "stderr": out.stderr,
        "text": out.stdout + out.stderr,
    }


@pytest.mark.parametrize(
    "label,overrides", bad_settings.ISSUE_27_CASES, ids=[c[0] for c in bad_settings.ISSUE_27_CASES]
)
def test_each_setting_of_issue_27_is_refused_with_its_message(label, overrides, tmp_path):
    """In process, the command's path: the stage that refuses it says what ISSUE_27_MESSAGES holds."""
    (tmp_path / "not_a_checkpoint").mkdir()
    bad_settings.bad_data_files(tmp_path)
    with bad_settings.busy_port() as port:
        args = bad_settings.filled(bad_settings.BASE + overrides, tmp_path, port)
        text = "\n".join(refusal(args, tmp_path))
    missing = [m for m in ISSUE_27_MESSAGES[label] if m.strip() not in text]
    assert missing == [], text


# One case per stage through the real command: a plugin option (the composed config's check), a data file (read
# as it loads), the machine (a port in use). Each process costs seconds of imports: the rest run in process above.
THROUGH_THE_COMMAND = ("typo in a policy loss option", "text file named .parquet", "server on a busy port")


@pytest.mark.slow
def test_each_stage_of_issue_27_exits_2_within_20_s_naming_the_key(tmp_path):
    """Through the real command, two at a time: exit 2 within 20 s, no traceback, a few lines, the key named."""
    assert sorted(ISSUE_27_MESSAGES) == sorted(label for label, _ in bad_settings.ISSUE_27_CASES)
    cases = [case for case in bad_settings.ISSUE_27_CASES if case[0] in THROUGH_THE_COMMAND]
    assert len(cases) == len(THROUGH_THE_COMMAND)
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda case: run_command(*case, tmp_path), cases))
    for r in results:  # shown with -s: the wall time of each case
        print(f"{r['label']}: exit {r['rc']} in {r['seconds']:.1f} s")
    failures = [
        (r["label"], r["rc"], round(r["seconds"], 1), r["text"][-1500:])
        for r in results
        if r["rc"] != 2
        or r["seconds"] >= 20
        or "Traceback" in r["text"]
        or len(r["text"].strip().splitlines()) > 6
        or not all(m in r["stderr"] for m in ISSUE_27_MESSAGES[r["label"]])
    ]
    assert failures == []

"""Every bad setting of ``bench/bad_settings.py`` is refused before Ray starts, naming its key.

In process, the way ``hybridflow-train`` goes: the overrides against the
schema, then the composed config's check, then (for the one case that needs
the data) the prompt sets against the batch size. Two cases also go through
the real command: exit status 2, at most 5 lines, no traceback, a few seconds.
"""

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from hybridflow.configs import CONFIG_DIR
from hybridflow.configs.schema import register_configs
from hybridflow.trainer.config_checks import ConfigError, check_datasets, config_problems
from hybridflow.trainer.overrides import override_problems

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
    from hybridflow.data.loading import load_rows
    from hybridflow.trainer.main import resolve_data_files
    from hybridflow.trainer.prompt_loader import PromptSet
    from hybridflow.workers.models import load_tokenizer

    config.data.synthetic_dir = str(tmp_path / "data")
    train_files, val_files = resolve_data_files(config)
    tokenizer = load_tokenizer(config.actor_rollout_ref.model.path)
    train = PromptSet.from_rows(load_rows(train_files)[0], tokenizer, config.data.max_prompt_length)
    try:
        check_datasets(config, len(train), 1, {"train": train_files, "val": val_files})
    except ConfigError as err:
        return str(err).splitlines()[1:]
    return []


def keys(overrides: list[str]) -> list[str]:
    return [o.key_or_group for o in OverridesParser.create().parse_overrides(overrides)]


@pytest.mark.parametrize("label,overrides", bad_settings.CASES, ids=[label for label, _ in bad_settings.CASES])
def test_refused_before_ray_naming_the_key(label, overrides, tmp_path):
    notckpt = tmp_path / "not_a_checkpoint"
    notckpt.mkdir()
    args = [o.replace("{notckpt}", str(notckpt)).replace("{tmp}", str(tmp_path)) for o in bad_settings.BASE + overrides]
    problems = refusal(args, tmp_path)
    assert problems, f"{label}: nothing refused {overrides}"
    named = [k for k in keys(args[len(bad_settings.BASE):]) if any(k in p or k.split(".")[-1] in p for p in problems)]
    assert named, (label, problems)


@pytest.mark.parametrize("override,expected", [
    ("actor_rollout_ref.actor.optim.lr=-0.001", "actor_rollout_ref.actor.optim.lr=-0.001 must be > 0"),
    ("trainer.total_trainig_steps=3", "did you mean trainer.total_training_steps?"),
])
def test_the_command_exits_2_in_a_few_lines_without_a_traceback(override, expected, tmp_path):
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "hybridflow.trainer.main", override], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    seconds = time.perf_counter() - start
    text = (out.stdout + out.stderr).strip()
    assert out.returncode == 2, text
    assert expected in text and "Traceback" not in text
    assert len(text.splitlines()) <= 5, text
    assert seconds < 30  # imports only: nothing started

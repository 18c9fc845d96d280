"""Every ``hybridflow-train`` command in the README and docs/ is a valid run.

A renamed key, a group option or a batch size that no longer divides breaks
the copy-paste path of a reader; this finds the command lines in the pages'
``bash`` blocks, parses them with Hydra's own override parser (a sweep
contributes each of its values in turn), checks the overrides against the
schema, composes the config, and runs the config check on it (with the
guides' plugins registered; only what this machine lacks is forgiven).
"""

import importlib.util
import re
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from hybridflow.configs import CONFIG_DIR
from hybridflow.configs.overrides import override_problems, translate
from hybridflow.configs.schema import register_configs
from hybridflow.plugins import get_plugin_manager, reset_plugin_manager
from hybridflow.plugins.manager import PluginSource
from hybridflow.trainer.config_checks import config_problems

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BASH_BLOCK = re.compile(r"```bash\n(.*?)```", re.S)


def train_commands(text: str) -> list[str]:
    """The ``hybridflow-train`` command lines of a page's bash blocks, continuations joined, comments dropped."""
    commands = []
    for block in BASH_BLOCK.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if re.match(r"^(\S*/)?hybridflow-train(\s|$)", line):
                commands.append(line)
    return commands


def override_sets(command: str) -> list[list[str]]:
    """The override lists a command runs: one for a single run, one per swept value for a multirun."""
    args = translate([a for a in shlex.split(command)[1:] if a != "--multirun"]).args  # as hybridflow-train does
    parsed = OverridesParser.create().parse_overrides([a for a in args if not a.startswith("hydra.")])
    width = max([len(list(o.sweep_string_iterator())) for o in parsed if o.is_sweep_override()] or [1])
    sets = []
    for i in range(width):
        chosen = []
        for o in parsed:
            values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.value()]
            value = values[min(i, len(values) - 1)]
            chosen.append(f"{o.get_key_element()}={value if isinstance(value, str) else o.get_value_element_as_str()}")
        sets.append(chosen)
    return sets


CASES = [(page.name, cmd) for page in PAGES for cmd in train_commands(page.read_text())]


def test_the_pages_have_commands():
    pages = {name for name, _ in CASES}
    assert {"README.md", "writing-an-estimator.md", "writing-a-reward.md"} <= pages
    assert any("--multirun" in cmd for _, cmd in CASES)


def test_override_sets_expand_sweeps():
    sets = override_sets(
        "hybridflow-train --multirun algorithm.adv_estimator=grpo,rloo trainer.seed=0 hydra.sweep.dir=x"
    )
    assert sets == [
        ["algorithm.adv_estimator=grpo", "trainer.seed=0"],
        ["algorithm.adv_estimator=rloo", "trainer.seed=0"],
    ]


# The guides' commands use the plugins the guides have the reader install: load them from their files.
GUIDE_PLUGINS = [
    ROOT / "templates/estimator-plugin/hybridflow_my_estimator.py",
    ROOT / "templates/reward-plugin/hybridflow_my_reward.py",
    ROOT / "templates/agent-plugin/hybridflow_my_agent.py",
    ROOT / "examples/estimator-plugin/hybridflow_group_median.py",
    ROOT / "examples/rollout-engine-plugin/hybridflow_traced_engine.py",
]


@pytest.fixture
def guide_plugins():
    """The plugin manager with the guides' plugins registered as if installed; reset afterwards."""
    manager = get_plugin_manager()
    for path in GUIDE_PLUGINS:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        manager.register(module, PluginSource(path.stem, path.parent.name, "docs"))
    yield manager
    reset_plugin_manager()


# What a documented command may lack on this machine: the reader's model directory, their GPUs, vLLM.
MACHINE_PROBLEMS = (  # what the documented commands name but this machine lacks: a model, GPUs, the user's file
    "is not a directory; give a local HF model",
    "GPU(s)",
    "rollout.name='vllm': ",
    "reward.custom_reward_function.path='my_score.py': no such file",
)


@pytest.mark.parametrize("page,command", CASES, ids=[f"{p}:{c[:60]}" for p, c in CASES])
def test_command_composes_and_passes_the_config_check(page, command, guide_plugins):
    """Each documented command is a valid run: its overrides parse against the schema, it composes, and
    the config check finds nothing wrong with it beyond what this machine lacks."""
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        for overrides in override_sets(command):
            assert override_problems(overrides) == []
            config = OmegaConf.to_object(compose("ppo_trainer", overrides=overrides))
            problems = [p for p in config_problems(config) if not any(m in p for m in MACHINE_PROBLEMS)]
            assert problems == [], (command, problems)

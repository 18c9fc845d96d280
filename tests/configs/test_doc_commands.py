"""Every ``hybridflow-train`` command in the README and docs/ composes against the config tree.

A renamed key or group option breaks the copy-paste path of a reader; this
finds the command lines in the pages' ``bash`` blocks, parses them with
Hydra's own override parser (a sweep contributes each of its values in turn),
and composes the config with them.
"""

import re
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from hybridflow.configs import CONFIG_DIR
from hybridflow.configs.schema import register_configs

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
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
    args = [a for a in shlex.split(command)[1:] if a != "--multirun"]
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
    sets = override_sets("hybridflow-train --multirun algorithm.adv_estimator=grpo,rloo trainer.seed=0 hydra.sweep.dir=x")
    assert sets == [["algorithm.adv_estimator=grpo", "trainer.seed=0"], ["algorithm.adv_estimator=rloo", "trainer.seed=0"]]


@pytest.mark.parametrize("page,command", CASES, ids=[f"{p}:{c[:60]}" for p, c in CASES])
def test_command_composes(page, command):
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        for overrides in override_sets(command):
            cfg = compose("ppo_trainer", overrides=overrides)
            OmegaConf.to_object(cfg)  # the types the trainer gets

"""docs/config.md is generated from the schema and the YAML tree, and kept in step with them."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from hybridflow.configs import CONFIG_DIR
from hybridflow.configs.docs import REGENERATE, render
from hybridflow.configs.schema import register_configs

PAGE = Path(__file__).resolve().parents[2] / "docs" / "config.md"


@pytest.fixture(scope="module")
def page() -> str:
    return render()


@pytest.fixture(scope="module")
def default_job() -> DictConfig:
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose("ppo_trainer")


def rows(page: str) -> dict[str, list[str]]:
    """key -> [type, default, description] of every key table row."""
    out, in_key_table = {}, False
    for line in page.splitlines():
        if line == "| key | type | default | description |":
            in_key_table = True
        elif not line.startswith("|"):
            in_key_table = False
        elif in_key_table and line.startswith("| `"):
            key, *cells = [c.strip() for c in line[2:-2].split(" | ")]
            assert key.strip("`") not in out, f"{key} has two rows"
            out[key.strip("`")] = cells
    return out


def leaf_keys(node: DictConfig, prefix: str = "") -> set[str]:
    """Dotted keys of a composed config; a dict-typed key (not a schema section) is one leaf."""
    keys = set()
    for key in node:
        path = f"{prefix}{key}"
        child = node._get_node(key)
        if isinstance(child, DictConfig) and OmegaConf.get_type(child) not in (dict, None):
            keys |= leaf_keys(child, f"{path}.")
        else:
            keys.add(path)
    return keys


def test_committed_page_is_current(page):
    committed = PAGE.read_text() if PAGE.exists() else ""
    assert committed == page, (
        f"docs/config.md is out of date with configs/: run `{REGENERATE}` to update docs/config.md"
    )


def test_every_key_of_the_composed_config_has_one_row(page, default_job):
    documented = rows(page)
    assert set(documented) == leaf_keys(default_job)
    assert all(description for _, _, description in documented.values())


def test_rows_show_type_default_and_the_default_jobs_value(page, default_job):
    documented = rows(page)
    assert documented["trainer.seed"][:2] == ["`int`", "`0`"]
    assert documented["actor_rollout_ref.rollout.n"][0] == "`int`"
    assert documented["reward.route"][1] == "`{}`"
    # the schema says null; ppo_trainer.yaml sets a step count for the default job
    steps = documented["trainer.total_training_steps"]
    assert steps[0] == "`Optional[int]`"
    assert steps[1] == f"`null` (default job: `{default_job.trainer.total_training_steps}`)"
    # a value the default job does not change is shown once
    assert "default job" not in documented["trainer.seed"][1]


def test_groups_list_every_option_file(page):
    for path in sorted(Path(CONFIG_DIR).glob("*/*.yaml")):
        assert f"={path.stem}`" in page, f"{path.relative_to(CONFIG_DIR)} is not in docs/config.md"
    assert "- `model@actor_rollout_ref.model=tiny`" in page

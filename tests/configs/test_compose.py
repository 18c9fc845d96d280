"""Every YAML of the config tree composes against the schema, without running the app."""

import ast
import inspect
import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from hybridflow.configs import CONFIG_DIR, schema
from hybridflow.configs.schema import register_configs

GROUP_TARGETS = {  # group folder -> where the root config mounts it
    "model": "model@actor_rollout_ref.model",
    "rollout": "rollout@actor_rollout_ref.rollout",
    "data": "data",
    "trainer": "trainer",
}


@pytest.fixture(scope="module", autouse=True)
def hydra_context():
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        yield


def test_root_defaults():
    cfg = compose("ppo_trainer")
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.actor_rollout_ref.model.path == "builtin:tiny-qwen2"
    assert cfg.actor_rollout_ref.rollout.name == "builtin"
    assert cfg.trainer.device == "auto" and cfg.trainer.n_gpus_per_node == 2
    assert cfg.data.train_files == []


@pytest.mark.parametrize(
    "group,option",
    [(g, p.stem) for g in GROUP_TARGETS for p in sorted((Path(CONFIG_DIR) / g).glob("*.yaml"))],
)
def test_every_group_option_composes(group, option):
    cfg = compose("ppo_trainer", overrides=[f"{GROUP_TARGETS[group]}={option}"])
    OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False)
    if group == "rollout":
        assert cfg.actor_rollout_ref.rollout.name == option


@pytest.mark.parametrize("experiment", [p.stem for p in sorted((Path(CONFIG_DIR) / "experiment").glob("*.yaml"))])
def test_every_experiment_composes(experiment):
    cfg = compose("ppo_trainer", overrides=[f"experiment={experiment}", "actor_rollout_ref.model.path=/models/x"])
    assert cfg.actor_rollout_ref.model.path == "/models/x"
    OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)


def test_gsm8k_experiment_values():
    cfg = compose("ppo_trainer", overrides=["experiment=gsm8k_grpo", "actor_rollout_ref.model.path=/m"])
    assert cfg.actor_rollout_ref.rollout.name == "builtin"  # vLLM is one override away, and needs a GPU
    assert list(cfg.data.train_files) == [os.path.expanduser("~/data/gsm8k/train.parquet")]  # where veRL's are
    assert cfg.actor_rollout_ref.actor.optim.lr == pytest.approx(1e-6)


def test_misspelt_key_and_wrong_type_fail_with_the_path():
    with pytest.raises(ConfigCompositionException, match="adv_estimatr"):
        compose("ppo_trainer", overrides=["algorithm.adv_estimatr=rloo"])
    with pytest.raises((ConfigCompositionException, ValidationError)) as err:
        compose("ppo_trainer", overrides=["actor_rollout_ref.rollout.n=many"])
    assert "actor_rollout_ref.rollout.n" in str(err.value) or "many" in str(err.value.__cause__)


def test_every_schema_field_is_documented_once():
    tree = ast.parse(inspect.getsource(schema))
    undocumented = []
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        body = cls.body
        for i, node in enumerate(body):
            if isinstance(node, ast.AnnAssign):
                nxt = body[i + 1] if i + 1 < len(body) else None
                if not (
                    isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)
                ):
                    undocumented.append(f"{cls.name}.{node.target.id}")
    assert undocumented == []

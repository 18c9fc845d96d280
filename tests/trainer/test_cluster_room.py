"""A joined Ray cluster without room for the ranks: a ConfigError naming the keys, as the pools are placed.

``trainer/main.py``'s ``_resource_pool`` reserves each pool where it is made, so that a pool the cluster cannot
hold is refused there, naming ``trainer.rollout_ranks`` when it is the rollout's (``trainer.placement=split``).
The test session's Ray instance has 4 CPUs (tests/conftest.py), a quarter CPU per CPU rank.
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from hybridflow.configs.schema import PPOConfig
from hybridflow.trainer.config_checks import ConfigError
from hybridflow.trainer.main import _resource_pool

pytestmark = pytest.mark.timeout(180)


def split_config(rollout_ranks: int) -> PPOConfig:
    conf = OmegaConf.structured(PPOConfig)
    OmegaConf.update(conf, "trainer.device", "cpu")  # as build_and_fit settles auto here, before the pools
    OmegaConf.update(conf, "trainer.placement", "split")
    OmegaConf.update(conf, "trainer.rollout_ranks", rollout_ranks)
    return OmegaConf.to_object(conf)


def test_a_rollout_pool_the_cluster_cannot_hold_names_rollout_ranks(ray_session):
    config = split_config(32)  # 32 x 0.25 = 8 CPUs of the 4
    pool = _resource_pool(config)  # the 2 training ranks fit
    try:
        with pytest.raises(ConfigError) as err:
            _resource_pool(config, ranks=[config.trainer.rollout_ranks])
    finally:
        pool.release()
    message = str(err.value)
    assert message.startswith(
        "invalid config:\n  - trainer.rollout_ranks=32 rollout ranks (trainer.placement=split) "
        "with trainer.device='cpu', beside the training ranks, do not fit the Ray cluster: lower "
        "trainer.rollout_ranks"
    )
    assert "(the cluster: " in message and "CPU=4" in message and "Traceback" not in message


def test_training_ranks_the_cluster_cannot_hold_name_their_keys(ray_session):
    conf = OmegaConf.structured(PPOConfig)
    OmegaConf.update(conf, "trainer.device", "cpu")
    OmegaConf.update(conf, "trainer.n_gpus_per_node", 32)
    with pytest.raises(
        ConfigError,
        match=r"trainer.nnodes=1 x trainer.n_gpus_per_node=32 ranks with "
        r"trainer.device='cpu' do not fit the Ray cluster",
    ):
        _resource_pool(OmegaConf.to_object(conf))

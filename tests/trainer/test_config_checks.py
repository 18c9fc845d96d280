import pytest
from omegaconf import OmegaConf

from hybridflow.configs.schema import PPOConfig
from hybridflow.trainer.config_checks import ConfigError, check_config


def cfg(**overrides):
    conf = OmegaConf.structured(PPOConfig)
    for key, value in overrides.items():
        OmegaConf.update(conf, key, value)
    return conf


def test_defaults_are_valid():
    check_config(cfg())


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"algorithm.adv_estimator": "grpoo"}, "algorithm.adv_estimator: unknown estimator 'grpoo'"),
        ({"actor_rollout_ref.rollout.n": 1}, "rollout.n=1: estimator 'grpo' compares the responses"),
        ({"algorithm.adv_estimator": "gae", "critic.enable": False}, "critic.enable=False but estimator 'gae' needs a critic"),
        ({"actor_rollout_ref.model.path": "/no/such/model"}, "model.path='/no/such/model' is not a directory"),
        ({"data.train_batch_size": 12}, "data.train_batch_size=12 must be a multiple of 8"),
        ({"trainer.n_gpus_per_node": 3}, "ppo_mini_batch_size x rollout.n=64 must be a multiple of 3"),
        ({"trainer.n_gpus_per_node": 3}, "data.train_batch_size=16 must be a multiple of 3"),
        ({"actor_rollout_ref.rollout.tensor_model_parallel_size": 4}, "n_gpus_per_node=2 must be a multiple of 4"),
        ({"actor_rollout_ref.actor.tensor_model_parallel_size": 3}, "n_gpus_per_node=2 must be a multiple of 3 (actor"),
        # 4 ranks, rollout tp 4: one rollout dp rank, so any batch divides; the built-in tiny model has 4 heads
        ({"trainer.n_gpus_per_node": 8, "actor_rollout_ref.rollout.tensor_model_parallel_size": 8},
         "rollout.tensor_model_parallel_size=8: rollout tensor parallelism cannot split this model: "
         "num_attention_heads=4 is not divisible by 8"),
        ({"trainer.n_gpus_per_node": 8, "actor_rollout_ref.actor.tensor_model_parallel_size": 2,
          "data.train_batch_size": 16, "actor_rollout_ref.actor.ppo_mini_batch_size": 1, "actor_rollout_ref.rollout.n": 2},
         "ppo_mini_batch_size x rollout.n=2 must be a multiple of 4 (each mini-batch's rows are split evenly over the 4 "
         "training data-parallel ranks: trainer.nnodes x trainer.n_gpus_per_node=8 / actor tp 2)"),
        ({"actor_rollout_ref.actor.loss_agg_mode": "mean"}, "loss_agg_mode='mean'; allowed: token-mean"),
        ({"actor_rollout_ref.actor.kl_loss_type": "k9"}, "kl_loss_type='k9'; allowed: k1"),
        ({"actor_rollout_ref.rollout.name": "sglang"}, "rollout.name='sglang'; allowed: builtin, vllm"),
        ({"actor_rollout_ref.rollout.name": "vllm"}, "heads are 16 wide; vLLM's CPU attention supports 32"),
        ({"algorithm.estimator_options": {"gamma": 0.9}}, "estimator_options has ['gamma']; estimator 'grpo' takes"),
        ({"trainer.resume_mode": "sometimes"}, "trainer.resume_mode='sometimes'; allowed: auto, disable"),
        ({"actor_rollout_ref.rollout.top_p": 0.0}, "top_p=0.0 must be in (0, 1]"),
        ({"algorithm.kl_ctrl.type": "pid"}, "algorithm.kl_ctrl.type='pid'; allowed: fixed, adaptive"),
        ({"trainer.logger": ["console", "mlflow"]}, "trainer.logger has ['mlflow']; allowed: console, jsonl, wandb"),
        ({"trainer.rollout_mode": "async"}, "trainer.rollout_mode='async' overlaps generation with training and needs "
         "the rollout on ranks of its own: set trainer.placement=split"),
        ({"trainer.rollout_mode": "later"}, "trainer.rollout_mode='later'; allowed: sync, one_step_off, async"),
        ({"trainer.placement": "split", "trainer.rollout_ranks": 3},
         "data.train_batch_size=16 must be a multiple of 3 (each step's prompts are split evenly over the 3 rollout "
         "data-parallel ranks: trainer.rollout_ranks=3 / rollout tp 1)"),
        ({"trainer.placement": "split", "actor_rollout_ref.rollout.tensor_model_parallel_size": 2},
         "trainer.rollout_ranks=1 must be a multiple of 2 (rollout tensor-parallel groups"),
        ({"trainer.placement": "split", "trainer.rollout_mode": "one_step_off", "actor_rollout_ref.rollout.agent_loop":
          "tool_calling"}, "the agent loop 'tool_calling' runs with trainer.rollout_mode=sync"),
    ],
)
def test_each_invalid_setting_names_key_value_and_allowed(overrides, message):
    with pytest.raises(ConfigError) as err:
        check_config(cfg(**overrides))
    assert message in str(err.value)


def test_tensor_parallel_sizes_that_split_the_model_pass():
    check_config(cfg(**{"trainer.n_gpus_per_node": 4, "actor_rollout_ref.rollout.tensor_model_parallel_size": 4,
                        "actor_rollout_ref.actor.tensor_model_parallel_size": 2}))


def test_all_problems_are_reported_at_once():
    with pytest.raises(ConfigError) as err:
        check_config(cfg(**{"actor_rollout_ref.rollout.n": 0, "trainer.device": "tpu"}))
    assert "rollout.n=0" in str(err.value) and "trainer.device='tpu'" in str(err.value)

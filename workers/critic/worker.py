"""The critic worker: a value model sharded like the actor.

The critic is the policy's architecture with a one-output token head
(``AutoModelForTokenClassification``, ``num_labels=1``, no dropout), its
backbone initialized from the policy's weights and its head fresh.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForTokenClassification

from hybridflow.configs.schema import PPOConfig
from hybridflow.core import DP_COMPUTE_METRIC, DP_COMPUTE_PROTO, ONE_TO_ALL, DataProto, Worker, register
from hybridflow.core.keys import CRITIC_UPDATE_INPUTS, FORWARD_INPUTS
from hybridflow.core.parallel_dims import ParallelDims
from hybridflow.workers.checkpointing import load_role, save_role
from hybridflow.workers.critic.ppo_critic import PPOCritic
from hybridflow.workers.fsdp import shard_role
from hybridflow.workers.loading import load_sharded_model
from hybridflow.workers.offload import StateOffloader
from hybridflow.workers.models import load_model_and_tokenizer, torch_dtype
from hybridflow.workers.optim import build_optimizer


def build_value_model(path: str, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    """A token-classification model with one output, backbone copied from the policy at ``path``."""
    policy, _ = load_model_and_tokenizer(path, dtype=dtype, seed=seed)
    config = policy.config
    config.num_labels = 1
    config.classifier_dropout = 0.0
    with torch.random.fork_rng(devices=[]):  # the head's seeded init leaves the caller's random stream alone
        torch.manual_seed(seed)
        critic = AutoModelForTokenClassification.from_config(config).to(dtype)
    missing = critic.model.load_state_dict(policy.model.state_dict())
    if missing.missing_keys or missing.unexpected_keys:
        raise RuntimeError(f"critic backbone does not match the policy: {missing}")
    return critic


class CriticWorker(Worker):
    """Values and value-loss updates on one rank."""

    def __init__(self, config: PPOConfig, dims: ParallelDims) -> None:
        super().__init__()
        self.config, self.dims = config, dims
        self.init_device_mesh(*dims.critic.mesh)

    @register(dispatch=ONE_TO_ALL)
    def init_model(self) -> None:
        """Build the value model, shard it, build its optimizer."""
        cfg = self.config
        fsdp, model_cfg = cfg.critic.fsdp_config, cfg.actor_rollout_ref.model
        self.model = load_sharded_model(  # the optimizer's master weights, computing in the compute dtype
            model_cfg.path, dtype=torch_dtype(fsdp.master_dtype), seed=cfg.trainer.seed, mesh=self.device_mesh,
            device=self.device, read=build_value_model, shard=lambda module, mesh: shard_role(
                module, mesh, fsdp, compute_dtype=fsdp.compute_dtype(model_cfg),
                gradient_checkpointing=model_cfg.enable_gradient_checkpointing),
        )
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.critic.optim)
        self.offload = StateOffloader(self.model, self.optimizer, params=fsdp.param_offload,
                                      optimizer_state=fsdp.optimizer_offload)
        self.critic = PPOCritic(
            self.model, self.optimizer, cfg.critic, rows_per_mini_batch=self.dims.critic.rows_per_mini_batch,
            ppo_epochs=cfg.actor_rollout_ref.actor.ppo_epochs, dp_group=self.device_mesh.get_group(), scheduler=self.scheduler,
            use_remove_padding=cfg.actor_rollout_ref.model.use_remove_padding,
            share_prompts=cfg.actor_rollout_ref.model.share_prompts,
        )
        self.offload.offload()

    @register(dispatch=DP_COMPUTE_PROTO, reads=FORWARD_INPUTS)
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` (B, T) of the response tokens."""
        with self.offload.on_device(params=True):
            return self.critic.compute_values(data)

    @register(dispatch=DP_COMPUTE_METRIC, reads=CRITIC_UPDATE_INPUTS)
    def update_critic(self, data: DataProto) -> dict[str, float]:
        """Clipped value-loss updates over this rank's rows."""
        with self.offload.on_device(params=True, optimizer=True):
            return self.critic.update_critic(data)

    @register(dispatch=ONE_TO_ALL)
    def save_checkpoint(self, directory: str) -> None:
        """Write this rank's sharded critic and optimizer into ``directory/critic``."""
        with self.offload.on_device(params=True, optimizer=True):
            save_role(directory, "critic", self.model, self.optimizer, extra={"scheduler": self.scheduler.state_dict()})

    @register(dispatch=ONE_TO_ALL)
    def load_checkpoint(self, directory: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote."""
        with self.offload.on_device(params=True, optimizer=True):
            extra = load_role(directory, "critic", self.model, self.optimizer)
        self.scheduler.load_state_dict(extra["scheduler"])

"""The critic worker: a value model sharded like the actor.

The critic is the policy's architecture with a one-output token head
(``AutoModelForTokenClassification``, ``num_labels=1``, no dropout), its
backbone initialized from the policy's weights and its head fresh (a :class:`ValueHead`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from transformers import AutoModelForTokenClassification

from hybridflow.configs.roles import resolve_loss_scale_factor
from hybridflow.configs.schema import PPOConfig
from hybridflow.core import DP_COMPUTE_METRIC, DP_COMPUTE_PROTO, ONE_TO_ALL, DataProto, Worker, register
from hybridflow.core.keys import CRITIC_UPDATE_INPUTS, FORWARD_INPUTS
from hybridflow.core.parallel_dims import ParallelDims
from hybridflow.workers import lora
from hybridflow.workers.checkpointing import load_role, save_role
from hybridflow.workers.critic.ppo_critic import PPOCritic
from hybridflow.workers.fsdp import parameter_bytes, shard_role
from hybridflow.workers.loading import load_sharded_model
from hybridflow.workers.models import load_model_and_tokenizer, torch_dtype
from hybridflow.workers.offload import StateOffloader
from hybridflow.workers.optim import build_optimizer, state_bytes


class ValueHead(nn.Linear):
    """The critic's token head (HF's ``score``): the same ``nn.Linear``, but its output is not a view.

    With a bias, torch computes a linear over (B, T, H) as one ``addmm`` over the (B*T, H) view and returns
    a (B, T, 1) *view* of that product. The head is the last op of the root FSDP2 module's forward, so the
    critic's logits were a view and FSDP2 warned on every forward with grad (an in-place op on a returned
    view would drop its pre-backward hook). Without the bias torch goes through ``matmul``, whose result
    owns its storage, and the bias is added out of place. Parameters (``weight``, ``bias``) and state-dict
    keys are nn.Linear's; the values agree to rounding (one fused add less).
    """

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = F.linear(hidden, self.weight)
        return out if self.bias is None else out + self.bias

    @classmethod
    def like(cls, linear: nn.Linear) -> ValueHead:
        """A head holding ``linear``'s own parameters (on any device, meta included)."""
        head = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        head.weight, head.bias = linear.weight, linear.bias
        return head


def with_value_head(model: nn.Module) -> nn.Module:
    """``model`` (a token-classification model) with its ``score`` head a :class:`ValueHead`; in place."""
    model.score = ValueHead.like(model.score)
    return model


def build_value_model(path: str, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    """A token-classification model with one output (its head a :class:`ValueHead`), backbone copied from the
    policy at ``path``."""
    policy, _ = load_model_and_tokenizer(path, dtype=dtype, seed=seed)
    config = policy.config
    config.num_labels = 1
    config.classifier_dropout = 0.0
    with torch.random.fork_rng(devices=[]):  # the head's seeded init leaves the caller's random stream alone
        torch.manual_seed(seed)
        critic = AutoModelForTokenClassification.from_config(config).to(dtype)
    with_value_head(critic)  # the seeded init, in a head whose output is no view
    missing = critic.model.load_state_dict(policy.model.state_dict())
    if missing.missing_keys or missing.unexpected_keys:
        raise RuntimeError(f"critic backbone does not match the policy: {missing}")
    return critic


VALUE_HEAD = "score"
"""The critic's head module (HF's token-classification ``score``): fresh, so it trains whole under LoRA too."""


def load_value_model(config: PPOConfig, mesh: DeviceMesh, device: torch.device | str) -> nn.Module:
    """The critic sharded over ``mesh`` as it trains: fp32 master weights (``fsdp_config.master_dtype``),
    computing in the role's compute dtype; with ``critic.lora_rank``, LoRA adapters in its backbone (the head
    trains whole, the rest is frozen and held in the compute dtype); collective
    (:func:`~hybridflow.workers.loading.load_sharded_model`)."""
    fsdp, model_cfg = config.critic.fsdp_config, config.actor_rollout_ref.model
    adapters = lora.lora_config(config.critic, never=(VALUE_HEAD,)) if config.critic.lora_rank else None
    frozen_dtype = torch_dtype(fsdp.compute_dtype(model_cfg))  # under LoRA, of the frozen backbone

    def with_adapters(model: nn.Module, seed: int | None = None) -> nn.Module:
        return (
            model
            if adapters is None
            else lora.add_adapters(model, adapters, seed=seed, trainable=(VALUE_HEAD,), frozen_dtype=frozen_dtype)
        )

    def read(path: str, dtype: torch.dtype, seed: int) -> nn.Module:
        return with_adapters(build_value_model(path, dtype, seed), seed)

    def shard(skeleton: nn.Module, mesh: DeviceMesh) -> nn.Module:
        # every rank's skeleton is built from the reader's class and config, which know nothing of the head
        return shard_role(
            with_adapters(with_value_head(skeleton)),
            mesh,
            fsdp,
            compute_dtype=fsdp.compute_dtype(model_cfg),
            gradient_checkpointing=model_cfg.enable_gradient_checkpointing,
        )

    return load_sharded_model(
        model_cfg.path,
        dtype=torch_dtype(fsdp.master_dtype),
        seed=config.trainer.seed,
        mesh=mesh,
        device=device,
        read=read,
        shard=shard,
    )


class CriticWorker(Worker):
    """Values and value-loss updates on one rank."""

    def __init__(self, config: PPOConfig, dims: ParallelDims) -> None:
        super().__init__()
        self.config, self.dims = config, dims
        self.init_device_mesh(*dims.critic.mesh)

    @register(dispatch=ONE_TO_ALL, reads=())
    def init_model(self) -> None:
        """Build the value model, shard it, build its optimizer."""
        cfg = self.config
        fsdp = cfg.critic.fsdp_config
        self.model = load_value_model(cfg, self.device_mesh, self.device)
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.critic.optim)
        self.offload = StateOffloader(
            self.model, self.optimizer, params=fsdp.param_offload, optimizer_state=fsdp.optimizer_offload
        )
        self.critic = PPOCritic(
            self.model,
            self.optimizer,
            cfg.critic,
            rows_per_mini_batch=self.dims.critic.rows_per_mini_batch,
            ppo_epochs=cfg.actor_rollout_ref.actor.ppo_epochs,
            dp_group=self.device_mesh.get_group(),
            scheduler=self.scheduler,
            use_remove_padding=cfg.actor_rollout_ref.model.use_remove_padding,
            share_prompts=cfg.actor_rollout_ref.model.share_prompts,
            loss_scale_factor=resolve_loss_scale_factor(cfg),  # the actor's constant, as veRL's critic defaults to
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
            metrics = self.critic.update_critic(data)
            # what the optimizer holds: with critic LoRA, the adapters' and the value head's moments alone
            metrics["critic/optimizer_state_bytes_per_rank"] = float(state_bytes(self.optimizer))
            metrics["critic/param_bytes_per_rank"] = float(parameter_bytes(self.model))
            return metrics

    @register(dispatch=ONE_TO_ALL, reads=())
    def save_checkpoint(self, directory: str) -> None:
        """Write this rank's sharded critic and optimizer into ``directory/critic``."""
        with self.offload.on_device(params=True, optimizer=True):
            save_role(directory, "critic", self.model, self.optimizer, extra={"scheduler": self.scheduler.state_dict()})

    @register(dispatch=ONE_TO_ALL, reads=())
    def load_checkpoint(self, directory: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote."""
        with self.offload.on_device(params=True, optimizer=True):
            extra = load_role(directory, "critic", self.model, self.optimizer)
        self.scheduler.load_state_dict(extra["scheduler"])

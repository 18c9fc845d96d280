"""The actor-rollout worker: one rank of the policy, in its training and its rollout layout.

Per rank it holds the policy twice:

* the *training layout*: the model sharded with FSDP2 over all ranks (dp =
  world size), its AdamW optimizer and the :class:`PPOActor` computation;
* the *rollout layout*: a full, unsharded copy that the built-in rollout
  engine decodes with. Before generating, the rollout copy is refreshed from
  the training shards when they changed (each parameter gathered in turn and
  copied in place), so every step samples from the current policy. Weight
  version numbers decide when to refresh, and each output reports the version it
was sampled with (``meta_info["weight_version"]``).

Moving between two *different* layouts with bounded memory (FSDP to tensor
parallel) is the hybrid engine's job (``core/reshard.py``, a later issue).
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import torch

from hybridflow.configs.schema import PPOConfig
from hybridflow.core import DP_COMPUTE_METRIC, DP_COMPUTE_PROTO, ONE_TO_ALL, DataProto, Worker, register
from hybridflow.workers.actor.ppo_actor import PPOActor
from hybridflow.workers.checkpointing import load_role, save_role
from hybridflow.workers.fsdp import shard_model
from hybridflow.workers.models import load_model_and_tokenizer, torch_dtype
from hybridflow.workers.optim import build_optimizer
from hybridflow.workers.rollout import RolloutEngine, SamplingParams

logger = logging.getLogger(__name__)


class ActorRolloutWorker(Worker):
    """Generation, log-probs and PPO updates of the policy on one rank."""

    def __init__(self, config: PPOConfig, loss_agg_mode: str) -> None:
        super().__init__()
        self.config = config
        self.loss_agg_mode = loss_agg_mode
        self.init_device_mesh((self.world_size,), ("dp",))
        self.weight_version = 0  # bumped by every optimizer update
        self.rollout_version = -1  # the weight version the rollout copy holds

    @register(dispatch=ONE_TO_ALL)
    def init_model(self) -> None:
        """Load the model (same seed on every rank), shard it, build the optimizer and the engine."""
        arr = self.config.actor_rollout_ref
        model, tokenizer = load_model_and_tokenizer(
            arr.model.path, dtype=torch_dtype(arr.model.dtype), seed=self.config.trainer.seed
        )
        self.tokenizer = tokenizer
        self.rollout_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.model = shard_model(model, self.device_mesh)
        self.optimizer, self.scheduler = build_optimizer(self.model, arr.actor.optim)
        rows_per_mini_batch = arr.actor.ppo_mini_batch_size * arr.rollout.n // self.world_size
        self.actor = PPOActor(
            self.model, self.optimizer, arr.actor, loss_agg_mode=self.loss_agg_mode,
            rows_per_mini_batch=rows_per_mini_batch, dp_group=self.device_mesh.get_group(), scheduler=self.scheduler,
        )
        self.engine = RolloutEngine(self.rollout_model, tokenizer)

    @register(dispatch=ONE_TO_ALL)
    def tokenizer_info(self) -> dict[str, int]:
        """The pad and EOS token ids the driver pads prompts with."""
        return {"pad_token_id": self.engine.pad_token_id, "eos_token_id": self.engine.eos_token_ids[0]}

    def _sync_rollout_weights(self) -> None:
        """Copy the current training weights into the rollout copy (collective)."""
        if self.rollout_version == self.weight_version:
            return
        rollout_params = dict(self.rollout_model.named_parameters())
        with torch.no_grad():
            for name, param in self.model.named_parameters():
                full = param.full_tensor() if hasattr(param, "full_tensor") else param
                rollout_params[name].copy_(full)
        self.rollout_version = self.weight_version

    @register(dispatch=DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """``meta_info``: ``n``, ``greedy``, ``seed``. Returns n responses per prompt, adjacent."""
        self._sync_rollout_weights()
        rollout = self.config.actor_rollout_ref.rollout
        meta = prompts.meta_info
        sampling = SamplingParams(
            temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k, max_new_tokens=rollout.response_length
        )
        seed = meta["seed"] * 1_000_003 + self.dp_layout().dp_rank
        out = self.engine.generate(prompts, n=meta["n"], sampling=sampling, greedy=meta["greedy"], seed=seed)
        out.meta_info["weight_version"] = self.rollout_version
        return out

    @register(dispatch=DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` (the importance ratio's denominator) and ``entropy``, under the training layout."""
        temperature = self.config.actor_rollout_ref.rollout.temperature
        return self.actor.compute_log_prob(data, temperature=temperature, with_entropy=True)

    @register(dispatch=DP_COMPUTE_METRIC)
    def update_actor(self, data: DataProto) -> dict[str, float]:
        """PPO epochs over this rank's rows; ``meta_info["global_step"]`` seeds the shuffle."""
        temperature = self.config.actor_rollout_ref.rollout.temperature
        metrics = self.actor.update_policy(data, temperature=temperature, shuffle_seed=data.meta_info["global_step"])
        self.weight_version += 1
        return metrics

    @register(dispatch=ONE_TO_ALL)
    def save_checkpoint(self, directory: str) -> None:
        """Write this rank's sharded model and optimizer state into ``directory/actor``."""
        extra = {"scheduler": self.scheduler.state_dict(), "weight_version": self.weight_version}
        save_role(directory, "actor", self.model, self.optimizer, extra=extra)

    @register(dispatch=ONE_TO_ALL)
    def load_checkpoint(self, directory: str) -> None:
        """Restore the state :meth:`save_checkpoint` wrote; the rollout copy follows on the next generate."""
        extra = load_role(directory, "actor", self.model, self.optimizer)
        self.scheduler.load_state_dict(extra["scheduler"])
        self.weight_version = extra["weight_version"]
        self.rollout_version = -1

    @register(dispatch=ONE_TO_ALL)
    def save_hf_model(self, directory: str) -> None:
        """Gather the full weights and save an HF model directory (rank 0 writes)."""
        self._sync_rollout_weights()
        if self.rank == 0:
            Path(directory).mkdir(parents=True, exist_ok=True)
            self.rollout_model.save_pretrained(directory)
            self.tokenizer.save_pretrained(directory)

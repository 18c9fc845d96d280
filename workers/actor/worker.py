"""The actor-rollout worker: one rank of the policy, in its training and its rollout layout.

Per rank it holds the policy twice, in two layouts over the same ranks:

* the *training layout* (the default mesh): FSDP2 over all ranks, or a
  ``(ranks/p) x p`` mesh with tensor parallelism p under FSDP2
  (``actor.tensor_model_parallel_size``), its AdamW optimizer and the
  :class:`PPOActor` computation;
* the *rollout layout* (the mesh named ``rollout``): groups of q consecutive
  ranks (``rollout.tensor_model_parallel_size``), each rank holding its rollout
  engine (``rollout.name``, built through ``workers/rollout/base.py``): the
  built-in engine's Megatron-style block of every weight, or a vLLM engine.

After every actor update (or, for an engine that sleeps through training, before
the next generation) the engine loads the new weights in place from the training
shards (the built-in engine reshards them through a plan made once,
``core/reshard.py``: no checkpoint, no full model on any rank, extra memory
bounded by ``rollout.reshard_bucket_mb``). Each load stamps the engine with the
weight version (the number of updates so far); every generation reports the
version it sampled with (``meta_info["weight_version"]``) and the driver checks it.

With ``trainer.placement=split`` the rollout layout lives on ranks of its own
(``workers/rollout/worker.py``), and with vLLM in server mode in a ``vllm serve``
process (``workers/rollout/vllm_server.py``): this worker then builds no
engine, and :meth:`send_weights` broadcasts the gathered weights
to those ranks after every update (``core/weight_transfer.py``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from hybridflow.configs.roles import RolloutPlacement, resolve_loss_scale_factor, rollout_placement
from hybridflow.configs.schema import PPOConfig
from hybridflow.core import DP_COMPUTE_METRIC, DP_COMPUTE_PROTO, ONE_TO_ALL, DataProto, Worker, register
from hybridflow.core.keys import (
    ACTOR_UPDATE_INPUTS,
    GLOBAL_STEP,
    GREEDY,
    LOG_PROB_INPUTS,
    METRICS,
    N_SAMPLES,
    OLD_LOG_PROBS,
    REF_LOG_PROBS,
    SEQUENCE_COLUMNS,
    STOP_TOKEN_IDS,
    WEIGHT_SYNC_PREFIX,
    WEIGHT_VERSION,
    WITH_SUM_PI_SQUARED,
)
from hybridflow.core.parallel_dims import ParallelDims
from hybridflow.core.weight_transfer import WeightTransfer, manifest_of
from hybridflow.workers.actor.ppo_actor import PPOActor
from hybridflow.workers.checkpointing import answer_probe, load_role, model_from_full_state, save_hf_files, save_role
from hybridflow.workers.fsdp import data_parallel_group, parameter_bytes, shard_role
from hybridflow.workers.loading import load_sharded_model, read_causal_lm
from hybridflow.workers.lora import adapters_disabled, add_adapters, lora_config
from hybridflow.workers.micro_batches import log_prob_batching
from hybridflow.workers.models import load_tokenizer, torch_dtype
from hybridflow.workers.offload import StateOffloader
from hybridflow.workers.optim import build_optimizer, state_bytes
from hybridflow.workers.policy_weights import policy_weights
from hybridflow.workers.rollout.base import EngineContext, RolloutEngine, build_engine, tokenizer_info
from hybridflow.workers.rollout.sources import TrainingWeights
from hybridflow.workers.rollout.worker import call_seed, sampling_for

logger = logging.getLogger(__name__)

ROLLOUT_MESH = "rollout"
"""The name of the rollout layout's device mesh (``@register(..., mesh=ROLLOUT_MESH)``)."""


class ActorRolloutWorker(Worker):
    """Generation, log-probs and PPO updates of the policy on one rank."""

    def __init__(self, config: PPOConfig, dims: ParallelDims, loss_agg_mode: str) -> None:
        super().__init__()
        self.config, self.dims = config, dims
        self.loss_agg_mode = loss_agg_mode
        self.init_device_mesh(*dims.actor.mesh)
        self.tp_size = dims.rollout.tp
        # elsewhere than here: on ranks of its own (workers/rollout/worker.py) or in a server process
        self.split = rollout_placement(config) is not RolloutPlacement.COLOCATED
        self.rollout_mesh = None if self.split else self.init_device_mesh(*dims.rollout.mesh, name=ROLLOUT_MESH)
        self.transfer: WeightTransfer | None = None  # to the rollout's ranks, when split
        self.weight_version = 0  # bumped by every optimizer update
        self.engine: RolloutEngine | None = None  # colocated: this rank's rollout engine

    @register(dispatch=ONE_TO_ALL, reads=())
    def init_model(self) -> None:
        """Load the model sharded (rank 0 reads it, the others receive their shards: ``workers/loading.py``),
        build the optimizer and, colocated, the rollout engine (loaded now if it keeps its weights)."""
        arr = self.config.actor_rollout_ref
        fsdp = arr.actor.fsdp_config
        adapters = lora_config(arr.model) if arr.model.lora_rank else None
        frozen_dtype = torch_dtype(fsdp.compute_dtype(arr.model))  # under LoRA, of the base weights
        seed = self.config.trainer.seed

        def read(path: str, dtype: torch.dtype, seed: int | None) -> torch.nn.Module:
            model = read_causal_lm(path, dtype, seed)
            return (
                model
                if adapters is None
                else add_adapters(
                    model, adapters, seed=seed, frozen_dtype=frozen_dtype, adapter_path=arr.model.lora_adapter_path
                )
            )

        def shard(module: torch.nn.Module, mesh) -> torch.nn.Module:
            if adapters is not None:  # shaped on the meta skeleton; the reader's values arrive with the rest
                add_adapters(module, adapters, frozen_dtype=frozen_dtype)
            return shard_role(
                module,
                mesh,
                fsdp,
                compute_dtype=fsdp.compute_dtype(arr.model),
                gradient_checkpointing=arr.model.enable_gradient_checkpointing,
            )

        self.model = load_sharded_model(  # the optimizer's master weights (LoRA's frozen base: the compute dtype)
            arr.model.path,
            dtype=torch_dtype(fsdp.master_dtype),
            seed=seed,
            mesh=self.device_mesh,
            device=self.device,
            read=read,
            shard=shard,
        )
        self.adapter_config = adapters
        self.weights = policy_weights(self.model)  # what the rollout and exports see (merged, with LoRA)
        self.tokenizer = tokenizer = load_tokenizer(arr.model.path)
        self.hf_config, self.generation_config = self.model.config, self.model.generation_config
        self.optimizer, self.scheduler = build_optimizer(self.model, arr.actor.optim)
        self.offload = StateOffloader(
            self.model, self.optimizer, params=fsdp.param_offload, optimizer_state=fsdp.optimizer_offload
        )
        dp_group = data_parallel_group(self.device_mesh)
        self.actor = PPOActor(
            self.model,
            self.optimizer,
            arr.actor,
            loss_agg_mode=self.loss_agg_mode,
            rows_per_mini_batch=self.dims.actor.rows_per_mini_batch,
            dp_group=dp_group,
            scheduler=self.scheduler,
            use_remove_padding=arr.model.use_remove_padding,
            share_prompts=arr.model.share_prompts,
            log_prob_batching=log_prob_batching(arr, self.dims.actor.micro_batch_rows),
            loss_scale_factor=resolve_loss_scale_factor(self.config),  # from the config alone: resolved here
            rollout_correction=self.config.algorithm.rollout_correction,
        )
        if not self.split:
            tp_group = self.rollout_mesh.get_group("tp") if self.tp_size > 1 else None
            context = EngineContext(
                self.config, self.dims, tokenizer, self.device, tp_group, self.rollout_tp_rank, policy=self.model
            )
            self.engine = build_engine(context)
            if self.engine.keeps_weights:
                self._sync_rollout_weights()
            self.engine.sleep()
        self.offload.offload()  # with offloading on, the training state waits in host memory from here

    @property
    def rollout_tp_rank(self) -> int:
        """This rank's position in its rollout tensor-parallel group."""
        return self.rollout_mesh.get_local_rank("tp") if self.tp_size > 1 else 0

    @register(dispatch=ONE_TO_ALL, reads=())
    def tokenizer_info(self) -> dict[str, Any]:
        """The pad token id the driver pads prompts with, the engine's first EOS id and all of them."""
        if self.engine is None:
            raise RuntimeError("trainer.placement=split: ask the rollout group for its tokenizer info")
        return tokenizer_info(self.engine)

    def _sync_rollout_weights(self) -> dict[str, float]:
        """Load the current training weights into the engine if it holds another version (collective).

        Returns the load's metrics (``reshard/*`` or ``weight_sync/*``; empty when nothing moved, and always
        when split: the driver calls :meth:`send_weights` then).
        """
        if self.engine is None or self.engine.weight_version == self.weight_version:
            return {}
        with self.offload.on_device(params=True):
            return self.engine.load_weights(TrainingWeights(self.weights, self.weight_version))

    @register(dispatch=DP_COMPUTE_PROTO, mesh=ROLLOUT_MESH, reads=SEQUENCE_COLUMNS)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """``meta_info``: ``n``, ``greedy``, ``seed``; optionally ``max_new_tokens`` (at most
        ``rollout.response_length``, the default) and ``stop_token_ids`` (an agent loop's turn). Returns n responses
        per prompt, adjacent: the rollout columns only (the driver adds the prompts' non-tensor columns back,
        ``trainer/ppo_trainer.py``).

        Every rank of a rollout tp group gets the same prompts (the rollout
        mesh's data-parallel layout) and samples the same tokens.
        """
        if self.engine is None:
            raise RuntimeError("trainer.placement=split: the rollout runs on its own ranks; call the rollout group")
        self.engine.wake_up(["weights"])
        # an engine that sleeps through training takes the weights here; one that keeps them took them in
        # update_actor, so this loads nothing unless a checkpoint was loaded or the engine let its copy go
        synced = self._sync_rollout_weights()
        self.engine.wake_up(["kv_cache"])
        meta = prompts.meta_info
        out = self.engine.generate(
            prompts,
            n=meta[N_SAMPLES],
            sampling=sampling_for(self.config, meta),
            greedy=meta[GREEDY],
            seed=call_seed(meta, self.dp_layout(ROLLOUT_MESH).dp_rank),
            stop_token_ids=tuple(meta.get(STOP_TOKEN_IDS, ())),
        )
        out.meta_info[WEIGHT_VERSION] = self.engine.weight_version
        out.meta_info.setdefault(METRICS, {}).update(
            {k: v for k, v in synced.items() if k.startswith(WEIGHT_SYNC_PREFIX)}
        )
        self.engine.sleep()
        return out

    @register(dispatch=DP_COMPUTE_PROTO, reads=LOG_PROB_INPUTS)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` (the importance ratio's denominator) under the training layout; also
        ``sum_pi_squared`` when ``meta_info["with_sum_pi_squared"]`` (an estimator declared it). The entropy
        comes from the update's first forward (``actor/entropy``), which sees the same weights."""
        temperature = self.config.actor_rollout_ref.rollout.temperature
        with self.offload.on_device(params=True):
            return self.actor.compute_log_prob(
                data,
                temperature=temperature,
                with_entropy=False,
                with_sum_pi_squared=bool(data.meta_info.get(WITH_SUM_PI_SQUARED, False)),
            )

    @register(dispatch=DP_COMPUTE_PROTO, reads=LOG_PROB_INPUTS)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_probs`` with LoRA: the policy with its adapters off is the initial policy, so the actor
        computes them and no reference group exists (``configs/roles.py reference_in_actor``)."""
        if self.adapter_config is None:
            raise RuntimeError(
                "the actor computes reference log-probs only with LoRA adapters (lora_rank > 0); "
                "without them the reference is a worker group of its own"
            )
        temperature = self.config.actor_rollout_ref.rollout.temperature
        with self.offload.on_device(params=True), adapters_disabled(self.model):
            out = self.actor.compute_log_prob(data, temperature=temperature, with_entropy=False)
        return DataProto.from_dict({REF_LOG_PROBS: out.batch[OLD_LOG_PROBS]})

    @register(dispatch=DP_COMPUTE_METRIC, reads=ACTOR_UPDATE_INPUTS)
    def update_actor(self, data: DataProto) -> dict[str, float]:
        """PPO epochs over this rank's rows, then the weights move to the rollout layout.

        ``meta_info["global_step"]`` seeds the shuffle. Returns the update's
        metrics plus ``reshard/seconds`` and ``reshard/peak_extra_bytes``.
        """
        temperature = self.config.actor_rollout_ref.rollout.temperature
        with self.offload.on_device(params=True, optimizer=True):
            metrics = self.actor.update_policy(data, temperature=temperature, shuffle_seed=data.meta_info[GLOBAL_STEP])
            # what the optimizer holds: with LoRA, the adapters' moments alone
            metrics["actor/optimizer_state_bytes_per_rank"] = float(state_bytes(self.optimizer))
            metrics["actor/param_bytes_per_rank"] = float(parameter_bytes(self.model))
            self.weight_version += 1
            # an engine that sleeps while the actor trains takes the weights when it wakes to generate
            if self.engine is not None and self.engine.keeps_weights:
                metrics.update(self._sync_rollout_weights())
        return metrics

    @register(dispatch=ONE_TO_ALL, reads=())
    def join_weight_transfer(self, host: str, port: int, members: int) -> None:
        """Rank 0 hosts the trainer-to-rollout group (``core/weight_transfer.py``) as member 0 and publishes the
        manifest of the weights; the other ranks only take part in the gathers of :meth:`send_weights`."""
        if self.rank == 0:
            self.transfer = WeightTransfer(
                host, port, 0, members, self.device, timeout_s=self.config.trainer.timeouts.weight_sync_s
            )
            self.transfer.publish(manifest_of(self.weights.named()))

    @register(dispatch=ONE_TO_ALL, reads=())
    def send_weights(self) -> dict[str, float]:
        """Gather the full weights (collective over the training ranks) and broadcast them with the weight
        version to the rollout's ranks (with their ``receive_weights``); rank 0's ``weight_sync/*`` metrics."""
        bucket = int(self.config.actor_rollout_ref.rollout.reshard_bucket_mb * 2**20)
        with self.offload.on_device(params=True):
            weights = self.weights.full()
            if self.transfer is None:
                for _ in weights:  # the gathers need every training rank
                    pass
                return {}
            stats = self.transfer.send(weights, self.weight_version, bucket)
            return {**stats.metrics(), "weight_sync/version": float(stats.version)}

    @register(dispatch=ONE_TO_ALL, reads=())
    def save_checkpoint(self, directory: str) -> None:
        """Write this rank's sharded model and optimizer state into ``directory/actor``; rank 0 adds the HF
        config, generation config and tokenizer (``actor/huggingface``), so the checkpoint exports offline."""
        extra = {"scheduler": self.scheduler.state_dict(), "weight_version": self.weight_version}
        with self.offload.on_device(params=True, optimizer=True):  # offloaded storages are empty until loaded
            save_role(directory, "actor", self.model, self.optimizer, extra=extra)
        if self.rank == 0:
            save_hf_files(
                directory, "actor", self.hf_config, self.generation_config, self.tokenizer, self.adapter_config
            )

    @register(dispatch=ONE_TO_ALL, reads=())
    def probe_checkpoint_dir(self, directory: str, token: str) -> str | None:
        """Read the driver's marker in ``directory`` and write this rank's (``trainer/checkpoint.check_shared``):
        None, or what failed on this rank's node."""
        return answer_probe(directory, token, self.rank)

    @register(dispatch=ONE_TO_ALL, reads=())
    def load_checkpoint(self, directory: str) -> None:
        """Restore the state :meth:`save_checkpoint` wrote; the rollout layout follows on the next generate."""
        with self.offload.on_device(params=True, optimizer=True):  # else the host copy would overwrite what loads
            extra = load_role(directory, "actor", self.model, self.optimizer)
        self.scheduler.load_state_dict(extra["scheduler"])
        self.weight_version = extra["weight_version"]
        if self.engine is not None:
            self.engine.weight_version = -1  # whatever it holds, the next generation loads what was restored

    @register(dispatch=ONE_TO_ALL, reads=())
    def save_hf_model(self, directory: str) -> None:
        """Gather the full weights (collective) and save an HF model directory (rank 0 writes)."""
        with self.offload.on_device(params=True):
            full = dict(self.weights.full())
        if self.rank != 0:
            return
        model = model_from_full_state(self.hf_config, full, self.generation_config)
        Path(directory).mkdir(parents=True, exist_ok=True)
        model.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)

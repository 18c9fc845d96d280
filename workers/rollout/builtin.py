"""The built-in engine as a :class:`~hybridflow.workers.rollout.base.RolloutEngine` (``rollout.name=builtin``).

This rank's tensor-parallel block of the policy (``workers/rollout/tensor_parallel.py``) and the sampler over
it (:class:`~hybridflow.workers.rollout.engine.BuiltinEngine`). New weights come two ways:

* colocated with the trainer, the training shards are resharded into the blocks in place, through a plan
  made on the first load (``core/reshard.py``): no full model on any rank, extra memory bounded by
  ``rollout.reshard_bucket_mb``;
* on the rollout's own ranks, each weight arrives whole over the transfer group and this rank copies its
  block out of it.

With ``rollout.offload_weights`` the blocks' storages are freed after every generation and refilled by the
next load, so the copy takes no memory while the trainer runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hybridflow.core.data_proto import DataProto
from hybridflow.core.reshard import ReshardPlan, plan_reshard
from hybridflow.core.sampling import SamplingParams
from hybridflow.workers.models import load_model_config, torch_dtype
from hybridflow.workers.offload import drop_storages, restore_storages
from hybridflow.workers.rollout.base import EngineContext, WeightSource
from hybridflow.workers.rollout.engine import BuiltinEngine, EngineConfig
from hybridflow.workers.rollout.stream import RolloutStream
from hybridflow.workers.rollout.tensor_parallel import build_tp_rollout_model
from hybridflow.workers.rollout.tp_plan import rollout_slice


def builtin_sampler(model: torch.nn.Module, tokenizer: Any, rollout: Any, device: torch.device) -> BuiltinEngine:
    """The built-in sampler over ``model`` with the rollout config's row bounds; on a GPU its KV cache is bounded
    by ``rollout.gpu_memory_utilization`` of the device (none on a CPU)."""
    budget = None
    if device.type == "cuda":
        budget = int(rollout.gpu_memory_utilization * torch.cuda.get_device_properties(device).total_memory)
    return BuiltinEngine(
        model,
        tokenizer,
        EngineConfig(max_kv_cache_bytes=budget, max_num_seqs=rollout.max_num_seqs, refill=rollout.refill),
    )


def block_writer(params: dict[str, torch.Tensor], hf_config: Any, tp_rank: int, tp_size: int):
    """``write(name, full)``: copy tp rank ``tp_rank``'s block of the full weight into the rollout parameter
    ``name`` (in place: the sampler keeps seeing the same tensors)."""

    def write(name: str, full: torch.Tensor) -> None:
        params[name].copy_(rollout_slice(name, tuple(full.shape), hf_config, tp_rank, tp_size).take(full))

    return write


class BuiltinRollout:
    """One rank's built-in rollout: its block of the policy and the sampler over it (see the module docstring)."""

    generates_through_stream = False  # a plain generation pauses the stream and samples beside it

    def __init__(self, context: EngineContext) -> None:
        rollout = context.rollout
        arr = context.config.actor_rollout_ref
        self.hf_config = context.policy.config if context.policy is not None else load_model_config(arr.model.path)
        self.model = build_tp_rollout_model(
            context.policy if context.policy is not None else self.hf_config,
            context.tp_group,
            context.tp_rank,
            context.tp_size,
            dtype=torch_dtype(arr.actor.fsdp_config.compute_dtype(arr.model)),  # the load casts the masters
            device=context.device,
        )
        self.params = dict(self.model.named_parameters())
        self.tp_rank, self.tp_size = context.tp_rank, context.tp_size
        self.sampler = builtin_sampler(self.model, context.tokenizer, rollout, context.device)
        self.pad_token_id = self.sampler.pad_token_id
        self.eos_token_ids = self.sampler.eos_token_ids
        self.bucket_bytes = int(rollout.reshard_bucket_mb * 2**20)
        self.max_prompt_length = context.config.data.max_prompt_length
        self.offload_weights = bool(rollout.offload_weights)
        self.keeps_weights = not self.offload_weights
        self.weight_version = -1
        self.plan: ReshardPlan | None = None
        self._dropped: list = []

    def generate(
        self,
        prompts: DataProto,
        *,
        n: int,
        sampling: SamplingParams,
        greedy: bool,
        seed: int | None,
        stop_token_ids: tuple[int, ...] = (),
    ) -> DataProto:
        """:meth:`BuiltinEngine.generate <hybridflow.workers.rollout.engine.BuiltinEngine.generate>`."""
        return self.sampler.generate(
            prompts, n=n, sampling=sampling, greedy=greedy, seed=seed, stop_token_ids=stop_token_ids
        )

    @torch.no_grad()
    def load_weights(self, source: WeightSource, *, requests_in_flight: bool = False) -> dict[str, float]:
        """Reshard the training shards into the blocks (colocated: ``reshard/*`` metrics), or copy this rank's
        block out of each whole weight (received: no metrics of its own, the transfer has them)."""
        restore_storages(self._dropped)  # sizes back; the load below writes every value
        self._dropped = []
        shards = source.sharded()
        metrics: dict[str, float] = {}
        if shards is not None:
            if self.plan is None:  # collective, once: the blocks and shards never change identity
                self.plan = self._plan(shards)
            run = self.plan.run(self.bucket_bytes)
            metrics = {
                "reshard/seconds": run.seconds,
                "reshard/peak_extra_bytes": float(run.peak_extra_bytes),
                "reshard/verify_s": run.verify_seconds,
            }
        else:
            write = block_writer(self.params, self.hf_config, self.tp_rank, self.tp_size)
            for name, full in source.full():
                write(name, full)
        self.weight_version = source.version
        return metrics

    def _plan(self, shards: list[tuple[str, torch.Tensor]]) -> ReshardPlan:
        shapes = {name: tuple(param.shape) for name, param in shards}
        slices = {
            name: rollout_slice(name, shapes[name], self.hf_config, self.tp_rank, self.tp_size) for name in self.params
        }
        return plan_reshard(shards, self.params, slices)

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Nothing: an offloaded copy comes back with the next :meth:`load_weights`."""

    def sleep(self) -> None:
        """With ``rollout.offload_weights``, free the blocks' storages; the next generation loads them anew."""
        if self.offload_weights and not self._dropped:
            self._dropped = drop_storages(self.model.parameters())
            self.weight_version = -1

    def stream(self, n: int, slots: int, sampling: SamplingParams, swap: str) -> RolloutStream:
        """A stream over the sampler's model, with no more row slots than the KV cache budget holds at full
        length (prompt plus two responses: a refilled slot's cache)."""
        bound = self.sampler.rows_at_once(self.max_prompt_length + 2 * sampling.max_new_tokens)
        slots = max(n, min(slots, bound) if bound is not None else slots)
        return RolloutStream.builtin(self.sampler, slots, n, sampling, swap)

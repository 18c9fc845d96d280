"""The reference worker: a frozen copy of the initial policy, for KL terms.

Built only when a KL term is on (``actor.use_kl_loss`` or
``algorithm.use_kl_in_reward``). It loads the same weights the actor starts
from (same path, same seed) and shards them with FSDP2 like the actor. Its
forward passes are micro-batched and packed as the actor's old-log-prob pass
(``rollout.log_prob_*``, ``model.use_remove_padding``).
"""

from __future__ import annotations

import torch

from hybridflow.configs.schema import PPOConfig
from hybridflow.core import DP_COMPUTE_PROTO, ONE_TO_ALL, DataProto, Worker, register
from hybridflow.core.keys import LOG_PROB_INPUTS, REF_LOG_PROBS
from hybridflow.core.parallel_dims import ParallelDims
from hybridflow.workers.fsdp import shard_role
from hybridflow.workers.loading import load_sharded_model
from hybridflow.workers.log_probs import response_log_probs
from hybridflow.workers.micro_batches import log_prob_batching, restore_order
from hybridflow.workers.models import torch_dtype
from hybridflow.workers.offload import StateOffloader
from hybridflow.workers.packing import probe_packing


class RefWorker(Worker):
    """``ref_log_probs`` of responses under the initial policy."""

    def __init__(self, config: PPOConfig, dims: ParallelDims) -> None:
        super().__init__()
        self.config, self.dims = config, dims
        self.init_device_mesh(*dims.ref.mesh)

    @register(dispatch=ONE_TO_ALL, reads=())
    def init_model(self) -> None:
        """Load the initial policy weights, frozen, sharded over the ranks."""
        arr = self.config.actor_rollout_ref
        model_cfg, fsdp = arr.model, arr.ref.fsdp_config
        self.model = load_sharded_model(  # no optimizer: held in the dtype it computes in
            model_cfg.path,
            dtype=torch_dtype(fsdp.compute_dtype(model_cfg)),
            seed=self.config.trainer.seed,
            mesh=self.device_mesh,
            device=self.device,
            shard=lambda module, mesh: shard_role(
                module.eval().requires_grad_(False), mesh, fsdp, compute_dtype=fsdp.compute_dtype(model_cfg)
            ),
        )
        self.packing = (
            probe_packing(self.model, share_prompts=model_cfg.share_prompts) if model_cfg.use_remove_padding else None
        )
        self.batching = log_prob_batching(arr, self.dims.ref.micro_batch_rows)
        self.offload = StateOffloader(self.model, None, params=fsdp.param_offload, optimizer_state=False)
        self.offload.offload()

    @register(dispatch=DP_COMPUTE_PROTO, reads=LOG_PROB_INPUTS)
    @torch.no_grad()
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """Teacher-forced log-probs of the responses, at the rollout temperature."""
        arr = self.config.actor_rollout_ref
        micro_batches, order = self.batching.split(data, self.device_mesh.get_group())
        with self.offload.on_device(params=True):
            parts = [
                response_log_probs(
                    self.model, micro, temperature=arr.rollout.temperature, packing=self.packing
                ).log_probs
                for micro in micro_batches
            ]
        return DataProto.from_dict({REF_LOG_PROBS: restore_order(torch.cat(parts), order)})

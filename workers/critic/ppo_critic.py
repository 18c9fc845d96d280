"""The critic's computation on one data-parallel rank: values and the value update.

The critic is the policy's architecture with a one-output token head
(``AutoModelForTokenClassification``, ``num_labels=1``). The value of
response token t is the head's output at the position *before* it (the
state in which token t was chosen), mirroring how log-probs are read.
Mini-batches, micro-batches, global normalization and skipped steps work as
for the actor (``workers/train_step.py``); the value loss is aggregated with
``critic.loss_agg_mode`` (veRL's key; a token mean by default), its counts
taken over the global mini-batch as the actor's are, so the split does not
change the update. Micro-batches hold a fixed number
of rows or a token budget (``use_dynamic_bsz``); forwards run padded or packed.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist
from torch import nn

from hybridflow.configs.schema import CriticConfig
from hybridflow.core import DataProto
from hybridflow.core.keys import ATTENTION_MASK, INPUT_IDS, POSITION_IDS, RESPONSE_MASK, RESPONSES, RETURNS, VALUES
from hybridflow.losses import agg_loss
from hybridflow.losses.value import clipped_value_loss
from hybridflow.workers.micro_batches import MicroBatching, restore_order
from hybridflow.workers.packing import Packing, pack, packed_forward, probe_packing, unpack
from hybridflow.workers.train_step import parameter_norm, token_counts, update_epochs


def response_values(model: nn.Module, batch: DataProto, *, packing: Packing | None = None) -> torch.Tensor:
    """(B, T) value estimates for the response tokens (``packing``: one packed forward, zero at the pads)."""
    if packing is not None:
        packed = pack(batch, packing)
        return unpack(packed_forward(model, packed)[:, 0].float(), packed)
    length = batch.batch[RESPONSES].shape[1]
    out = model(
        input_ids=batch.batch[INPUT_IDS],
        attention_mask=batch.batch[ATTENTION_MASK],
        position_ids=batch.batch[POSITION_IDS],
        use_cache=False,
    )
    return out.logits[:, -length - 1 : -1, 0].float()


class PPOCritic:
    """Values and clipped value-loss updates of one rank's critic shard.

    ``use_remove_padding``: packed forwards (the policy's ``model.use_remove_padding``:
    the critic has no model section), in the layout its attention confines (``probe_packing``);
    ``share_prompts``: the rows of one prompt as a prefix tree (``model.share_prompts``);
    ``loss_scale_factor``: the constant of ``seq-mean-token-sum-norm`` (the actor's, resolved; None: each
    micro-batch's padded width, as veRL's ``agg_loss`` falls back to).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        config: CriticConfig,
        *,
        rows_per_mini_batch: int,
        ppo_epochs: int = 1,
        dp_group: dist.ProcessGroup | None = None,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        use_remove_padding: bool = True,
        share_prompts: bool = False,
        loss_scale_factor: float | None = None,
    ) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.config = config
        self.loss_scale_factor = loss_scale_factor
        dynamic, rows = config.use_dynamic_bsz, config.ppo_micro_batch_size_per_gpu
        self.update_batching = MicroBatching(rows, config.ppo_max_token_len_per_gpu if dynamic else None)
        forward_budget = config.forward_max_token_len_per_gpu
        forward_budget = config.ppo_max_token_len_per_gpu if forward_budget is None else forward_budget
        self.forward_batching = MicroBatching(rows, forward_budget if dynamic else None)
        self.packing = probe_packing(model, share_prompts=share_prompts) if use_remove_padding else None
        self.rows_per_mini_batch = rows_per_mini_batch
        self.ppo_epochs = ppo_epochs
        self.dp_group = dp_group
        self.dp_size = dist.get_world_size(dp_group) if dp_group is not None else 1

    @torch.no_grad()
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` (B, T) for every row, zero outside the response mask."""
        self.model.eval()
        micro_batches, order = self.forward_batching.split(data, self.dp_group)
        parts = [response_values(self.model, micro, packing=self.packing) for micro in micro_batches]
        return DataProto.from_dict({VALUES: restore_order(torch.cat(parts), order) * data.batch[RESPONSE_MASK]})

    def update_critic(self, data: DataProto) -> dict[str, float]:
        """Clipped value-loss updates over this rank's rows; returns mean metrics."""

        def step_loss(index: int, mini: DataProto):
            counts, local = token_counts(mini.batch[RESPONSE_MASK], self.dp_group, self.loss_scale_factor)
            diagnostics: dict[str, float] = defaultdict(float)  # the rank's mini-batch values, summed from shares
            return lambda micro: self._micro_batch_loss(micro, counts, local, diagnostics), diagnostics

        metrics = update_epochs(
            data,
            step_loss,
            lambda mini: self.update_batching.split(mini, self.dp_group)[0],
            self.model,
            self.optimizer,
            rows_per_mini_batch=self.rows_per_mini_batch,
            epochs=self.ppo_epochs,
            grad_clip=self.config.optim.grad_clip,
            loss_scale=self.dp_size,
            scheduler=self.scheduler,
            prefix="critic",
            accumulate_unsharded=self.config.fsdp_config.accumulate_unsharded_grads,
        )
        metrics["critic/param_norm"] = parameter_norm(self.model)
        return metrics

    def _micro_batch_loss(
        self, micro: DataProto, counts: dict[str, float], local: dict[str, float], diagnostics: dict[str, float]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's share of the global value loss (``counts``: the global mini-batch's); its shares of
        the rank's mini-batch values (``local``: the rank's counts) are added to ``diagnostics``."""
        mask = micro.batch[RESPONSE_MASK].float()
        values = response_values(self.model, micro, packing=self.packing)
        token_losses, loss_metrics = clipped_value_loss(
            values, micro.batch[VALUES], micro.batch[RETURNS], mask, self.config.cliprange_value
        )
        mode = self.config.loss_agg_mode
        loss = agg_loss(token_losses, mask, mode, **counts)
        with torch.no_grad():
            local_tokens = local["num_tokens"]
            weight = float(mask.sum()) / local_tokens
            diagnostics["critic/vf_loss"] += agg_loss(token_losses, mask, mode, **local).item()
            diagnostics["critic/vpred_mean"] += float((values * mask).sum()) / local_tokens
            for key, value in loss_metrics.items():  # token means over this micro-batch
                diagnostics[key] += value * weight
        return loss, {}

"""The critic's computation on one data-parallel rank: values and the value update.

The critic is the policy's architecture with a one-output token head
(``AutoModelForTokenClassification``, ``num_labels=1``). The value of
response token t is the head's output at the position *before* it (the
state in which token t was chosen), mirroring how log-probs are read.
Mini-batches, micro-batches, global normalization and skipped steps work as
for the actor (``workers/train_step.py``); the value loss is always averaged
over the global mini-batch's valid tokens.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from hybridflow.configs.schema import CriticConfig
from hybridflow.core import DataProto
from hybridflow.core.keys import ATTENTION_MASK, INPUT_IDS, POSITION_IDS, RESPONSE_MASK, RESPONSES, RETURNS, VALUES
from hybridflow.losses import agg_loss
from hybridflow.losses.value import clipped_value_loss
from hybridflow.workers.train_step import global_counts, mean_metrics, optimizer_step, parameter_norm


def response_values(model: nn.Module, batch: DataProto) -> torch.Tensor:
    """(B, T) value estimates for the response tokens."""
    length = batch.batch[RESPONSES].shape[1]
    out = model(
        input_ids=batch.batch[INPUT_IDS],
        attention_mask=batch.batch[ATTENTION_MASK],
        position_ids=batch.batch[POSITION_IDS],
    )
    return out.logits[:, -length - 1 : -1, 0].float()


class PPOCritic:
    """Values and clipped value-loss updates of one rank's critic shard."""

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
    ) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.config = config
        self.rows_per_mini_batch = rows_per_mini_batch
        self.ppo_epochs = ppo_epochs
        self.dp_group = dp_group
        self.dp_size = dist.get_world_size(dp_group) if dp_group is not None else 1

    @torch.no_grad()
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` (B, T) for every row, zero outside the response mask."""
        self.model.eval()
        parts = [response_values(self.model, micro) for micro in data.split(self.config.ppo_micro_batch_size_per_gpu)]
        return DataProto.from_dict({VALUES: torch.cat(parts) * data.batch[RESPONSE_MASK]})

    def update_critic(self, data: DataProto) -> dict[str, float]:
        """Clipped value-loss updates over this rank's rows; returns mean metrics."""
        if len(data) % self.rows_per_mini_batch:
            raise ValueError(
                f"this rank holds {len(data)} rows, not a multiple of its {self.rows_per_mini_batch} rows per mini-batch"
            )
        self.model.train()
        steps = []
        for mini in data.make_iterator(self.rows_per_mini_batch, epochs=self.ppo_epochs):
            num_tokens, _ = global_counts(mini.batch[RESPONSE_MASK], self.dp_group)
            steps.append(
                optimizer_step(
                    mini.split(self.config.ppo_micro_batch_size_per_gpu),
                    lambda micro: self._micro_batch_loss(micro, num_tokens),
                    self.model,
                    self.optimizer,
                    grad_clip=self.config.optim.grad_clip,
                    loss_scale=self.dp_size,
                    scheduler=self.scheduler,
                    prefix="critic",
                )
            )
        metrics = mean_metrics(steps)
        metrics["critic/param_norm"] = parameter_norm(self.model)
        return metrics

    def _micro_batch_loss(self, micro: DataProto, num_tokens: float) -> tuple[torch.Tensor, dict[str, float]]:
        mask = micro.batch[RESPONSE_MASK].float()
        values = response_values(self.model, micro)
        token_losses, metrics = clipped_value_loss(
            values, micro.batch[VALUES], micro.batch[RETURNS], mask, self.config.cliprange_value
        )
        loss = agg_loss(token_losses, mask, "token-mean", num_tokens=num_tokens)
        with torch.no_grad():
            metrics["critic/vf_loss"] = agg_loss(token_losses, mask, "token-mean").item()
            metrics["critic/vpred_mean"] = float((values * mask).sum() / mask.sum().clamp(min=1))
        return loss, metrics

"""The actor's computation on one data-parallel rank: log-probs and the PPO update.

This module knows nothing of Ray: the actor *worker* wraps it, builds the
model (FSDP2-sharded over the dp ranks) and hands it the rank's share of the
batch. What it guarantees:

* The gradient of one optimizer step does not depend on how the mini-batch is
  split over ranks and micro-batches. Every micro-batch's loss is its share of
  the global mini-batch mean (``agg_loss`` with counts all-reduced over the dp
  group), and gradients are *summed* over micro-batches (accumulation) and
  ranks (FSDP averages over ranks, so the loss is scaled by the dp size).
* A non-finite gradient norm skips the step and is counted, never applied
  (``workers/train_step.py``).
"""

from __future__ import annotations


import torch
import torch.distributed as dist
from torch import nn

from hybridflow.configs.schema import ActorConfig
from hybridflow.core import DataProto
from hybridflow.core.keys import (
    ADVANTAGES,
    ENTROPY,
    OLD_LOG_PROBS,
    REF_LOG_PROBS,
    RESPONSE_MASK,
    ROLLOUT_IS_WEIGHTS,
    SUM_PI_SQUARED,
)
from hybridflow.losses import agg_loss, kl_penalty
from hybridflow.plugins import get_policy_loss
from hybridflow.workers.log_probs import response_log_probs
from hybridflow.workers.train_step import global_counts, mean_metrics, optimizer_step, parameter_norm


class PPOActor:
    """Log-probs and clipped policy-gradient updates of one rank's model shard.

    :param model: the policy (an HF causal LM, FSDP2-wrapped or not).
    :param optimizer: its optimizer.
    :param config: the ``actor_rollout_ref.actor`` config.
    :param loss_agg_mode: the resolved aggregation mode (the trainer fills in
        the estimator's recommendation when the config leaves it unset).
    :param dp_group: the data-parallel process group (None: a single rank).
    :param rows_per_mini_batch: this rank's rows per optimizer step
        (``ppo_mini_batch_size * n / dp_size``).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        config: ActorConfig,
        *,
        loss_agg_mode: str,
        rows_per_mini_batch: int,
        dp_group: dist.ProcessGroup | None = None,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    ) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.config = config
        self.loss_agg_mode = loss_agg_mode
        self.rows_per_mini_batch = rows_per_mini_batch
        self.dp_group = dp_group
        self.dp_size = dist.get_world_size(dp_group) if dp_group is not None else 1
        self.policy_loss = get_policy_loss(config.policy_loss)
        unknown = set(config.policy_loss_options) - set(self.policy_loss.options)
        if unknown:
            raise ValueError(
                f"actor.policy_loss_options has {sorted(unknown)}, which policy loss {config.policy_loss!r} "
                f"does not take; its options are {self.policy_loss.options}"
            )

    @torch.no_grad()
    def compute_log_prob(
        self, data: DataProto, *, temperature: float, with_entropy: bool = False, with_sum_pi_squared: bool = False
    ) -> DataProto:
        """Teacher-forced ``old_log_probs`` for every row, in micro-batches; ``entropy`` and ``sum_pi_squared``
        (sum_v pi_old(v)^2 per token, for estimators that declare it) when asked."""
        self.model.eval()
        parts = [
            response_log_probs(self.model, micro, temperature=temperature, with_entropy=with_entropy,
                               with_sum_pi_squared=with_sum_pi_squared)
            for micro in data.split(self.config.ppo_micro_batch_size_per_gpu)
        ]
        tensors = {OLD_LOG_PROBS: torch.cat([p.log_probs for p in parts])}
        if with_entropy:
            tensors[ENTROPY] = torch.cat([p.entropy for p in parts])
        if with_sum_pi_squared:
            tensors[SUM_PI_SQUARED] = torch.cat([p.sum_pi_squared for p in parts])
        return DataProto.from_dict(tensors)

    def update_policy(self, data: DataProto, *, temperature: float, shuffle_seed: int = 0) -> dict[str, float]:
        """``ppo_epochs`` passes of mini-batch updates over this rank's rows; returns mean metrics.

        ``shuffle_seed`` orders the rows when ``shuffle`` is on; the trainer
        passes the step number, so a resumed run shuffles as the original did.
        """
        if len(data) % self.rows_per_mini_batch:
            raise ValueError(
                f"this rank holds {len(data)} rows, not a multiple of its {self.rows_per_mini_batch} rows per mini-batch"
            )
        self.model.train()
        mini_batches = data.make_iterator(
            self.rows_per_mini_batch, epochs=self.config.ppo_epochs, shuffle=self.config.shuffle, seed=shuffle_seed
        )
        steps = []
        for mini in mini_batches:
            num_tokens, num_seqs = global_counts(mini.batch[RESPONSE_MASK], self.dp_group)
            counts = {"num_tokens": num_tokens, "num_seqs": num_seqs}
            steps.append(
                optimizer_step(
                    mini.split(self.config.ppo_micro_batch_size_per_gpu),
                    lambda micro: self._micro_batch_loss(micro, temperature, counts),
                    self.model,
                    self.optimizer,
                    grad_clip=self.config.optim.grad_clip,
                    loss_scale=self.dp_size,  # FSDP averages over ranks; we want the sum
                    scheduler=self.scheduler,
                )
            )
        metrics = mean_metrics(steps)
        metrics["actor/param_norm"] = parameter_norm(self.model)
        return metrics

    def _micro_batch_loss(
        self, micro: DataProto, temperature: float, counts: dict[str, float]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's share of the global loss, and its local diagnostics."""
        mask = micro.batch[RESPONSE_MASK].float()
        need_entropy = self.config.entropy_coeff != 0
        log_probs, entropy, _ = response_log_probs(self.model, micro, temperature=temperature, with_entropy=need_entropy)
        # rollout correction: importance weights pi_old / pi_rollout, when the driver computed them
        correction = {"rollout_is_weights": micro.batch[ROLLOUT_IS_WEIGHTS]} if ROLLOUT_IS_WEIGHTS in micro.batch else {}
        token_losses, loss_metrics = self.policy_loss.fn(
            micro.batch[OLD_LOG_PROBS], log_probs, micro.batch[ADVANTAGES], mask, **correction,
            **self.config.policy_loss_options,
        )
        terms = {"pg_loss": (1.0, token_losses)}
        if need_entropy:
            terms["entropy"] = (-self.config.entropy_coeff, entropy)
        if self.config.use_kl_loss:
            kl = kl_penalty(log_probs, micro.batch[REF_LOG_PROBS], self.config.kl_loss_type)
            terms["kl_loss"] = (self.config.kl_loss_coef, kl)
        loss = sum(coef * agg_loss(values, mask, self.loss_agg_mode, **counts) for coef, values in terms.values())
        with torch.no_grad():  # diagnostics: this micro-batch's own mean, not its share
            metrics = {f"actor/{name}": agg_loss(values, mask, self.loss_agg_mode).item() for name, (_, values) in terms.items()}
            # whatever the loss plugin computes: > 0 when the updates so far made advantaged tokens likelier
            gain = micro.batch[ADVANTAGES] * (log_probs - micro.batch[OLD_LOG_PROBS])
            metrics["actor/surrogate_gain"] = agg_loss(gain, mask, "token-mean").item()
        metrics.update({f"actor/{k}": v for k, v in loss_metrics.items()})
        return loss, metrics

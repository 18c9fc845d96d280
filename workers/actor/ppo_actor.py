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
* The diagnostics (``actor/pg_loss``, ``actor/kl_loss``, the policy loss's
  ``pg_clipfrac``, ...) do not depend on the micro-batch split either: each is
  the rank's mini-batch value, summed from the micro-batches' shares of it
  (the policy loss's own, token means, weighted by tokens).
* ``seq-mean-token-sum-norm`` divides by a constant of the run
  (``loss_scale_factor``), never by a micro-batch's padded width, so packing
  and token-budget micro-batches leave it unchanged.
* Under the rollout correction's ``bypass_mode`` the policy term is computed
  against the rollout's own log-probs (``losses/bypass.py``); the entropy and
  KL terms are unchanged.

Micro-batches hold a fixed number of rows or, under ``use_dynamic_bsz``, a
token budget (``workers/micro_batches.py``); forwards run padded or packed
(``use_remove_padding``, ``workers/packing.py``).
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist
from torch import nn

from hybridflow.configs.schema import ActorConfig, RolloutCorrectionConfig
from hybridflow.core import DataProto
from hybridflow.core.keys import (
    ADVANTAGES,
    ENTROPY,
    OLD_LOG_PROBS,
    REF_LOG_PROBS,
    RESPONSE_MASK,
    ROLLOUT_IS_WEIGHTS,
    ROLLOUT_LOG_PROBS,
    SUM_PI_SQUARED,
)
from hybridflow.losses import agg_loss, kl_penalty
from hybridflow.losses.bypass import bypass_policy_loss
from hybridflow.plugins import get_policy_loss
from hybridflow.workers.log_probs import response_log_probs
from hybridflow.workers.micro_batches import MicroBatching, restore_order
from hybridflow.workers.packing import probe_packing
from hybridflow.workers.train_step import parameter_norm, token_counts, update_epochs

GAP = "rollout/log_prob_gap_max"
"""The largest |log pi_train - log pi_rollout| of a sampled token, over the first optimizer step's rows (all
ranks): float noise when the rollout holds the training weights (the weight sync is checked every step)."""


class PPOActor:
    """Log-probs and clipped policy-gradient updates of one rank's model shard.

    :param model: the policy (an HF causal LM, FSDP2-wrapped or not).
    :param optimizer: its optimizer.
    :param config: the ``actor_rollout_ref.actor`` config.
    :param loss_agg_mode: the resolved aggregation mode (the trainer fills in
        the estimator's recommendation when the config leaves it unset).
    :param loss_scale_factor: the constant of ``seq-mean-token-sum-norm``, resolved
        (``configs/roles.py``: ``rollout.response_length`` unless set); None: each
        micro-batch's padded width, as veRL's ``agg_loss`` falls back to.
    :param rollout_correction: ``algorithm.rollout_correction``; with ``bypass_mode`` the
        policy term is ``losses/bypass.py``'s against ``rollout_log_probs`` (None: off).
    :param dp_group: the data-parallel process group (None: a single rank).
    :param rows_per_mini_batch: this rank's rows per optimizer step
        (``ppo_mini_batch_size * n / dp_size``).
    :param use_remove_padding: packed forwards (``model.use_remove_padding``), in
        the layout the model's attention confines (``probe_packing``: a collective under FSDP).
    :param share_prompts: and the rows of one prompt packed as a prefix tree (``model.share_prompts``).
    :param log_prob_batching: the micro-batches of :meth:`compute_log_prob`
        (None: those of the update, ``config``'s rows or token budget).
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
        use_remove_padding: bool = True,
        share_prompts: bool = False,
        log_prob_batching: MicroBatching | None = None,
        loss_scale_factor: float | None = None,
        rollout_correction: RolloutCorrectionConfig | None = None,
    ) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.config = config
        self.loss_scale_factor = loss_scale_factor
        self.bypass = rollout_correction if rollout_correction is not None and rollout_correction.bypass_mode else None
        self.update_batching = MicroBatching(
            config.ppo_micro_batch_size_per_gpu, config.ppo_max_token_len_per_gpu if config.use_dynamic_bsz else None
        )
        self.log_prob_batching = log_prob_batching or self.update_batching
        self.packing = probe_packing(model, share_prompts=share_prompts) if use_remove_padding else None
        self.loss_agg_mode = loss_agg_mode
        self.rows_per_mini_batch = rows_per_mini_batch
        self.dp_group = dp_group
        self.dp_size = dist.get_world_size(dp_group) if dp_group is not None else 1
        self.policy_loss = get_policy_loss(config.policy_loss)
        # the config check (trainer/config_checks.py) refuses these before Ray starts; this is for a config that
        # reached the worker another way, in one line that names the key
        unknown = sorted(set(config.policy_loss_options) - set(self.policy_loss.options))
        if unknown:
            raise ValueError(
                f"actor_rollout_ref.actor.policy_loss_options has {unknown}; policy loss "
                f"{config.policy_loss!r} takes {self.policy_loss.options}"
            )

    @torch.no_grad()
    def compute_log_prob(
        self, data: DataProto, *, temperature: float, with_entropy: bool = False, with_sum_pi_squared: bool = False
    ) -> DataProto:
        """Teacher-forced ``old_log_probs`` for every row, in micro-batches; ``entropy`` and ``sum_pi_squared``
        (sum_v pi_old(v)^2 per token, for estimators that declare it) when asked."""
        self.model.eval()
        micro_batches, order = self.log_prob_batching.split(data, self.dp_group)
        parts = [
            response_log_probs(
                self.model,
                micro,
                temperature=temperature,
                with_entropy=with_entropy,
                with_sum_pi_squared=with_sum_pi_squared,
                packing=self.packing,
            )
            for micro in micro_batches
        ]
        stats = {OLD_LOG_PROBS: [p.log_probs for p in parts]}
        if with_entropy:
            stats[ENTROPY] = [p.entropy for p in parts]
        if with_sum_pi_squared:
            stats[SUM_PI_SQUARED] = [p.sum_pi_squared for p in parts]
        return DataProto.from_dict({key: restore_order(torch.cat(values), order) for key, values in stats.items()})

    def update_policy(self, data: DataProto, *, temperature: float, shuffle_seed: int = 0) -> dict[str, float]:
        """``ppo_epochs`` passes of mini-batch updates over this rank's rows; returns mean metrics.

        ``shuffle_seed`` orders the rows when ``shuffle`` is on; the trainer
        passes the step number, so a resumed run shuffles as the original did.
        """

        def step_loss(index: int, mini: DataProto):
            probe = index == 0  # the first optimizer step's forwards still see the weights that sampled
            counts, local = token_counts(mini.batch[RESPONSE_MASK], self.dp_group, self.loss_scale_factor)
            diagnostics: dict[str, float] = defaultdict(float)  # the rank's mini-batch values, summed from shares

            def micro_loss(micro: DataProto):
                return self._micro_batch_loss(micro, temperature, counts, local, diagnostics, probe)

            return micro_loss, diagnostics

        metrics = update_epochs(
            data,
            step_loss,
            lambda mini: self.update_batching.split(mini, self.dp_group)[0],
            self.model,
            self.optimizer,
            rows_per_mini_batch=self.rows_per_mini_batch,
            epochs=self.config.ppo_epochs,
            shuffle=self.config.shuffle,
            seed=shuffle_seed,
            grad_clip=self.config.optim.grad_clip,
            loss_scale=self.dp_size,  # FSDP averages over ranks; we want the sum
            scheduler=self.scheduler,
            accumulate_unsharded=self.config.fsdp_config.accumulate_unsharded_grads,
        )
        if GAP in metrics:  # the first step's alone (the probe): the largest gap of any rank
            metrics[GAP] = self._max_over_ranks(metrics[GAP])
        metrics["actor/param_norm"] = parameter_norm(self.model)
        return metrics

    def _max_over_ranks(self, value: float) -> float:
        if self.dp_group is None or self.dp_size == 1:
            return value
        device = next(self.model.parameters()).device  # NCCL reduces device tensors only
        out = torch.tensor([value], dtype=torch.float64, device=device)
        dist.all_reduce(out, op=dist.ReduceOp.MAX, group=self.dp_group)
        return out.item()

    def _micro_batch_loss(
        self,
        micro: DataProto,
        temperature: float,
        counts: dict[str, float],
        local: dict[str, float],
        diagnostics: dict[str, float],
        probe: bool = False,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's share of the global loss (``counts``: the global mini-batch's); its share of the rank's
        mini-batch diagnostics (``local``: the rank's counts) is added to ``diagnostics``. With ``probe`` (the
        first optimizer step, whose forwards see the weights that sampled) also ``actor/entropy`` of the policy
        and ``rollout/log_prob_gap_max`` against the rollout's own log-probs."""
        mask = micro.batch[RESPONSE_MASK].float()
        need_entropy = self.config.entropy_coeff != 0 or probe
        log_probs, entropy, _ = response_log_probs(
            self.model, micro, temperature=temperature, with_entropy=need_entropy, packing=self.packing
        )
        token_losses, pg_mask, loss_metrics, corr_metrics = self._policy_term(micro, log_probs, mask)
        terms = {"pg_loss": (1.0, token_losses, pg_mask)}  # name: (coefficient, token values, their mask)
        if self.config.entropy_coeff != 0:
            terms["entropy"] = (-self.config.entropy_coeff, entropy, mask)
        if self.config.use_kl_loss:
            kl = kl_penalty(log_probs, micro.batch[REF_LOG_PROBS], self.config.kl_loss_type)
            terms["kl_loss"] = (self.config.kl_loss_coef, kl, mask)
        loss = sum(coef * agg_loss(values, m, self.loss_agg_mode, **counts) for coef, values, m in terms.values())
        with torch.no_grad():  # diagnostics: shares of the rank's mini-batch value, so the split cannot change them
            for name, (_, values, m) in terms.items():
                diagnostics[f"actor/{name}"] += agg_loss(values, m, self.loss_agg_mode, **local).item()
            _add_shares(diagnostics, corr_metrics, float(mask.sum()) / local["num_tokens"])
            # whatever the loss plugin computes: > 0 when the updates so far made advantaged tokens likelier
            gain = micro.batch[ADVANTAGES] * (log_probs - micro.batch[OLD_LOG_PROBS])
            diagnostics["actor/surrogate_gain"] += agg_loss(
                gain, mask, "token-mean", num_tokens=local["num_tokens"]
            ).item()
            # the policy loss's diagnostics are token means over this micro-batch: weighted by its tokens
            weight = float(mask.sum()) / local["num_tokens"]
            for key, value in loss_metrics.items():
                diagnostics[f"actor/{key}"] += float(value) * weight
            if probe:
                self._probe(micro, log_probs, entropy, mask, local, diagnostics)
        return loss, {}

    def _policy_term(
        self, micro: DataProto, log_probs: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float], dict[str, float]]:
        """The policy loss per token, the mask it is aggregated under, its diagnostics, and (bypass mode) the
        ``rollout_corr/`` statistics of this micro-batch's weights pi_current / pi_rollout."""
        advantages = micro.batch[ADVANTAGES]
        if self.bypass is None:
            # rollout correction: importance weights pi_old / pi_rollout, when the driver computed them
            weights = (
                {"rollout_is_weights": micro.batch[ROLLOUT_IS_WEIGHTS]} if ROLLOUT_IS_WEIGHTS in micro.batch else {}
            )
            token_losses, metrics = self.policy_loss.fn(
                micro.batch[OLD_LOG_PROBS], log_probs, advantages, mask, **weights, **self.config.policy_loss_options
            )
            return token_losses, mask, metrics, {}
        if ROLLOUT_LOG_PROBS not in micro.batch:
            raise ValueError(
                "algorithm.rollout_correction.bypass_mode=true needs the rollout's log-probs "
                f"(batch[{ROLLOUT_LOG_PROBS!r}]), and this batch has none"
            )
        cfg = self.bypass
        correction = (
            None
            if cfg.rollout_is is None
            else {
                "rollout_is": cfg.rollout_is,
                "rollout_is_mode": cfg.rollout_is_mode,
                "rollout_is_threshold": cfg.rollout_is_threshold,
                "rollout_is_threshold_lower": cfg.rollout_is_threshold_lower,
                "rollout_is_batch_normalize": cfg.rollout_is_batch_normalize,
            }
        )
        token_losses, pg_mask, metrics = bypass_policy_loss(
            micro.batch[ROLLOUT_LOG_PROBS],
            log_probs,
            advantages,
            mask,
            loss_type=cfg.loss_type,
            correction=correction,
            ppo_options=self.config.policy_loss_options,
        )
        corr = {k: v for k, v in metrics.items() if k.startswith("rollout_corr/")}
        return token_losses, pg_mask, {k: v for k, v in metrics.items() if k not in corr}, corr

    def _probe(
        self,
        micro: DataProto,
        log_probs: torch.Tensor,
        entropy: torch.Tensor,
        mask: torch.Tensor,
        local: dict[str, float],
        diagnostics: dict[str, float],
    ) -> None:
        """The rollout policy's entropy (unless a loss term reports it) and its log-prob gap to this forward."""
        if self.config.entropy_coeff == 0:
            diagnostics["actor/entropy"] += agg_loss(entropy, mask, "token-mean", num_tokens=local["num_tokens"]).item()
        if ROLLOUT_LOG_PROBS in micro.batch:
            gap = ((log_probs - micro.batch[ROLLOUT_LOG_PROBS]).abs() * mask).max().item()
            diagnostics[GAP] = max(diagnostics[GAP], gap)


def _add_shares(diagnostics: dict[str, float], metrics: dict[str, float], weight: float) -> None:
    """A micro-batch's statistics into the rank's mini-batch values: means weighted by its share of the tokens,
    ``*_max`` / ``*_min`` as the largest / smallest over the micro-batches."""
    for key, value in metrics.items():
        if key.endswith(("_max", "_min")):
            pick = max if key.endswith("_max") else min
            diagnostics[key] = pick(diagnostics[key], value) if key in diagnostics else value
        else:
            diagnostics[key] += value * weight

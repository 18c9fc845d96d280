"""The single controller: the RL loop, one step per batch of prompts.

``fit()`` is the seven steps of the single controller (the table in
docs/architecture.md), each one call; everything heavy
runs in the worker groups (``self.actor``, ``self.ref``, ``self.critic``, ``self.reward_model``),
and only the logical batch (ids, masks, log-probs, rewards, advantages)
comes back here. Which stages exist is decided once, in ``__init__``, from
what the estimator and the config declare: the loop never branches on an
estimator's name.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hybridflow.agents.runner import AGENT_METRICS_PREFIX
from hybridflow.configs.roles import RolloutPlacement, reference_in_actor
from hybridflow.configs.schema import PPOConfig
from hybridflow.core import DataProto
from hybridflow.core.keys import (
    DATA_SOURCE,
    GLOBAL_STEP,
    GREEDY,
    METRICS,
    N_SAMPLES,
    OLD_LOG_PROBS,
    RESPONSE_MASK,
    REWARD_BASELINES,
    REWARD_COMPONENTS,
    REWARD_FAILED,
    RM_SCORES,
    ROLLOUT_IS_WEIGHTS,
    ROLLOUT_LOG_PROBS,
    SEED,
    TOKEN_LEVEL_REWARDS,
    TOKEN_LEVEL_SCORES,
    UID,
    WITH_SUM_PI_SQUARED,
)
from hybridflow.core.memory import MEMORY_PEAK_GB
from hybridflow.core.parallel_dims import ParallelDims
from hybridflow.core.rank_wait import WorkerError
from hybridflow.core.rollout_batch import concat_rollouts
from hybridflow.core.storage import absolute, child, is_url, read_text, write_text
from hybridflow.losses.rollout_correction import rollout_correction
from hybridflow.plugins import get_estimator
from hybridflow.rewards.manager import RewardOutput
from hybridflow.rewards.sources import VERIFIER, RewardSources
from hybridflow.trainer import checkpoint as ckpt
from hybridflow.trainer.agent_rollout import agent_rollout_for
from hybridflow.trainer.audit import AUDIT_FILE, append_records, trained_prompts
from hybridflow.trainer.batch_hooks import BatchHooks
from hybridflow.trainer.config_checks import ConfigError
from hybridflow.trainer.estimator_inputs import InputPlan, reward_components
from hybridflow.trainer.kl_control import KLController, apply_kl_penalty
from hybridflow.trainer.launch import Progress
from hybridflow.trainer.metrics import StageTimer, compute_data_metrics, throughput_metrics
from hybridflow.trainer.prompt_loader import PromptLoader, PromptSet
from hybridflow.trainer.reward_failures import FailedSteps, advantages_without_failures
from hybridflow.trainer.rollout_modes import (
    Rollout,
    engine_metrics,
    rollout_source,
    take_metrics,
    with_prompt_columns,
)
from hybridflow.trainer.tracking import (
    GENERATION_COLUMNS,
    GENERATIONS_TABLE,
    METRICS_FILE,
    RunInfo,
    Tracking,
    drop_steps_after,
    generation_rows,
    read_step,
)

logger = logging.getLogger(__name__)


@dataclass
class RunSummary:
    """What ``fit()`` returns and prints at the end."""

    steps: int = 0
    wall_time_s: float = 0.0
    val_before: dict[str, float] = field(default_factory=dict)
    """The validation before the first step; on a resumed run, the first run's (from ``metrics.jsonl``)."""
    val_after: dict[str, float] = field(default_factory=dict)
    last_metrics: dict[str, float] = field(default_factory=dict)
    run_dir: Path | None = None
    """The run directory, absolute."""
    resumed_at: int | None = None
    """The step of the checkpoint this run resumed from; None for a run that started afresh."""
    checkpoints: list[Path] = field(default_factory=list)
    """The checkpoints this run saved, oldest first (older ones may have been pruned: ``trainer.max_ckpt_to_keep``)."""
    checkpoints_kept: int = 0
    """How many checkpoints the checkpoint directory holds at the end."""
    hf_export: Path | None = None
    """The transformers directory written at the end (``trainer.save_hf_on_end``), if any."""
    restarts: int = 0
    """How many times the run restarted itself after a worker's failure (``trainer.max_restarts``)."""


def _resume_hint(checkpoint_root: Path) -> str:
    """Where a stopped run can resume from, for its last log line."""
    latest = ckpt.latest_checkpoint(checkpoint_root)
    return f"last checkpoint: {latest} (rerun in this run directory to resume)" if latest else "no checkpoint saved"


class PPOTrainer:
    """Drives the worker groups through RL steps.

    :param config: the composed config.
    :param groups: role name -> worker-group handle (``actor``; ``ref``, ``critic`` and ``reward_model`` when
        built).
    :param rollout: where the rollout runs and its handles (``trainer/rollout_modes.py``).
    :param reward_fn: the reward manager (the verifiers): ``reward_fn.score_batch(batch, tokenizer)``, each
        sample's score, fields and metrics (``rewards/manager.py``).
    :param tokenizer: decodes responses for the reward.
    :param train_prompts, val_prompts: tokenized prompt sets.
    :param run_dir: where metrics and checkpoints go.
    :param dims: the run's parallel layout (the same object the workers got).
    """

    def __init__(
        self,
        config: PPOConfig,
        groups: dict[str, Any],
        rollout: Rollout,
        reward_fn: Any,
        tokenizer: Any,
        train_prompts: PromptSet,
        val_prompts: PromptSet,
        run_dir: str | Path,
        dims: ParallelDims,
    ) -> None:
        self.config = config
        self.dims = dims
        self.actor, self.ref, self.critic = groups["actor"], groups.get("ref"), groups.get("critic")
        self.reward_model = groups.get("reward_model")
        self.sources = RewardSources.from_config(config.reward, config.reward_model.enable)
        if reference_in_actor(config):
            self.ref = self.actor  # its compute_ref_log_prob runs with the adapters off
        self.rollout_group = rollout.generator  # the actor's group, the rollout's own, or a server process
        self.reward_fn, self.tokenizer = reward_fn, tokenizer
        self.run_dir = Path(run_dir)
        self.world_size = dims.world_size
        info = rollout.tokenizer_info()
        pad_id = int(info["pad_token_id"])
        self.pad_id = pad_id
        # a multi-turn agent loop runs here, on the driver; None for one generation per prompt (the default)
        self.agents = agent_rollout_for(
            config, self.rollout_group, tokenizer, pad_id, list(info["eos_token_ids"]), rollout.server
        )
        self.loader = PromptLoader(
            train_prompts, config.data.train_batch_size, pad_id, shuffle=config.data.shuffle, seed=config.trainer.seed
        )
        self.sync_weights = rollout.weight_sync(self.actor)  # after every update; colocated, the actor does it
        self.val_prompts = val_prompts
        self.kl_ctrl = KLController.from_config(config.algorithm.kl_ctrl)
        self.inputs = InputPlan.for_estimator(get_estimator(config.algorithm.adv_estimator), config)
        self.hooks = BatchHooks(list(config.algorithm.batch_hooks), dict(config.algorithm.batch_hook_options))
        self.failed_steps = FailedSteps()
        self.tracking = Tracking(list(config.trainer.logger), run_info(config, self.run_dir))
        self.global_step = 0
        self._verifier_seen = False
        epochs_steps = config.trainer.total_epochs * self.loader.batches_per_epoch
        self.total_steps = min(epochs_steps, config.trainer.total_training_steps or epochs_steps)
        self.source = rollout_source(
            config,
            self.draw_prompts,
            self.generate,
            self.rollout_group,
            self.loader,
            rollout.placement is RolloutPlacement.GROUP,
            steps=self.total_steps,
        )
        # a URL (s3://...) is the root itself; a path is the run directory's (core/storage.py)
        local_dir = config.trainer.default_local_dir
        self.checkpoint_root = local_dir if is_url(local_dir) else self.run_dir / local_dir

    # ------------------------------------------------------------- the loop
    def fit(self) -> RunSummary:
        """Train for ``total_steps`` steps; validate and checkpoint on schedule.

        The loggers are closed however the loop ends. Ctrl-C stops it between
        two calls: ``fit`` logs the step it reached and the last checkpoint,
        then re-raises ``KeyboardInterrupt`` for the entry point to exit on.
        """
        summary = RunSummary()
        start = time.perf_counter()
        try:
            self._fit(summary)
        except KeyboardInterrupt:
            logger.error(
                "interrupted at step %d of %d; %s",
                self.global_step,
                self.total_steps,
                _resume_hint(self.checkpoint_root),
            )
            raise
        except WorkerError as err:  # a rank failed, timed out or stalled: the error names it
            err.step = self.global_step + 1  # for faults.jsonl
            logger.error(
                "stopped at step %d of %d by a worker: %s\n%s",
                self.global_step + 1,
                self.total_steps,
                str(err).splitlines()[0],
                _resume_hint(self.checkpoint_root),
            )
            raise
        finally:
            self.tracking.close()
            if self.agents is not None:
                self.agents.close()
        summary.steps = self.global_step
        summary.checkpoints_kept = len(ckpt.list_checkpoints(self.checkpoint_root))
        summary.val_after = {k: v for k, v in summary.last_metrics.items() if k.startswith("val/")}
        summary.wall_time_s = time.perf_counter() - start
        return summary

    def _fit(self, summary: RunSummary) -> None:
        summary.run_dir = self.run_dir.resolve()
        if self.config.trainer.save_freq > 0 or ckpt.list_checkpoints(self.checkpoint_root):  # saves, or resumes
            ckpt.check_shared(self.checkpoint_root, self.actor.probe_checkpoint_dir, "trainer.default_local_dir")
        resumed = self.resume()
        # the rollout's first weights (split: it starts with none), with the batches submitted ahead of the first step
        self.source.send_weights(self.global_step, self.sync_weights)
        if resumed:
            summary.resumed_at = self.global_step
            # a resumed run logged this step's validation before it stopped: log each step once, and
            # report the first run's validation before training (logged at step 0) as this run's
            summary.val_before = {
                k: v for k, v in read_step(self.run_dir / METRICS_FILE, 0).items() if k.startswith("val/")
            }
        else:  # from step 0: a restart before the first checkpoint logs every step again, each once
            self.tracking.rewind(-1)
            if self.config.trainer.test_freq > 0 and self.config.trainer.val_before_train:
                summary.val_before = self.validate()
                self.tracking.log(summary.val_before, self.global_step)
        drop_steps_after(self.run_dir / AUDIT_FILE, self.global_step)  # a fresh run's, or those past the checkpoint
        last_val = summary.val_before.get("val/accuracy", float("nan"))
        with Progress(self.total_steps, self.global_step) as progress:  # log lines print above its bar
            while self.global_step < self.total_steps:
                metrics = self.train_step()
                self.global_step += 1
                last = self.global_step == self.total_steps
                if self.config.trainer.test_freq > 0 and (self._due(self.config.trainer.test_freq) or last):
                    metrics.update(self.validate())
                # logged before the checkpoint: a run stopped between the two resumes from the step before and
                # rewinds this line, where the other order would leave the step's line missing for good
                self.tracking.log(metrics, self.global_step)
                if self._due(self.config.trainer.save_freq) or (last and self.config.trainer.save_freq > 0):
                    summary.checkpoints.append(self.save_checkpoint())
                last_val = metrics.get("val/accuracy", last_val)
                progress.update(score=metrics["score/mean"], val_acc=last_val)
                summary.last_metrics = metrics
        if self.config.trainer.save_hf_on_end:  # the final policy as a transformers directory
            summary.hf_export = (self.run_dir / "hf_model").resolve()
            self.actor.save_hf_model(str(summary.hf_export))
            logger.info("exported the policy as a transformers model: %s", summary.hf_export)

    def train_step(self) -> dict[str, float]:
        """One RL step: the seven stages of docs/architecture.md, in order (1-4 in :meth:`rollout`)."""
        timer, step_start = StageTimer(), time.perf_counter()
        metrics: dict[str, float] = {}
        self.traffic()  # from here on: this step's calls only
        batch = self.rollout(timer, metrics)  # 1-4, again on more prompts while after-reward hooks drop groups
        if self.critic is not None:
            with timer("values"):  # 5. values, for estimators that need a critic
                values = self.critic.compute_values(batch)
                batch.union(self.memory(metrics, "values", values))
        with timer("adv"):  # 6. advantages, the estimator resolved by name, over the samples whose reward was computed
            options = dict(self.config.algorithm.estimator_options)
            batch, trained, failure_metrics = advantages_without_failures(
                batch, self.config.algorithm.adv_estimator, options
            )
            metrics.update(failure_metrics)
            batch, hook_metrics = self.hooks.run("before_update", batch)
            metrics.update(hook_metrics)
        if self.failed_steps.trains(trained, self.global_step + 1):
            with timer("update"):  # 7. update critic, then actor, each on the same global mini-batches
                batch.meta_info[GLOBAL_STEP] = self.global_step
                if self.critic is not None:
                    critic = self.critic.update_critic(self.dims.critic.arrange_for_update(batch))
                    metrics.update(_mean_over_ranks(self.memory(metrics, "update", critic)))
                actor = self.actor.update_actor(self.dims.actor.arrange_for_update(batch))
                metrics.update(_mean_over_ranks(self.memory(metrics, "update", actor)))
        # the audit trail, before the step's checkpoint: a resume drops what follows the checkpoint and rewrites it
        append_records(self.run_dir, trained_prompts(batch, self.global_step + 1, version=self.global_step))
        metrics.update(self.source.send_weights(self.global_step + 1, self.sync_weights))  # to a rollout of its own

        some_left_out = bool(trained.any()) and not bool(trained.all())
        metrics.update(compute_data_metrics(batch[trained] if some_left_out else batch))  # the rows that trained
        metrics.update(timer.metrics())
        metrics.update(throughput_metrics(batch, time.perf_counter() - step_start, self.world_size))
        metrics.update(self.traffic())
        return metrics

    def traffic(self) -> dict[str, float]:
        """``driver/bytes_sent`` and ``driver/bytes_received``: the DataProto bytes this driver shipped to the
        worker groups and collected back since the last call (``core/worker_group.Traffic``)."""
        groups = (self.actor, self.ref, self.critic, self.reward_model, self.rollout_group)
        hosts = {id(h): h for g in groups if (h := getattr(g, "hosts", None)) is not None}
        sent = received = 0
        for host in hosts.values():
            s, r = host.traffic.take()
            sent, received = sent + s, received + r
        return {"driver/bytes_sent": float(sent), "driver/bytes_received": float(received)}

    def draw_prompts(self, index: int) -> DataProto:
        """The next batch of prompts from the loader, as rollout batch ``index``: a uid per prompt, ``n``, and a
        seed from (``trainer.seed``, ``index``), so a resumed or pipelined run samples batch ``index`` alike."""
        prompts = self.loader.next_batch()
        prompts.non_tensor_batch[UID] = np.array([str(uuid.uuid4()) for _ in range(len(prompts))], dtype=object)
        prompts.meta_info.update(
            {
                N_SAMPLES: self.config.actor_rollout_ref.rollout.n,
                GREEDY: False,
                SEED: self.config.trainer.seed * 100_003 + index,
            }
        )
        return prompts

    def generate_and_score(self, timer: StageTimer, metrics: dict[str, float]) -> DataProto:
        """Steps 1-4 on the next batch of prompts."""
        with timer("gen"):  # 1. rollout: n responses per prompt (trainer.rollout_mode says from which weights)
            prompts, batch, rollout_metrics = self.source.next(self.global_step)
            batch = self.memory(metrics, "gen", batch)
            metrics.update(rollout_metrics)
            metrics.update(agent_metrics(batch))
            metrics.update(engine_metrics(batch))
        with timer("old_log_prob"):  # 2. log-probs under the training layout (or the rollout's, the same numbers)
            self.old_log_probs(batch, metrics)
            metrics.update(self.correct_for_rollout(batch))
        if self.ref is not None:
            with timer("ref"):  # 3. reference log-probs for the KL terms
                ref = self.ref.compute_ref_log_prob(batch)
                batch.union(self.memory(metrics, "ref", ref))
        if self.reward_model is not None:
            with timer("rm"):  # 4. reward: the reward model's scores (a stage of its own) ...
                scores = self.reward_model.compute_rm_score(batch)
                batch.union(self.memory(metrics, "rm", scores))
        with timer("reward"):  # ... the verifiers', combined as reward.sources declare (and a greedy baseline)
            metrics.update(self.score(batch))
            if self.inputs.greedy_baseline:
                metrics.update(self.greedy_baseline(prompts, batch))
        return batch

    def rollout(self, timer: StageTimer, metrics: dict[str, float]) -> DataProto:
        """Steps 1-4, then the after-reward hooks; while they leave fewer than ``data.train_batch_size``
        prompts, the same on the next prompts (a recipe's dynamic sampling, say), up to
        ``algorithm.max_rollout_batches`` batches. The step then trains on exactly ``data.train_batch_size`` prompts,
        topped up with dropped groups if the cap was reached; the hooks' metrics are summed over its rollout batches."""
        if not self.hooks.stage("after_reward"):
            return self.generate_and_score(timer, metrics)
        want, n = self.config.data.train_batch_size, self.config.actor_rollout_ref.rollout.n
        kept, dropped, rollouts = [], [], 0
        while rollouts < self.config.algorithm.max_rollout_batches and sum(len(b) for b in kept) < want * n:
            scored = self.generate_and_score(timer, metrics)
            rollouts += 1
            batch, hook_metrics = self.hooks.run("after_reward", scored)
            for key, value in hook_metrics.items():  # summed over the step's rollout batches
                metrics[key] = metrics.get(key, 0.0) + value
            kept.append(batch)
            dropped.append(scored[~np.isin(scored.non_tensor_batch[UID], batch.non_tensor_batch[UID])])
        have = sum(len(b) for b in kept)
        topped_up = max(0, want * n - have)
        batch = concat_rollouts([b for b in kept + dropped if len(b)], self.pad_id)[: want * n]
        metrics.update({"batch_hooks/rollout_batches": float(rollouts), "batch_hooks/topped_up": float(topped_up // n)})
        return batch

    def generate(self, prompts: DataProto) -> DataProto:
        """``meta_info["n"]`` responses per prompt from the actor's rollout, with the prompts' non-tensor
        columns (data source, ground truth, uid, ...) repeated beside them: the workers get the token
        columns only and never ship those back. With a multi-turn agent loop, its trajectories
        (``trainer/agent_rollout.py``), in the same layout."""
        if self.agents is not None:
            return self.agents.generate(prompts)
        return with_prompt_columns(self.rollout_group.generate_sequences(prompts), prompts)

    @staticmethod
    def memory(metrics: dict[str, float], stage: str, out: Any) -> Any:
        """Move the peak memory a stage's ranks reported (``core/memory.py``) out of its result into
        ``memory/<stage>/peak_gb`` (the largest over ranks and calls); returns the result."""
        if isinstance(out, DataProto):
            peaks = out.meta_info.get(METRICS, {}).pop(MEMORY_PEAK_GB, [])
            if not out.meta_info.get(METRICS):
                out.meta_info.pop(METRICS, None)
        else:  # per-rank metric dicts
            peaks = [rank.pop(MEMORY_PEAK_GB) for rank in out if MEMORY_PEAK_GB in rank]
        peaks = peaks if isinstance(peaks, list) else [peaks]
        if peaks:
            key = f"memory/{stage}/peak_gb"
            metrics[key] = max([*peaks, metrics.get(key, 0.0)])
        return out

    def greedy_baseline(self, prompts: DataProto, batch: DataProto) -> dict[str, float]:
        """``reward_baselines``: each prompt's greedy response, scored, repeated over its n samples (ReMax)."""
        greedy = DataProto(
            dict(prompts.batch), dict(prompts.non_tensor_batch), {**prompts.meta_info, N_SAMPLES: 1, GREEDY: True}
        )
        reward, _ = self.rewards(self.generate(greedy))
        baseline = reward.scores.repeat_interleave(self.config.actor_rollout_ref.rollout.n)
        batch.batch[REWARD_BASELINES] = baseline
        return {"reward/greedy_baseline/mean": baseline.mean().item()}

    def old_log_probs(self, batch: DataProto, metrics: dict[str, float]) -> None:
        """``old_log_probs`` (and what the estimator declared of the pass): recomputed by the actor under the
        training layout, or, where ``actor.recompute_old_log_prob`` resolved so (``trainer/estimator_inputs.py``),
        the rollout's own log-probs, which are the same numbers: no pass at all."""
        if not self.inputs.recompute_old_log_prob:
            batch.batch[OLD_LOG_PROBS] = batch.batch[ROLLOUT_LOG_PROBS]
            return
        batch.meta_info[WITH_SUM_PI_SQUARED] = self.inputs.sum_pi_squared
        log_probs = self.actor.compute_log_prob(batch)
        batch.union(self.memory(metrics, "old_log_prob", log_probs))

    def correct_for_rollout(self, batch: DataProto) -> dict[str, float]:
        """``rollout_is_weights`` between the training and the rollout policy (``algorithm.rollout_correction``);
        in ``mask`` mode the rejected tokens leave ``response_mask``. Nothing when it is off, or in bypass mode
        (the actor's loss weighs pi_current / pi_rollout itself: ``losses/bypass.py``)."""
        cfg = self.config.algorithm.rollout_correction
        if cfg.rollout_is is None or cfg.bypass_mode:
            return {}
        out = rollout_correction(
            batch.batch[OLD_LOG_PROBS],
            batch.batch[ROLLOUT_LOG_PROBS],
            batch.batch[RESPONSE_MASK],
            rollout_is=cfg.rollout_is,
            rollout_is_mode=cfg.rollout_is_mode,
            rollout_is_threshold=cfg.rollout_is_threshold,
            rollout_is_threshold_lower=cfg.rollout_is_threshold_lower,
            rollout_is_batch_normalize=cfg.rollout_is_batch_normalize,
        )
        batch.batch[ROLLOUT_IS_WEIGHTS] = out.weights
        batch.batch[RESPONSE_MASK] = out.response_mask.to(batch.batch[RESPONSE_MASK].dtype)
        return dict(out.metrics)

    def rewards(self, batch: DataProto) -> tuple[RewardOutput, RewardOutput | None]:
        """``(reward, verified)``: each response's reward, its sources combined as ``reward.sources`` declare
        (``rewards/sources.py``; the reward model's scores are computed here unless the batch has them), and
        the verifiers' own output (None when the verifier is not a source)."""
        if self.reward_model is not None and RM_SCORES not in batch.batch:  # validation, a greedy baseline
            scored = self.reward_model.compute_rm_score(batch)
            scored.meta_info.pop(METRICS, None)  # its peak memory: the rm stage reports the training batch's
            batch.union(scored)
        verified = self.reward_fn.score_batch(batch, self.tokenizer) if self.sources.uses(VERIFIER) else None
        if verified is not None and not self._verifier_seen:  # the first batch scored, validation or training
            self._verifier_seen = True
            refuse_a_broken_verifier(verified)
        return self.sources.combine(verified, batch.batch.get(RM_SCORES), batch.batch[RESPONSE_MASK]), verified

    def score(self, batch: DataProto) -> dict[str, float]:
        """The reward into ``token_level_scores`` (and ``reward_components``, when the estimator declared
        them); rewards with the KL penalty when configured."""
        out, _ = self.rewards(batch)
        metrics = dict(out.metrics)
        batch.batch[TOKEN_LEVEL_SCORES] = out.token_level_scores
        if self.config.reward.on_failure == "exclude":  # out of the advantage and the loss: trainer/reward_failures.py
            batch.batch[REWARD_FAILED] = torch.tensor(out.failed or [False] * len(batch), dtype=torch.bool)
        if self.inputs.reward_components:
            batch.batch[REWARD_COMPONENTS] = reward_components(
                out.fields, self.inputs.reward_components, self.config.reward.timeout_score
            )
        if self.config.algorithm.use_kl_in_reward:
            metrics.update(apply_kl_penalty(batch, self.kl_ctrl, self.config.algorithm.kl_penalty))
        else:
            batch.batch[TOKEN_LEVEL_REWARDS] = out.token_level_scores
        return metrics

    # ----------------------------------------------------------- validation
    def validate(self) -> dict[str, float]:
        """One response per validation prompt (greedy unless ``rollout.val_greedy`` is off: then sampled
        at the rollout temperature, seeded); the mean reward (``val/score``, and per data_source), the
        verifiers' accuracy (the fraction scoring >= 1, over the responses they decide; verifiers run here even
        when they are no reward source, as the task's true measure) and, with a reward model,
        ``val/reward_model/score``. The first ``trainer.log_val_generations`` prompts go to the loggers with
        their responses and rewards."""
        indices = list(range(len(self.val_prompts)))
        scores, sources, shown, verified, rm = [], [], [], [], []
        greedy, keep = self.config.actor_rollout_ref.rollout.val_greedy, self.config.trainer.log_val_generations
        for start in range(0, len(indices), self.config.data.val_batch_size):
            prompts = self.val_prompts.batch(indices[start : start + self.config.data.val_batch_size], self.pad_id)
            prompts.meta_info.update({N_SAMPLES: 1, GREEDY: greedy, SEED: self._seed() + start})
            out = self.generate(prompts)
            reward, checked = self.rewards(out)
            checked = checked or self.reward_fn.score_batch(out, self.tokenizer)
            scores.append(reward.scores)
            verified += [f.get("score", 0.0) for f, d in zip(checked.fields, checked.decided) if d]
            rm += out.batch[RM_SCORES].tolist() if RM_SCORES in out.batch else []
            sources.extend(out.non_tensor_batch[DATA_SOURCE].tolist())
            shown += generation_rows(out, scores[-1].tolist(), self.tokenizer, keep - len(shown))
        if shown:
            self.tracking.log_table(GENERATIONS_TABLE, GENERATION_COLUMNS, shown, self.global_step)
        all_scores = torch.cat(scores)
        metrics = {"val/score": all_scores.mean().item()}
        if verified:
            metrics["val/accuracy"] = float(np.mean([s >= 1.0 for s in verified]))
        if rm:
            metrics["val/reward_model/score"] = float(np.mean(rm))
        for source in sorted(set(sources)):
            picked = torch.tensor([s == source for s in sources])
            metrics[f"val/{source}/score"] = all_scores[picked].mean().item()
        return metrics

    # ---------------------------------------------------------- checkpoints
    def save_checkpoint(self) -> Path:
        """Sharded worker state plus the driver's position, published atomically; returns its (absolute) path,
        which is logged."""
        staged = ckpt.prepare_staging(self.checkpoint_root, self.global_step)
        self.actor.save_checkpoint(str(staged))
        if self.critic is not None:
            self.critic.save_checkpoint(str(staged))
        # the loader's position after the trained batches: batches drawn ahead of them are drawn again on resume
        loader, batches = self.source.position()
        driver_state = {
            "global_step": self.global_step,
            "loader": loader,
            "rollout_batches": batches,
            "kl_coef": self.kl_ctrl.value,
        }
        write_text(child(staged, ckpt.DRIVER_STATE), json.dumps(driver_state))
        path = ckpt.publish(self.checkpoint_root, self.global_step, self.config.trainer.max_ckpt_to_keep)
        path = absolute(path)
        logger.info("saved checkpoint of step %d: %s", self.global_step, path)
        return path

    def resume(self) -> bool:
        """Load the checkpoint ``trainer.resume_mode`` names (auto: the latest, if any); whether one was loaded."""
        mode = str(self.config.trainer.resume_mode)
        if mode == "disable":
            return False
        path = ckpt.latest_checkpoint(self.checkpoint_root) if mode == "auto" else mode
        if path is None:
            return False
        ckpt.step_of(path)  # a clear error for a path that is not a checkpoint
        state = json.loads(read_text(child(path, ckpt.DRIVER_STATE)))
        self.actor.load_checkpoint(str(path))
        if self.critic is not None:
            self.critic.load_checkpoint(str(path))
        self.global_step = state["global_step"]
        self.loader.load_state_dict(state["loader"])
        self.source.drawn = state.get("rollout_batches", self.global_step)  # batch indices (and seeds) continue
        self.kl_ctrl.value = state["kl_coef"]
        # a run killed after its last checkpoint logged steps it will train again: drop them (metrics.jsonl)
        self.tracking.rewind(self.global_step)
        logger.info("resumed from %s at step %d", absolute(path), self.global_step)
        return True

    # -------------------------------------------------------------- helpers
    def _due(self, freq: int) -> bool:
        return freq > 0 and self.global_step % freq == 0

    def _seed(self) -> int:
        # sampling is a function of (seed, step): a resumed run samples as the original did
        return self.config.trainer.seed * 100_003 + self.global_step


def refuse_a_broken_verifier(verified: RewardOutput) -> None:
    """Stop the run when the verifiers raised on every sample of the first batch they scored: the reward function
    is broken (a wrong file, a missing import, a wrong signature), and training on ``reward.timeout_score`` for
    every sample would teach nothing while the run looked healthy. Raises :class:`ConfigError` with the error."""
    if not verified.fields or len(verified.errors) < len(verified.fields):
        return
    counts = Counter(verified.errors)
    shown = "; ".join(f"{error} ({n}x)" for error, n in counts.most_common(3))
    raise ConfigError(
        "invalid config:\n  - the reward's verifier raised on every sample of the first batch it scored "
        f"({len(verified.fields)}): {shown} (reward.custom_reward_function, reward.route)"
    )


def run_info(config: PPOConfig, run_dir: Path) -> RunInfo:
    """Names for the loggers, the resolved config and the installed plugins with their versions."""
    from hybridflow.plugins import get_plugin_manager

    plugins = {name: f"{src.distribution} {src.version}" for name, src in get_plugin_manager().sources.items()}
    return RunInfo(
        run_dir=run_dir,
        project=config.trainer.project_name,
        name=config.trainer.run_name or config.trainer.experiment_name,
        group=config.trainer.run_group,
        config={**asdict(config), "installed_plugins": plugins},
    )


def agent_metrics(batch: DataProto) -> dict[str, float]:
    """The ``agent/*`` metrics an agent rollout left in the batch's ``meta_info`` (taken out of it)."""
    return take_metrics(batch, AGENT_METRICS_PREFIX)


def _mean_over_ranks(per_rank: list[dict[str, float]]) -> dict[str, float]:
    keys = per_rank[0].keys()
    return {key: sum(m[key] for m in per_rank) / len(per_rank) for key in keys}

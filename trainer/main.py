"""``hybridflow-train``: the Hydra entry point (also ``python -m hybridflow.trainer.main``).

Parse the config, check it, build the worker groups, train, print a summary.
Everything a run writes (metrics.jsonl, checkpoints) goes to Hydra's run
directory (``outputs/<date>/<time>/`` by default). Under ``--multirun`` each
job runs through :func:`hybridflow.trainer.multirun.run_sweep_job`: a failing
job is recorded and the sweep goes on (see that module).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf

from hybridflow.configs.overrides import override_problems, translate
from hybridflow.configs.schema import PPOConfig, register_configs
from hybridflow.trainer.audit import audit_summary
from hybridflow.trainer.config_checks import (
    check_config,
    check_datasets,
    config_warnings,
    dataset_rows,
    settle_cpu_threads,
    settle_device,
)
from hybridflow.trainer.launch import (
    group_options,
    ray_running,
    refuse_overrides,
    reserve_ranks,
    run_command,
    summary_table,
)
from hybridflow.trainer.memory_check import check_memory
from hybridflow.trainer.multirun import current_job, logger_names, run_sweep_job
from hybridflow.trainer.ppo_trainer import RunSummary
from hybridflow.trainer.restarts import fit_with_restarts

logger = logging.getLogger("hybridflow.train")

COMMAND = "hybridflow-train"

register_configs()


def resolve_data_files(config: PPOConfig) -> tuple[list[str], list[str]]:
    """Absolute train and validation files; generate the synthetic task (``data.synthetic_task``) when none are given.

    The task is generated into ``<data.synthetic_dir>/<task prefix>seed<trainer.seed>``: its
    split depends on the seed, and jobs of a parallel sweep share the directory.
    """
    data = config.data
    val = [to_absolute_path(f) for f in data.val_files]
    if data.train_files:
        return [to_absolute_path(f) for f in data.train_files], val or [to_absolute_path(f) for f in data.train_files]
    from hybridflow.data import SYNTHETIC_GENERATORS

    prefix, generate_synthetic = SYNTHETIC_GENERATORS[data.synthetic_task]
    target = Path(to_absolute_path(data.synthetic_dir)) / f"{prefix}seed{config.trainer.seed}"
    target.mkdir(parents=True, exist_ok=True)
    # write privately, then rename into place (atomic): a job of a parallel
    # sweep never reads a file that another job is still writing
    with tempfile.TemporaryDirectory(dir=target, prefix=".tmp-") as scratch:
        for path in generate_synthetic(scratch, seed=config.trainer.seed).values():
            os.replace(path, target / Path(path).name)
    return [str(target / "train.parquet")], val or [str(target / "val.parquet")]


def resolve_reward_model_paths(config: PPOConfig) -> None:
    """The reward model's directories, absolute (relative ones against the directory the command started in, as
    data files are), so that every worker process reads the same one."""
    model = config.reward_model.model
    for name in ("path", "tokenizer_path"):
        if getattr(model, name):
            setattr(model, name, to_absolute_path(getattr(model, name)))


def build_and_fit(config: PPOConfig, run_dir: Path, facts: dict[str, Any] | None = None) -> RunSummary:
    """Start Ray, build the colocated worker groups (and the rollout's own, with ``trainer.placement=split``),
    run the trainer, shut down; returns the run's summary.

    Ray is stopped on the way out, also when anything fails, if this call
    started it. ``facts``, when given, receives the Ray node and GCS address the
    run used and when it connected and let go (``job_status.json`` of a sweep job records them).
    """
    settle_device(config.trainer)  # a config built in code, not checked, may still say auto
    settle_cpu_threads(config.trainer)  # before ray_running's OMP_NUM_THREADS default: a user's own caps it
    train_files, val_files = resolve_data_files(config)
    resolve_reward_model_paths(config)
    # first, before the workers' imports: a data file that is not parquet, has no rows or lacks a column is a
    # ConfigError naming its key, file (and row) within seconds; without data.val_files the training rows validate
    train_rows, val_rows = dataset_rows(config.data, train_files, val_files)

    from hybridflow.configs.roles import needs_critic, rollout_placement
    from hybridflow.core.parallel_dims import ParallelDims
    from hybridflow.trainer.prompt_loader import PromptSet
    from hybridflow.workers.models import load_tokenizer

    tokenizer = load_tokenizer(config.actor_rollout_ref.model.path)
    max_len = config.data.max_prompt_length
    train = PromptSet.from_rows(train_rows, tokenizer, max_len)
    val = PromptSet.from_rows(val_rows, tokenizer, max_len)
    check_datasets(config, len(train), len(val), {"train": train_files, "val": val_files})
    dims = ParallelDims.from_config(config, use_critic=needs_critic(config))
    placement = rollout_placement(config)

    try:  # ray_running stops Ray on every way out; the sweep's facts record when
        with ray_running(config.trainer.ray_address):
            if facts is not None:
                import ray

                context = ray.get_runtime_context()
                facts.update(
                    ray_node_id=context.get_node_id(), ray_gcs_address=context.gcs_address, ray_up_at=time.time()
                )
            return fit_with_restarts(
                lambda attempt: _fit_on_ray(attempt, run_dir, dims, placement, tokenizer, train, val), config, run_dir
            )
    finally:
        if facts is not None:
            facts["ray_down_at"] = time.time()


def _fit_on_ray(config: PPOConfig, run_dir: Path, dims, placement, tokenizer, train, val) -> RunSummary:
    """Reserve the ranks, start the worker groups (and the rollout's own group or server), train."""
    from hybridflow.configs.roles import (
        RolloutPlacement,
        needs_reference,
        reference_in_actor,
        resolve_loss_agg_mode,
    )
    from hybridflow.core import ColocatedWorkerGroup, RoleSpec
    from hybridflow.plugins import get_rollout_engine
    from hybridflow.trainer.ppo_trainer import PPOTrainer
    from hybridflow.trainer.rollout_modes import Rollout
    from hybridflow.workers.actor.worker import ActorRolloutWorker
    from hybridflow.workers.critic.worker import CriticWorker
    from hybridflow.workers.reference import RefWorker
    from hybridflow.workers.reward_model import RewardModelWorker

    actor_kwargs = {"config": config, "dims": dims, "loss_agg_mode": resolve_loss_agg_mode(config)}
    roles = {"actor": RoleSpec(ActorRolloutWorker, kwargs=actor_kwargs)}
    if needs_reference(config) and not reference_in_actor(config):
        roles["ref"] = RoleSpec(RefWorker, kwargs={"config": config, "dims": dims})
    if dims.use_critic:
        roles["critic"] = RoleSpec(CriticWorker, kwargs={"config": config, "dims": dims})
    if config.reward_model.enable:
        roles["reward_model"] = RoleSpec(RewardModelWorker, kwargs={"config": config, "dims": dims})
    with ThreadPoolExecutor(max_workers=1) as starter, ExitStack() as stack:
        pool = _resource_pool(config)
        stack.callback(pool.release)
        rollout_start = None
        if placement is RolloutPlacement.GROUP:
            rollout_pool = _resource_pool(config, ranks=[config.trainer.rollout_ranks])
            stack.callback(rollout_pool.release)
            # the rollout's own group starts beside the training group: both import torch
            rollout_start = starter.submit(_rollout_group, config, dims, rollout_pool)
        stack.callback(_shut_down_started, rollout_start)  # also when the training group fails to start
        group = stack.enter_context(ColocatedWorkerGroup(pool, roles, group_options(config)))
        handles = {name: group[name] for name in roles}
        rollout = Rollout(placement, handles["actor"])
        if rollout_start is not None:
            rollout = Rollout(placement, rollout_start.result()["rollout"])
        reward_manager = stack.enter_context(_reward_manager(config))
        for handle in _each_once([*handles.values(), rollout.generator]):  # colocated, the generator is the actor
            handle.init_model()
        if placement is RolloutPlacement.SERVER:  # the agent loops' server, filled by the first weight sync
            name = config.actor_rollout_ref.rollout.name
            server = stack.enter_context(get_rollout_engine(name).server(config, run_dir / f"{name}_server.log"))
            rollout = Rollout(placement, server, server)
        trainer = PPOTrainer(config, handles, rollout, reward_manager, tokenizer, train, val, run_dir, dims)
        return trainer.fit()


def _each_once(handles: list) -> list:
    """``handles`` without repeats (by identity), in order."""
    return list({id(handle): handle for handle in handles}.values())


def _rollout_group(config: PPOConfig, dims, pool):
    """The rollout's own worker group (``trainer.placement=split``), started.

    Its actors are threaded: the ``generate_stream`` calls of the batches in flight wait at once, beside a weight
    transfer and a validation call.
    """
    from hybridflow.core import ColocatedWorkerGroup, RoleSpec
    from hybridflow.workers.rollout.worker import RolloutWorker

    options = group_options(config, name="hybridflow-rollout", max_concurrency=config.trainer.batches_ahead() + 4)
    return ColocatedWorkerGroup(
        pool, {"rollout": RoleSpec(RolloutWorker, kwargs={"config": config, "dims": dims})}, options
    )


def _shut_down_started(start: Future | None) -> None:
    """Shut a group down once its start (in the background) is over; nothing if it never started."""
    if start is None:
        return
    try:
        group = start.result()
    except BaseException:  # noqa: BLE001 - its error is raised where the result is taken
        return
    group.shutdown()


def _resource_pool(config: PPOConfig, ranks: list[int] | None = None):
    """The run's training ranks (or the rollout's ``ranks`` per node, ``trainer.placement=split``), reserved;
    a cluster that cannot hold them is a config error naming the keys."""
    trainer = config.trainer
    if ranks:
        refusal = (
            f"trainer.rollout_ranks={trainer.rollout_ranks} rollout ranks (trainer.placement=split) with "
            f"trainer.device={trainer.device!r}, beside the training ranks, do not fit the Ray cluster: lower "
            "trainer.rollout_ranks, use trainer.placement=colocated, or add a node with room"
        )
    else:
        refusal = (
            f"trainer.nnodes={trainer.nnodes} x trainer.n_gpus_per_node={trainer.n_gpus_per_node} ranks with "
            f"trainer.device={trainer.device!r} do not fit the Ray cluster: lower trainer.n_gpus_per_node or "
            "trainer.nnodes, use trainer=cpu, or add nodes"
        )
    nodes = ranks or [trainer.n_gpus_per_node] * trainer.nnodes
    name = "hybridflow-rollout" if ranks else "hybridflow"  # the placement groups' names say which pool
    return reserve_ranks(nodes, use_gpu=trainer.device == "cuda", refusal=refusal, name=name)


def _reward_manager(config: PPOConfig):
    from hybridflow.rewards.manager import RewardManager
    from hybridflow.rewards.sources import REWARD_MODEL, RewardSources

    reward = config.reward
    return RewardManager(
        route=dict(reward.route),
        num_workers=reward.num_workers,
        timeout_s=reward.timeout_s,
        timeout_score=reward.timeout_score,
        custom_reward_function=asdict(reward.custom_reward_function),
        overlong_buffer=asdict(reward.overlong_buffer),
        verifier_kwargs={name: dict(kwargs) for name, kwargs in reward.verifier_kwargs.items()},
        max_response_length=config.actor_rollout_ref.rollout.response_length,
        worker_memory_mb=reward.worker_memory_mb,
        # where a reward model scores, a data_source no verifier covers is the model's alone
        abstain_unrouted=RewardSources.from_config(reward, config.reward_model.enable).uses(REWARD_MODEL),
    )


def format_summary(summary: RunSummary, config: PPOConfig) -> str:
    """The table printed at the end of a run: what it reached, and where it wrote it."""
    resumed = summary.resumed_at is not None

    def accuracy(metrics: dict[str, float]) -> str:
        if "val/accuracy" in metrics:
            return f"{metrics['val/accuracy']:.3f}"
        if config.trainer.test_freq == 0:
            return "not run (trainer.test_freq=0)"
        return f"not run (resumed at step {summary.resumed_at})" if resumed else "not run"

    before = accuracy(summary.val_before)
    if not (resumed or summary.val_before or config.trainer.val_before_train) and config.trainer.test_freq:
        before = "not run (trainer.val_before_train=false)"
    if resumed and "val/accuracy" in summary.val_before:
        before += " (the first run's, at step 0)"
    rows = [
        ("estimator", config.algorithm.adv_estimator),
        ("trained", _trained_row(config)),
        ("steps", str(summary.steps) + (f" (resumed at step {summary.resumed_at})" if resumed else "")),
        ("validation accuracy before", before),
        ("validation accuracy after", accuracy(summary.val_after)),
        ("train score (last step)", f"{summary.last_metrics.get('score/mean', float('nan')):.3f}"),
        ("wall time", f"{summary.wall_time_s:.1f} s"),
        ("run directory", str(summary.run_dir) if summary.run_dir is not None else "-"),
        ("checkpoints", _checkpoints_row(summary, config)),
        ("prompts trained", audit_summary(summary.run_dir)),
        *([("restarts", f"{summary.restarts} after worker faults (faults.jsonl)")] if summary.restarts else []),
        ("hf export", "none (trainer.save_hf_on_end=false)" if summary.hf_export is None else str(summary.hf_export)),
    ]
    return summary_table("hybridflow run summary", rows)


def _trained_row(config: PPOConfig) -> str:
    """Which parameters the actor trained, and so where its reference came from."""
    model = config.actor_rollout_ref.model
    if not model.lora_rank:
        return "all parameters"
    return (
        f"LoRA adapters (rank {model.lora_rank}, alpha {model.lora_alpha:g}); no reference group: the reference "
        "is the model with its adapters off"
    )


def _checkpoints_row(summary: RunSummary, config: PPOConfig) -> str:
    """How many checkpoints the run saved and kept, and the last one's path."""
    if not summary.checkpoints:
        return "none saved" + (" (trainer.save_freq=0)" if config.trainer.save_freq == 0 else "")
    return f"{len(summary.checkpoints)} saved, {summary.checkpoints_kept} kept, last: {summary.checkpoints[-1]}"


def train(cfg: DictConfig, facts: dict[str, Any] | None = None) -> float:
    """Check ``cfg``, name the run for the loggers, train; returns the final validation accuracy (NaN if not run)."""
    config: PPOConfig = OmegaConf.to_object(cfg)
    check_config(config)
    check_memory(config)  # before Ray: a run that will not fit stops here
    for warning in config_warnings(config):
        logger.warning(warning)
    trainer = config.trainer
    trainer.run_group, trainer.run_name = logger_names(trainer.run_group, trainer.run_name, trainer.experiment_name)
    run_dir = Path(HydraConfig.get().runtime.output_dir).resolve()
    logger.info("run directory: %s", run_dir)
    summary = build_and_fit(config, run_dir, facts)
    print(format_summary(summary, config), file=sys.stdout, flush=True)
    return summary.val_after.get("val/accuracy", float("nan"))


@hydra.main(config_path="../configs", config_name="ppo_trainer", version_base=None)
def hydra_main(cfg: DictConfig) -> float:
    """Hydra's task function; returns the final validation accuracy (for sweepers; NaN for a failed sweep job).

    A single run ends as every training command does (:func:`~hybridflow.trainer.launch.run_command`: a bad
    config 2, Ctrl-C 130, a worker's failure 1, each with a message and no traceback). Under ``--multirun`` a
    failing job is logged and recorded in its directory and the next job starts.
    """
    job = current_job()
    if job is None:
        return run_command(COMMAND, lambda: train(cfg))
    facts: dict[str, Any] = {}
    return run_sweep_job(lambda: train(cfg, facts), job, facts)


def main() -> None:
    """The ``hybridflow-train`` command: veRL's spellings translated (one line each), the overrides checked
    against the schema, then :func:`hydra_main` on the translated command line."""
    translation = translate(sys.argv[1:])
    for line in translation.lines:
        print(f"{COMMAND}: {line}", file=sys.stderr, flush=True)
    refuse_overrides(COMMAND, override_problems(translation.args))
    sys.argv[1:] = translation.args
    hydra_main()


if __name__ == "__main__":
    main()

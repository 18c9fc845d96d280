"""``hybridflow-train-rm``: a Bradley-Terry reward model trained on preference pairs.

Also ``python -m hybridflow.tools.train_rm``.

Check the config (before Ray or a model starts: a bad key, value or file
exits 2 with one line per problem), tokenize the pairs here, start one worker
group of ``trainer.n_gpus_per_node`` ranks (``workers/reward_model_trainer.py``),
train, evaluate the pairwise accuracy on the validation pairs, save the reward
model as an HF directory and print a summary. Everything goes into Hydra's run
directory (``outputs/<date>/<time>/``): ``metrics.jsonl`` (one line per step:
``train/loss``, ``train/accuracy``, and ``val/loss``, ``val/accuracy`` at the
steps that evaluate) and the model (``trainer.output_dir``). Keys:
``configs/rm_schema.py``; defaults: ``configs/train_rm.yaml``.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
import numpy as np
from hydra.core.hydra_config import HydraConfig
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf

from hybridflow.configs.rm_schema import RMConfig, register_rm_configs
from hybridflow.trainer.config_checks import ConfigError, settle_device
from hybridflow.trainer.launch import (
    Progress,
    group_options,
    ray_running,
    refuse_overrides,
    reserve_ranks,
    run_command,
    summary_table,
)

logger = logging.getLogger("hybridflow.train_rm")

register_rm_configs()

COMMAND = "hybridflow-train-rm"
NAME = "hybridflow-rm"
"""The name of its placement group and worker group (beside an RL run's on a shared cluster)."""
PREFERENCE_COLUMNS = ("prompt", "chosen", "rejected")
"""The columns a preference file must have (``data_source`` and ``extra_info`` are optional)."""


class RMConfigError(ConfigError):
    """Invalid settings or unusable data files; the message names each key, its value and what is allowed."""


# ------------------------------------------------------------------ the data
@dataclass
class PairSet:
    """Tokenized preference pairs (``preference_ids``, ``workers/rm_inputs.py``), aligned by index."""

    chosen: list[list[int]] = field(default_factory=list)
    rejected: list[list[int]] = field(default_factory=list)
    kinds: list[str | None] = field(default_factory=list)  # extra_info.rejected_kind, where the rows say
    truncated: int = 0  # texts cut from the left to data.max_length

    @classmethod
    def from_rows(cls, rows: Sequence[dict], tokenizer: Any, max_length: int) -> PairSet:
        """Tokenize every row's prompt with its chosen and with its rejected response."""
        from hybridflow.workers.reward_model_trainer import preference_ids

        pairs = cls()
        for row in rows:
            for side, out in (("chosen", pairs.chosen), ("rejected", pairs.rejected)):
                ids = preference_ids(tokenizer, row["prompt"], row[side])
                pairs.truncated += len(ids) > max_length
                out.append(ids[-max_length:])
            pairs.kinds.append((row.get("extra_info") or {}).get("rejected_kind"))
        return pairs

    def __len__(self) -> int:
        return len(self.chosen)

    def batch(self, indices: Sequence[int], pad_id: int):
        """The pairs at ``indices``, right-padded (a DataProto of the worker's pair columns)."""
        from hybridflow.workers.reward_model_trainer import pair_batch

        return pair_batch([self.chosen[i] for i in indices], [self.rejected[i] for i in indices], pad_id)


def read_preferences(key: str, paths: Sequence[str]) -> list[dict]:
    """The rows of the parquet files ``paths`` (the value of config key ``key``), checked.

    :raises RMConfigError: naming the key and the file for a missing or unreadable file, no rows, a missing
        column, or a row whose prompt or responses are not text (a prompt may be chat messages).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows: list[dict] = []
    for path in paths:
        where = f"{key}: {path}"
        if not os.path.isfile(path):
            columns = ", ".join(PREFERENCE_COLUMNS)
            raise RMConfigError(f"{where}: no such file (expected parquet with columns {columns})")
        try:
            table = pq.read_table(path)
        except (pa.ArrowInvalid, OSError) as err:
            raise RMConfigError(f"{where}: not a readable parquet file ({err})") from None
        missing = [c for c in PREFERENCE_COLUMNS if c not in table.column_names]
        if missing or not table.num_rows:
            what = f"missing column(s) {missing}; it has {table.column_names}" if missing else "no rows"
            raise RMConfigError(f"{where}: {what} (a preference file has columns {', '.join(PREFERENCE_COLUMNS)})")
        for index, row in enumerate(table.to_pylist()):
            if not (isinstance(row["chosen"], str) and isinstance(row["rejected"], str) and row["prompt"]):
                raise RMConfigError(
                    f"{where}, row {index}: prompt must be text or chat messages and chosen, rejected text"
                )
            rows.append(row)
    return rows


def preference_files(config: RMConfig) -> tuple[list[str], list[str]]:
    """Absolute train and validation files; the synthetic preferences, generated, when no files are given."""
    data = config.data
    if data.train_files:
        return [to_absolute_path(f) for f in data.train_files], [to_absolute_path(f) for f in data.val_files]
    from hybridflow.data.synthetic_preferences import generate_preferences

    target = Path(to_absolute_path(data.synthetic_dir)) / f"seed{config.trainer.seed}"
    paths = generate_preferences(str(target), seed=config.trainer.seed)
    return [paths["train"]], [to_absolute_path(f) for f in data.val_files] or [paths["val"]]


# -------------------------------------------------------------- the checks
def check_config(config: RMConfig) -> None:
    """Every section's rules and whether the backbone loads; raises :class:`RMConfigError` listing all problems."""
    settle_device(config.trainer)
    problems = config.problems()
    if config.model.path:
        from hybridflow.workers.models import load_model_config

        try:
            load_model_config(config.model.path)
        except (ValueError, OSError) as err:
            problems.append(f"model.path={config.model.path!r}: {err}")
    if problems:
        raise RMConfigError("invalid config:\n  - " + "\n  - ".join(problems))


def override_problems(args: Sequence[str]) -> list[str]:
    """One line per command-line override that names no key of the schema or gives a value of the wrong type
    (Hydra would refuse it too, with a traceback-like page); Hydra's own flags and ``hydra.*`` keys pass."""
    from hybridflow.configs.overrides import schema_override_problems

    return schema_override_problems(
        [a for a in args if not a.startswith("-")], RMConfig, groups={}, key_list="configs/rm_schema.py", foreign=False
    )


# ------------------------------------------------------------------ training
@dataclass
class RMSummary:
    """What a run reached and where it wrote it."""

    steps: int
    val_before: dict[str, float]
    val_after: dict[str, float]
    last_train: dict[str, float]
    wall_time_s: float
    run_dir: Path
    model_dir: Path


def batch_indices(n_pairs: int, batch_size: int, *, shuffle: bool, seed: int) -> Iterator[list[int]]:
    """Batches of pair indices, epoch after epoch; an epoch's order is drawn from ``seed + epoch`` and its last
    partial batch is dropped."""
    epoch = 0
    while True:
        order = np.random.default_rng(seed + epoch).permutation(n_pairs) if shuffle else np.arange(n_pairs)
        for start in range(0, n_pairs - batch_size + 1, batch_size):
            yield order[start : start + batch_size].tolist()
        epoch += 1


def run_steps(config: RMConfig, n_train: int) -> int:
    """Optimizer steps of the run: ``trainer.total_steps``, else ``total_epochs`` passes over the pairs."""
    per_epoch = n_train // config.data.batch_size
    if per_epoch == 0:
        raise RMConfigError(
            f"invalid config:\n  - data.batch_size={config.data.batch_size} is more than the {n_train} training pairs"
        )
    return config.trainer.total_steps or config.trainer.total_epochs * per_epoch


def evaluate(rm: Any, pairs: PairSet, pad_id: int, margin: float) -> dict[str, float]:
    """``val/loss``, ``val/accuracy`` (and ``val/accuracy/<kind>`` per rejected kind) over every pair."""
    import torch

    from hybridflow.losses.bradley_terry import bradley_terry_loss, correct_pairs, pairwise_accuracy
    from hybridflow.workers.reward_model_trainer import CHOSEN_SCORES, REJECTED_SCORES

    scores = rm.compute_scores(pairs.batch(range(len(pairs)), pad_id))
    chosen, rejected = scores.batch[CHOSEN_SCORES], scores.batch[REJECTED_SCORES]
    out = {
        "val/loss": float(bradley_terry_loss(chosen, rejected, margin).mean()),
        "val/accuracy": pairwise_accuracy(chosen, rejected),
    }
    correct = correct_pairs(chosen, rejected)
    for kind in sorted({k for k in pairs.kinds if k is not None}):
        picked = torch.tensor([k == kind for k in pairs.kinds])
        out[f"val/accuracy/{kind}"] = float(correct[picked].float().mean())
    return out


def fit(config: RMConfig, rm: Any, train: PairSet, val: PairSet | None, pad_id: int, run_dir: Path) -> RMSummary:
    """Train for :func:`run_steps` steps, evaluating every ``trainer.eval_freq`` steps and after the last, log each
    step to ``metrics.jsonl``, save the model; returns the summary."""
    from hybridflow.trainer.tracking import METRICS_FILE, JsonlSink

    start, trainer, margin = time.monotonic(), config.trainer, config.loss.margin
    total = run_steps(config, len(train))
    batches = batch_indices(len(train), config.data.batch_size, shuffle=config.data.shuffle, seed=trainer.seed)
    sink, progress = JsonlSink(run_dir / METRICS_FILE), Progress(total)
    val_before = evaluate(rm, val, pad_id, margin) if val is not None else {}
    if val_before:
        sink.log(val_before, 0)
        logger.info("step 0/%d: val/accuracy %.3f", total, val_before["val/accuracy"])
    metrics, val_after = {}, {}
    try:
        for step in range(1, total + 1):
            metrics = rm.train_step(train.batch(next(batches), pad_id))[0]  # every rank returns the same
            due = val is not None and (step == total or (trainer.eval_freq and step % trainer.eval_freq == 0))
            logged = {**metrics, **(evaluate(rm, val, pad_id, margin) if due else {})}
            sink.log(logged, step)
            progress.update(loss=metrics["train/loss"], acc=metrics["train/accuracy"])
            if due:
                val_after = {k: v for k, v in logged.items() if k.startswith("val/")}
                logger.info(
                    "step %d/%d: train/loss %.4f train/accuracy %.3f val/loss %.4f val/accuracy %.3f",
                    step,
                    total,
                    metrics["train/loss"],
                    metrics["train/accuracy"],
                    logged["val/loss"],
                    logged["val/accuracy"],
                )
    finally:
        progress.close()
        sink.close()
    model_dir = Path(run_dir, trainer.output_dir).resolve()
    rm.save_hf_model(str(model_dir))
    return RMSummary(total, val_before, val_after, metrics, time.monotonic() - start, run_dir, model_dir)


def build_and_fit(config: RMConfig, run_dir: Path) -> RMSummary:
    """Read and tokenize the pairs, start Ray and the worker group, train, shut down; returns the summary."""
    from hybridflow.workers.models import load_tokenizer

    train_files, val_files = preference_files(config)
    train_rows = read_preferences("data.train_files", train_files)
    val_rows = read_preferences("data.val_files", val_files) if val_files else None
    run_steps(config, len(train_rows))  # a batch larger than the data is refused before Ray starts
    tokenizer = load_tokenizer(config.model.path)
    train = PairSet.from_rows(train_rows, tokenizer, config.data.max_length)
    val = PairSet.from_rows(val_rows, tokenizer, config.data.max_length) if val_rows else None
    for name, pairs in (("training", train), ("validation", val)):
        if pairs is not None and pairs.truncated:
            logger.warning(
                "%d %s texts were longer than data.max_length=%d and lost their start",
                pairs.truncated,
                name,
                config.data.max_length,
            )
    from hybridflow.core import ColocatedWorkerGroup, RoleSpec
    from hybridflow.workers.reward_model_trainer import RewardModelTrainerWorker

    trainer = config.trainer
    refusal = (
        f"trainer.n_gpus_per_node={trainer.n_gpus_per_node} ranks with trainer.device={trainer.device!r} do not "
        "fit the Ray cluster: lower trainer.n_gpus_per_node, or add a node with room"
    )
    with ray_running(trainer.ray_address), ExitStack() as stack:
        pool = reserve_ranks([trainer.n_gpus_per_node], use_gpu=trainer.device == "cuda", refusal=refusal, name=NAME)
        stack.callback(pool.release)
        options = group_options(config, name=NAME)  # the RL trainer's: its threads and timeouts
        roles = {"rm": RoleSpec(RewardModelTrainerWorker, kwargs={"config": config})}
        group = stack.enter_context(ColocatedWorkerGroup(pool, roles, options))
        group.rm.init_model()
        return fit(config, group.rm, train, val, tokenizer.pad_token_id, run_dir)


# --------------------------------------------------------------- the command
def format_summary(summary: RMSummary) -> str:
    """The lines printed at the end of a run."""

    def accuracy(metrics: dict[str, float]) -> str:
        return f"{metrics['val/accuracy']:.3f}" if "val/accuracy" in metrics else "not run (no validation pairs)"

    rows = [
        ("steps", str(summary.steps)),
        ("val pairwise accuracy before", accuracy(summary.val_before)),
        ("val pairwise accuracy after", accuracy(summary.val_after)),
        ("train loss (last step)", f"{summary.last_train.get('train/loss', math.nan):.4f}"),
        ("wall time", f"{summary.wall_time_s:.1f} s"),
        ("run directory", str(summary.run_dir)),
        ("reward model", str(summary.model_dir)),
    ]
    return summary_table(f"{COMMAND} summary", rows)


def train(cfg: DictConfig) -> float:
    """Check ``cfg``, train, print the summary; returns the final validation accuracy (NaN without validation)."""
    config: RMConfig = OmegaConf.to_object(cfg)
    check_config(config)
    run_dir = Path(HydraConfig.get().runtime.output_dir).resolve()
    logger.info("run directory: %s", run_dir)
    summary = build_and_fit(config, run_dir)
    print(format_summary(summary), flush=True)
    return summary.val_after.get("val/accuracy", math.nan)


@hydra.main(config_path="../configs", config_name="train_rm", version_base=None)
def hydra_main(cfg: DictConfig) -> float:
    """Hydra's task function: a bad config or data file exits 2 with its message (no traceback), Ctrl-C 130,
    a worker's failure 1 (the error names the rank and the call)."""
    return run_command(COMMAND, lambda: train(cfg))


def main() -> None:
    """The ``hybridflow-train-rm`` command: the overrides checked against the schema, then :func:`hydra_main`."""
    refuse_overrides(COMMAND, override_problems(sys.argv[1:]))
    hydra_main()


if __name__ == "__main__":
    main()

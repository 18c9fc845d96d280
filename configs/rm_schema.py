"""The config schema of ``hybridflow-train-rm`` (the Bradley-Terry reward-model trainer): every key, once.

``train_rm.yaml`` beside this module only chooses values; the keys, their
defaults and what they mean are here, as a docstring under each field, as in
``schema.py`` (whose ``optim`` and ``fsdp_config`` sections are reused as they
are). Hydra validates the composed config against these dataclasses (stored in
its ConfigStore as ``rm_trainer_schema``). Each section's ``problems()`` lists
its broken rules, checked before Ray or a model starts; :meth:`RMConfig.problems`
adds the rules that span sections.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

from hybridflow.configs.rules import at_least, one_of, within
from hybridflow.configs.schema import MODEL_DTYPES, FSDPConfig, OptimConfig, TimeoutsConfig
from hybridflow.core.devices import AUTO, DEVICES

SCHEMA_NAME = "rm_trainer_schema"
"""The name the schema is stored under in Hydra's ConfigStore (``train_rm.yaml``'s first default)."""


@dataclass
class RMModelConfig:
    path: str = "builtin:tiny-qwen2"
    """The backbone: a local directory holding an HF causal LM and its tokenizer (a policy), or
    ``builtin:<name>`` (a tiny model built in code, random weights seeded by ``trainer.seed``). The reward
    model is that architecture as a sequence classifier with one output (``AutoModelForSequenceClassification``,
    ``num_labels=1``): its backbone copied from the causal LM, its score head fresh (seeded by ``trainer.seed``).
    Its tokenizer, chat template included, is the one the saved reward model keeps."""
    dtype: str = "float32"
    """The dtype the model computes in (``float32`` or ``bfloat16``); the optimizer updates fp32 master
    weights (``fsdp_config.master_dtype``) through FSDP2 mixed precision, as the actor and critic do."""
    enable_gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass: less memory, one more forward."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP2 settings (``schema.py``'s ``FSDPConfig``). ``param_offload`` and ``optimizer_offload`` must stay
    false: the trainer runs alone on its ranks, with no other role to make room for."""

    def problems(self) -> list[str]:
        """Broken rules of this section; whether ``path`` loads is checked before the run starts."""
        out = one_of(self, "dtype", MODEL_DTYPES)
        if not self.path:
            out.append("path is empty: name a local HF causal LM directory or builtin:tiny-qwen2")
        for name in ("param_offload", "optimizer_offload"):
            if getattr(self.fsdp_config, name):
                out.append(
                    f"fsdp_config.{name}=True: not supported here (the trainer holds its ranks alone, "
                    "there is nothing to offload for); allowed: false"
                )
        return out


@dataclass
class RMDataConfig:
    train_files: list[str] = field(default_factory=list)
    """Training parquet files of preference pairs: columns ``prompt`` (chat messages, or plain text),
    ``chosen`` and ``rejected`` (response texts); ``data_source`` and ``extra_info`` are kept if present.
    Empty: the synthetic preferences on the default task (``data/synthetic_preferences.py``), generated into
    ``synthetic_dir``."""
    val_files: list[str] = field(default_factory=list)
    """Validation parquet files, same columns. Empty with ``train_files`` empty: the synthetic preferences'
    validation split (prompts never trained on); empty with ``train_files`` given: no validation."""
    synthetic_dir: str = "outputs/synthetic_preferences"
    """Where the synthetic preferences are generated (into ``seed<trainer.seed>/`` under it; relative paths are
    resolved against the directory the command was started in)."""
    batch_size: int = 64
    """Preference pairs per optimizer step, over all ranks (each rank holds ``batch_size / ranks``)."""
    micro_batch_size_per_gpu: int = 32
    """Pairs per forward-backward on one rank (both responses of a pair go in the same forward); gradients
    accumulate over a rank's micro-batches, so this bounds memory, not the update."""
    max_length: int = 64
    """Tokens per text (prompt, response and EOS); longer ones are cut from the left, so the response and
    the EOS the score is read at are kept, and counted."""
    shuffle: bool = True
    """Shuffle the training pairs each epoch (seeded by ``trainer.seed``)."""

    def problems(self) -> list[str]:
        """Broken rules of this section; the split over ranks is checked by :meth:`RMConfig.problems`."""
        return at_least(self, 1, "batch_size", "micro_batch_size_per_gpu") + at_least(self, 2, "max_length")


@dataclass
class RMTrainerConfig:
    total_epochs: int = 1
    """Passes over the training pairs (the last partial batch of an epoch is dropped)."""
    total_steps: Optional[int] = None
    """Stop after this many optimizer steps (None: run ``total_epochs``); it may run past one epoch."""
    n_gpus_per_node: int = 1
    """Ranks (data-parallel, FSDP2): GPUs, or CPU processes with ``device=cpu``."""
    device: str = AUTO
    """``cpu`` (gloo), ``cuda`` (nccl), or ``auto``: ``cuda`` when torch sees a GPU here, else ``cpu`` (the RL
    trainer's rule, ``core/devices.py``)."""
    cpu_threads_per_rank: int = 2
    """torch threads of each rank with ``device=cpu``; the default suits one rank on a 2-core machine (with
    2 ranks there, use 1)."""
    cpu_mmap_threshold_mb: Optional[float] = 4.0
    """With ``device=cpu``, host blocks of at least this many MiB (0-32) are returned to the system when freed;
    null: glibc's own threshold (the RL trainer's ``trainer.cpu_mmap_threshold_mb``)."""
    seed: int = 0
    """Seed of the backbone (built-in models), the score head, the synthetic preferences and the data order."""
    eval_freq: int = 50
    """Evaluate on the validation pairs every this many steps, and after the last; 0: after the last only."""
    output_dir: str = "reward_model"
    """Where the trained reward model is saved as an HF directory (``save_pretrained``: weights, a config with
    ``num_labels=1`` and ``pad_token_id``, the tokenizer); relative paths are inside the run directory."""
    ray_address: Optional[str] = None
    """Join this Ray cluster (``auto``, ``host:port``, ``ray://...``). None: ``RAY_ADDRESS`` if set, else a fresh
    local instance of this run's own."""
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)
    """How long the driver waits on the ranks: the RL trainer's ``trainer.timeouts``, the same keys and bounds
    (collectives, calls, the heartbeat that names a stopped rank); the weight-sync keys have nothing to bound here."""

    def problems(self) -> list[str]:
        """Broken rules of this section."""
        return (
            at_least(self, 1, "total_epochs", "n_gpus_per_node", "cpu_threads_per_rank")
            + (
                []
                if self.cpu_mmap_threshold_mb is None
                else within(self, "cpu_mmap_threshold_mb", 0, 32, low_open=True)
            )
            + at_least(self, 1, "total_steps", optional=True)
            + at_least(self, 0, "eval_freq")
            + one_of(self, "device", (AUTO, *DEVICES))
            + ([] if self.output_dir else ["output_dir is empty: name a directory (relative: in the run dir)"])
        )


@dataclass
class RMLossConfig:
    margin: float = 0.0
    """The Bradley-Terry margin m in ``-log sigmoid(r_chosen - r_rejected - m)`` (``losses/bradley_terry.py``):
    0 is the plain likelihood; m > 0 keeps pushing until the chosen score leads by more than m."""

    def problems(self) -> list[str]:
        """Broken rules of this section."""
        return at_least(self, 0, "margin")


@dataclass
class RMConfig:
    model: RMModelConfig = field(default_factory=RMModelConfig)
    """The backbone and how it is sharded."""
    data: RMDataConfig = field(default_factory=RMDataConfig)
    """Preference pairs, batch sizes and lengths."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """AdamW and its warm-up (``schema.py``'s ``OptimConfig``): ``lr``, ``weight_decay``, ``betas``,
    ``warmup_steps``, ``grad_clip``, ``implementation``."""
    loss: RMLossConfig = field(default_factory=RMLossConfig)
    """The pairwise loss."""
    trainer: RMTrainerConfig = field(default_factory=RMTrainerConfig)
    """Ranks, schedule, evaluation and where the model goes."""

    def problems(self) -> list[str]:
        """Every section's broken rules, each prefixed with its key's section, and the rules that span sections."""
        out = list(_section_problems(self))
        data, ranks = self.data, self.trainer.n_gpus_per_node
        if isinstance(data.batch_size, int) and isinstance(ranks, int) and ranks >= 1 and data.batch_size % ranks:
            out.append(
                f"data.batch_size={data.batch_size} must be divisible by trainer.n_gpus_per_node={ranks} "
                "(every rank holds the same number of pairs)"
            )
        return out


def _section_problems(node: Any, prefix: str = "") -> list[str]:
    """The ``problems()`` of every section below ``node`` (not its own), prefixed with their dotted paths."""
    out = []
    for f in fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if is_dataclass(value):
            out += [f"{key}.{message}" for message in value.problems()] if hasattr(value, "problems") else []
            out += _section_problems(value, f"{key}.")
    return out


def register_rm_configs() -> None:
    """Store the schema in Hydra's ConfigStore as :data:`SCHEMA_NAME`."""
    ConfigStore.instance().store(name=SCHEMA_NAME, node=RMConfig)

"""``hybridflow export``: a checkpoint's policy as a transformers model directory, offline.

The actor's shards of ``.../global_step_<N>`` are read in this process alone
(no Ray, no process group, whatever number of ranks saved them) into full
tensors; the model is built from the HF config the checkpoint holds
(``actor/huggingface/``, with the generation config and tokenizer), the weights
are loaded into it (a tied output projection follows the input embedding) and
``save_pretrained`` writes it with its tokenizer. The result loads with
``AutoModelForCausalLM.from_pretrained(out_dir)``.

Checkpoints written before ``actor/huggingface/`` existed are exported from
the run's resolved config instead (``.hydra/config.yaml`` in a folder above
the checkpoint): its ``actor_rollout_ref.model.path`` names the model (a
local directory or ``builtin:<name>``) whose config and tokenizer the run
started from.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from omegaconf import OmegaConf
from transformers import AutoConfig, AutoTokenizer, GenerationConfig, PretrainedConfig

from hybridflow.core.storage import is_url
from hybridflow.trainer import checkpoint as ckpt
from hybridflow.workers import lora
from hybridflow.workers.checkpointing import HF_FILES, model_from_full_state, read_model_state
from hybridflow.workers.models import load_model_config, load_tokenizer

logger = logging.getLogger(__name__)

ROLE = "actor"
"""The checkpoint part that holds the policy."""


class ExportError(Exception):
    """The checkpoint cannot be exported; the message says why."""


def export_checkpoint(checkpoint: str | Path, out_dir: str | Path, *, adapter: bool = False) -> Path:
    """Write the policy of ``checkpoint`` (a ``global_step_<N>`` directory) as an HF model directory ``out_dir``.

    A LoRA run's policy is written merged (``W + s * B @ A``: an ordinary model), or with ``adapter`` as a
    peft adapter directory (for ``PeftModel.from_pretrained`` on the base model the run started from).

    :returns: ``out_dir``.
    :raises ExportError: when ``checkpoint`` is not a published checkpoint, has no actor shards, or (for an
        old checkpoint) no run config says which model it trained; with ``adapter``, when it holds no adapter.
    """
    if is_url(checkpoint):
        raise ExportError(f"{checkpoint}: export reads local checkpoints only for now; copy it to a local directory")
    checkpoint, out_dir = Path(checkpoint), Path(out_dir)
    if not ckpt.is_checkpoint(checkpoint):
        raise ExportError(
            f"{checkpoint} is not a checkpoint (expected a .../global_step_<N> directory holding {ckpt.DRIVER_STATE})"
        )
    try:
        state = read_model_state(checkpoint, ROLE)
    except FileNotFoundError as err:
        raise ExportError(str(err)) from err
    adapter_config = _adapter_config(checkpoint) if any(map(lora.is_adapter_parameter, state)) else None
    if adapter:
        if adapter_config is None:
            raise ExportError(
                f"{checkpoint} holds no LoRA adapter (its run had actor_rollout_ref.model.lora_rank=0); "
                "export it without --adapter"
            )
        lora.save_adapter(out_dir, state, adapter_config, base_model=adapter_config.get("base_model_name_or_path"))
        logger.info("exported the adapter of %s to %s", checkpoint, out_dir)
        return out_dir
    if adapter_config is not None:
        state = lora.merge_state(state, adapter_config)
    config, generation_config, tokenizer = model_files(checkpoint)
    model = model_from_full_state(config, state, generation_config)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    logger.info("exported %s (%d tensors) to %s", checkpoint, len(state), out_dir)
    return out_dir


def _adapter_config(checkpoint: Path) -> dict:
    """The LoRA config a LoRA run's checkpoint holds (``actor/huggingface/adapter_config.json``)."""
    path = checkpoint / ROLE / HF_FILES / lora.ADAPTER_CONFIG
    if not path.is_file():
        raise ExportError(
            f"{checkpoint} holds LoRA adapters but no {ROLE}/{HF_FILES}/{lora.ADAPTER_CONFIG} to say their scale"
        )
    return json.loads(path.read_text())


def model_files(checkpoint: Path) -> tuple[PretrainedConfig, GenerationConfig, object]:
    """(HF config, generation config, tokenizer) of the checkpoint's policy: from ``actor/huggingface``,
    else from the model the run's ``.hydra/config.yaml`` names."""
    saved = checkpoint / ROLE / HF_FILES
    if saved.is_dir():
        return (
            AutoConfig.from_pretrained(saved),
            GenerationConfig.from_pretrained(saved),
            AutoTokenizer.from_pretrained(saved),
        )
    path = run_model_path(checkpoint)
    config, tokenizer = load_model_config(path), load_tokenizer(path)
    generation_config = GenerationConfig.from_model_config(config)
    generation_config.pad_token_id = tokenizer.pad_token_id  # as the actor's model had it
    return config, generation_config, tokenizer


def run_model_path(checkpoint: Path) -> str:
    """``actor_rollout_ref.model.path`` of the run that wrote ``checkpoint`` (its nearest ``.hydra/config.yaml``)."""
    for folder in checkpoint.resolve().parents:
        resolved = folder / ".hydra" / "config.yaml"
        if resolved.is_file():
            path = OmegaConf.load(resolved).actor_rollout_ref.model.path
            if not path:
                raise ExportError(f"{resolved} names no model (actor_rollout_ref.model.path is empty)")
            return str(path)
    raise ExportError(
        f"{checkpoint} has no {ROLE}/{HF_FILES}/ (written before checkpoints held the model's config) "
        "and no folder above it holds the run's .hydra/config.yaml to name the model"
    )

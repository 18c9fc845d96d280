"""The memory check ``hybridflow-train`` runs before Ray starts (``trainer.memory_check``): the plan of
``trainer/memory_plan.py`` against the memory a rank has; a run that will not fit is refused (or warned about) in
a few lines naming the stage, by how much, and the keys that would make it fit, each with its predicted effect."""

from __future__ import annotations

import copy
import logging
from typing import Any

from hybridflow.trainer.config_checks import ConfigError, settle_device
from hybridflow.trainer.memory_plan import GIB, MemoryPlan, plan_memory

__all__ = ["check_memory", "largest_parts", "refusal", "remedies"]

logger = logging.getLogger(__name__)


def check_memory(config: Any) -> MemoryPlan | None:
    """Plan ``config``'s memory (a checked config, device settled) and act on ``trainer.memory_check``: ``refuse``
    raises :class:`ConfigError` when a stage will not fit, ``warn`` logs it, ``off`` plans nothing. Returns the
    plan (None when off)."""
    if config.trainer.memory_check == "off":
        return None
    settle_device(config.trainer)  # the plan is the device's
    plan = plan_memory(config)
    largest = plan.largest()
    if plan.fits is None:
        logger.info(
            "memory plan: largest stage %s %.2f GiB per rank; no limit to check (%s)",
            largest.stage,
            largest.peak_gb,
            plan.limit_source,
        )
    elif not plan.fits:
        message = refusal(config, plan)
        if config.trainer.memory_check == "refuse":
            raise ConfigError(message)
        logger.warning(message)
    else:
        logger.info(
            "memory plan: largest stage %s %.2f GiB per rank of %.2f GiB (%s)",
            largest.stage,
            largest.peak_gb,
            plan.limit_gb,
            plan.limit_source,
        )
    return plan


REMEDIES: tuple[tuple[str, Any, Any], ...] = (
    # (key, the value to try (a function of the current one), when it applies)
    ("actor_rollout_ref.model.enable_gradient_checkpointing", lambda v: True, lambda v: not v),
    ("actor_rollout_ref.actor.fsdp_config.accumulate_unsharded_grads", lambda v: False, lambda v: v),
    ("actor_rollout_ref.actor.fsdp_config.reshard_after_forward", lambda v: True, lambda v: not v),
    ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", lambda v: max(1, v // 2), lambda v: v > 1),
    ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", lambda v: max(1, v // 2), lambda v: v > 1),
    ("actor_rollout_ref.rollout.offload_weights", lambda v: True, lambda v: not v),
    ("actor_rollout_ref.rollout.max_num_seqs", lambda v: 32, lambda v: v is None or v > 32),
    ("actor_rollout_ref.actor.fsdp_config.param_offload", lambda v: True, lambda v: not v),
    ("actor_rollout_ref.actor.fsdp_config.optimizer_offload", lambda v: True, lambda v: not v),
    ("actor_rollout_ref.model.lora_rank", lambda v: 16, lambda v: v == 0),
    ("trainer.nnodes", lambda v: 2 * v, lambda v: True),
)
"""The keys a refusal tries, each alone, in this order: the plan of the config with it changed says its effect."""


def _get(config: Any, key: str) -> Any:
    node = config
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _set(config: Any, key: str, value: Any) -> None:
    *path, last = key.split(".")
    node = config
    for part in path:
        node = getattr(node, part)
    setattr(node, last, value)


def remedies(config: Any, plan: MemoryPlan) -> list[tuple[str, float]]:
    """``key=value`` changes that lower the largest stage's peak, each with the largest peak (GiB) it leaves:
    the plan made again with that one key changed. Offload is tried on a GPU only (on a CPU the host memory is the
    same memory)."""
    worst = plan.largest().peak_gb
    out = []
    for key, change, applies in REMEDIES:
        current = _get(config, key)
        if not applies(current) or ("offload" in key and "fsdp" in key and config.trainer.device != "cuda"):
            continue
        changed = copy.deepcopy(config)
        _set(changed, key, change(current))
        peak = plan_memory(changed).largest().peak_gb
        if peak < worst - 0.005:
            out.append((f"{key}={str(change(current)).lower()}", peak))
    return out


def refusal(config: Any, plan: MemoryPlan) -> str:
    """A few lines: each stage over the limit and by how much, then the keys that would lower it."""
    lines = [
        f"{s.stage} ({s.ranks} rank) needs {s.peak_gb:.2f} GiB, {s.peak_gb - plan.limit_gb:.2f} GiB over "
        f"{plan.limit_gb:.2f} GiB ({plan.limit_source}); its largest parts: {largest_parts(s.parts, 3)}"
        for s in plan.stages.values()
        if s.peak_gb > plan.limit_gb
    ]
    options = remedies(config, plan)
    if options:
        said = ", ".join(f"{k} ({p:.2f} GiB{', fits' if p <= plan.limit_gb else ''})" for k, p in options)
        lines.append(f"each of these lowers the largest stage's peak to: {said}")
    lines.append("trainer.memory_check=warn runs it anyway; hybridflow plan <overrides> shows the whole plan")
    return "memory plan: the run will not fit:\n  - " + "\n  - ".join(lines)


def largest_parts(parts: dict[str, float], most: int) -> str:
    largest = sorted(((v, k) for k, v in parts.items() if v), reverse=True)[:most]
    return ", ".join(f"{k} {v / GIB:.2f}" for v, k in largest)

"""Check a composed config before anything starts (no Ray, no model load).

Every problem names the key, the value and what is allowed; all problems are
reported at once, so a user fixes a config in one pass.
"""

from __future__ import annotations

import os
from typing import Any

from hybridflow.losses import KL_PENALTIES, LOSS_AGG_MODES
from hybridflow.plugins import UnknownNameError, get_estimator, get_policy_loss
from hybridflow.trainer.tracking import SINKS

ROLLOUT_ENGINES = ("builtin", "vllm")
DEVICES = ("cpu", "cuda")
RESUME_MODES = ("auto", "disable")
MODEL_DTYPES = ("float32", "bfloat16")  # workers.models.DTYPES; not imported here to keep checks free of transformers


class ConfigError(ValueError):
    """One or more invalid settings; the message lists each with its key."""


def _check_divides(problems: list[str], key: str, value: int, divisor: int, why: str) -> None:
    if divisor <= 0 or value % divisor:
        problems.append(f"{key}={value} must be a multiple of {divisor} ({why})")


def _vllm_problems(arr: Any, trainer: Any) -> list[str]:
    """What stops ``rollout.name=vllm``: a builtin model, a bad memory fraction, and, when the workers run
    on this machine (no Ray address), vLLM or CUDA missing here."""
    problems = []
    if str(arr.model.path).startswith("builtin:"):
        problems.append(
            f"actor_rollout_ref.model.path={arr.model.path!r}: vLLM loads a local HF model directory, not builtin:<name>"
        )
    if not 0.0 < arr.rollout.gpu_memory_utilization <= 1.0:
        problems.append(f"actor_rollout_ref.rollout.gpu_memory_utilization={arr.rollout.gpu_memory_utilization} must be in (0, 1]")
    if not (trainer.ray_address or os.environ.get("RAY_ADDRESS")):
        # Imported here: it loads torch and transformers, which only a vllm run needs.
        from hybridflow.workers.rollout.vllm_engine import vllm_unavailable_reasons

        problems.extend(f"actor_rollout_ref.rollout.name='vllm': {reason}" for reason in vllm_unavailable_reasons())
    return problems


def _check_tensor_parallel(problems: list[str], cfg: Any, world: int) -> None:
    """Training (p) and rollout (q) tensor-parallel sizes tile the ranks, split the model, and leave whole batches per dp rank."""
    arr, data = cfg.actor_rollout_ref, cfg.data
    actor, rollout = arr.actor, arr.rollout
    sizes = {"actor_rollout_ref.actor.tensor_model_parallel_size": actor.tensor_model_parallel_size,
             "actor_rollout_ref.rollout.tensor_model_parallel_size": rollout.tensor_model_parallel_size}
    for key, size in sizes.items():
        if size < 1:
            problems.append(f"{key}={size} must be >= 1")
            return
        _check_divides(problems, "trainer.nnodes x trainer.n_gpus_per_node", world, size,
                       f"{key.split('.')[1]} tensor-parallel groups of {size} consecutive ranks tile the ranks")
    train_dp = max(world // actor.tensor_model_parallel_size, 1)
    rollout_dp = max(world // rollout.tensor_model_parallel_size, 1)
    _check_divides(problems, "actor_rollout_ref.actor.ppo_mini_batch_size x rollout.n",
                   actor.ppo_mini_batch_size * rollout.n, train_dp,
                   f"each mini-batch's rows are split evenly over the {train_dp} training data-parallel ranks")
    _check_divides(problems, "data.train_batch_size", data.train_batch_size, rollout_dp,
                   f"each step's prompts are split evenly over the {rollout_dp} rollout data-parallel ranks")
    if rollout.name == "builtin" and max(sizes.values()) > 1 and (str(arr.model.path).startswith("builtin:")
                                                                   or os.path.isdir(str(arr.model.path))):
        from hybridflow.workers.models import load_model_config  # transformers: only when tp asks for the model's shape
        from hybridflow.workers.rollout.tp_plan import check_tp_size

        model_config = load_model_config(str(arr.model.path))
        for key, size in sizes.items():
            try:
                check_tp_size(model_config, size)
            except ValueError as err:
                problems.append(f"{key}={size}: {err}")


def check_config(cfg: Any) -> None:
    """Raise :class:`ConfigError` listing every invalid setting of ``cfg`` (a PPOConfig-shaped tree)."""
    problems: list[str] = []
    algo, arr, trainer, data = cfg.algorithm, cfg.actor_rollout_ref, cfg.trainer, cfg.data
    actor, rollout = arr.actor, arr.rollout
    world = trainer.nnodes * trainer.n_gpus_per_node

    estimator = None
    try:
        estimator = get_estimator(algo.adv_estimator)
    except UnknownNameError as err:
        problems.append(f"algorithm.adv_estimator: {err}")
    try:
        get_policy_loss(actor.policy_loss)
    except UnknownNameError as err:
        problems.append(f"actor_rollout_ref.actor.policy_loss: {err}")
    if estimator is not None:
        unknown = set(algo.estimator_options) - set(estimator.options)
        if unknown:
            problems.append(
                f"algorithm.estimator_options has {sorted(unknown)}; estimator {algo.adv_estimator!r} takes {estimator.options}"
            )
        if estimator.needs_groups and rollout.n < 2:
            problems.append(
                f"actor_rollout_ref.rollout.n={rollout.n}: estimator {algo.adv_estimator!r} compares the responses "
                "of one prompt and needs n >= 2"
            )
        if estimator.needs_critic and cfg.critic.enable is False:
            problems.append(f"critic.enable=False but estimator {algo.adv_estimator!r} needs a critic (set it to null or true)")

    if not str(arr.model.path).startswith("builtin:") and not os.path.isdir(str(arr.model.path)):
        problems.append(
            f"actor_rollout_ref.model.path={arr.model.path!r} is not a directory; give a local HF model directory "
            "or builtin:<name>"
        )
    if arr.model.dtype not in MODEL_DTYPES:
        problems.append(f"actor_rollout_ref.model.dtype={arr.model.dtype!r}; allowed: {', '.join(MODEL_DTYPES)}")
    if actor.loss_agg_mode is not None and actor.loss_agg_mode not in LOSS_AGG_MODES:
        problems.append(f"actor_rollout_ref.actor.loss_agg_mode={actor.loss_agg_mode!r}; allowed: {', '.join(LOSS_AGG_MODES)}, or null")
    for key, value in (("actor_rollout_ref.actor.kl_loss_type", actor.kl_loss_type), ("algorithm.kl_penalty", algo.kl_penalty)):
        if value not in KL_PENALTIES:
            problems.append(f"{key}={value!r}; allowed: {', '.join(KL_PENALTIES)}")
    if rollout.name not in ROLLOUT_ENGINES:
        problems.append(f"actor_rollout_ref.rollout.name={rollout.name!r}; allowed: {', '.join(ROLLOUT_ENGINES)}")
    unknown_loggers = [name for name in trainer.logger if name not in SINKS]
    if unknown_loggers:
        problems.append(f"trainer.logger has {unknown_loggers}; allowed: {', '.join(SINKS)}")
    if algo.kl_ctrl.type not in ("fixed", "adaptive"):
        problems.append(f"algorithm.kl_ctrl.type={algo.kl_ctrl.type!r}; allowed: fixed, adaptive")
    if trainer.device not in DEVICES:
        problems.append(f"trainer.device={trainer.device!r}; allowed: {', '.join(DEVICES)}")
    if rollout.name == "vllm" and trainer.device != "cuda":
        problems.append("actor_rollout_ref.rollout.name='vllm' needs trainer.device='cuda'; on CPU use the builtin engine")
    if rollout.name == "vllm":
        problems.extend(_vllm_problems(arr, trainer))
    if str(trainer.resume_mode) not in RESUME_MODES and not os.path.isdir(str(trainer.resume_mode)):
        problems.append(f"trainer.resume_mode={trainer.resume_mode!r}; allowed: auto, disable, or an existing checkpoint directory")

    if world < 1:
        problems.append(f"trainer.nnodes x trainer.n_gpus_per_node = {world}; need at least one rank")
    else:
        _check_divides(problems, "data.train_batch_size", data.train_batch_size, actor.ppo_mini_batch_size,
                       "each step is split into whole mini-batches of actor.ppo_mini_batch_size prompts")
        _check_tensor_parallel(problems, cfg, world)
    for key, value in (
        ("actor_rollout_ref.rollout.n", rollout.n),
        ("actor_rollout_ref.rollout.response_length", rollout.response_length),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", actor.ppo_micro_batch_size_per_gpu),
        ("actor_rollout_ref.actor.ppo_epochs", actor.ppo_epochs),
        ("data.max_prompt_length", data.max_prompt_length),
    ):
        if value < 1:
            problems.append(f"{key}={value} must be >= 1")
    if not 0.0 < rollout.top_p <= 1.0:
        problems.append(f"actor_rollout_ref.rollout.top_p={rollout.top_p} must be in (0, 1]")
    if rollout.temperature <= 0:
        problems.append(f"actor_rollout_ref.rollout.temperature={rollout.temperature} must be > 0 (validation decodes greedily)")
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))

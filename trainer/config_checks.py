"""Check a composed config before anything starts (no Ray, no model load).

Every problem names the key, the value and what is allowed; all problems are
reported at once, so a user fixes a config in one pass. Where the rules live:

* a section's own fields: its dataclass's ``problems()`` in ``configs/schema.py``;
* sizes that must divide over the ranks: :class:`hybridflow.core.parallel_dims.ParallelDims`;
* here: rules that span sections, ask the plugin manager (estimator, loss,
  verifier names), or look at the machine (paths, checkpoints, GPUs).

:func:`check_datasets` runs once the prompts are loaded (still before Ray):
a train batch larger than the training set is an error there.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from hybridflow.core.parallel_dims import ParallelDims
from hybridflow.losses import KL_PENALTIES, LOSS_AGG_MODES
from hybridflow.plugins import UnknownNameError, get_agent_loop, get_estimator, get_policy_loss, get_reward_verifier, get_tool
from hybridflow.trainer.batch_hooks import hook_problems
from hybridflow.trainer.estimator_inputs import input_problems
from hybridflow.trainer.tracking import SINKS


class ConfigError(ValueError):
    """One or more invalid settings; the message lists each with its key."""


def section_problems(node: Any, prefix: str = "") -> Iterator[str]:
    """Every section's own ``problems()``, each message prefixed with the section's dotted path."""
    if hasattr(node, "problems"):
        yield from (f"{prefix}.{message}" if prefix else message for message in node.problems())
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            yield from section_problems(value, f"{prefix}.{f.name}" if prefix else f.name)


def _plugin_problems(cfg: Any) -> Iterator[str]:
    """Names the plugin manager must know, and what the estimator asks of the rest of the config."""
    algo, actor, rollout = cfg.algorithm, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    yield from hook_problems(list(algo.batch_hooks), dict(algo.batch_hook_options))
    try:
        get_policy_loss(actor.policy_loss)
    except UnknownNameError as err:
        yield f"actor_rollout_ref.actor.policy_loss: {err}"
    try:
        estimator = get_estimator(algo.adv_estimator)
    except UnknownNameError as err:
        yield f"algorithm.adv_estimator: {err}"
        return
    unknown = set(algo.estimator_options) - set(estimator.options)
    if unknown:
        yield f"algorithm.estimator_options has {sorted(unknown)}; estimator {algo.adv_estimator!r} takes {estimator.options}"
    if estimator.needs_groups and rollout.n < 2:
        yield (f"actor_rollout_ref.rollout.n={rollout.n}: estimator {algo.adv_estimator!r} compares the responses "
               "of one prompt and needs n >= 2")
    if estimator.needs_critic and cfg.critic.enable is False:
        yield f"critic.enable=False but estimator {algo.adv_estimator!r} needs a critic (set it to null or true)"
    yield from input_problems(estimator, cfg)
    yield from _agent_problems(rollout)


def _agent_problems(rollout: Any) -> Iterator[str]:
    """The agent loop and its tools are installed; its options are its own."""
    key = "actor_rollout_ref.rollout"
    for name in rollout.agent.tools:
        try:
            get_tool(name)
        except UnknownNameError as err:
            yield f"{key}.agent.tools: {err}"
    try:
        loop = get_agent_loop(rollout.agent_loop)
    except UnknownNameError as err:
        yield f"{key}.agent_loop: {err}"
        return
    unknown = set(rollout.agent.options) - set(loop.options)
    if unknown:
        yield f"{key}.agent.options has {sorted(unknown)}; agent loop {rollout.agent_loop!r} takes {loop.options}"
    if loop.single_generate and rollout.mode == "server":
        yield (f"{key}.mode=server serves agent loops, but {rollout.agent_loop!r} is one generation per prompt "
               "(set rollout.agent_loop to a multi-turn loop, or mode=direct)")


def _reward_problems(reward: Any, response_length: int) -> Iterator[str]:
    """Routes that parse and name installed verifiers; an overlong zone that fits in the response."""
    from hybridflow.rewards.routing import Router

    try:
        Router(reward.route, dataclasses.asdict(reward.custom_reward_function), reward.verifier_kwargs)
    except (TypeError, ValueError) as err:
        yield f"reward.route: {err}"
        return
    named = {f"reward.route[{key!r}]": target for key, target in reward.route.items()}
    named.update({f"reward.verifier_kwargs[{name!r}]": name for name in reward.verifier_kwargs})
    for key, target in named.items():
        for name in [target] if isinstance(target, str) else list(target):
            try:
                get_reward_verifier(name)
            except UnknownNameError as err:
                yield f"{key}: {err}"
    buffer = reward.overlong_buffer
    if buffer.enable and buffer.len >= response_length:
        yield (f"reward.overlong_buffer.len={buffer.len} must be < actor_rollout_ref.rollout.response_length="
               f"{response_length} (the penalty zone sits inside the response budget)")


def _resume_problems(trainer: Any) -> Iterator[str]:
    from hybridflow.trainer.checkpoint import is_checkpoint

    mode = str(trainer.resume_mode)
    if mode in ("auto", "disable"):
        return
    if not os.path.isdir(mode):
        yield f"trainer.resume_mode={mode!r}; allowed: auto, disable, or an existing checkpoint directory"
    elif not is_checkpoint(mode):
        yield (f"trainer.resume_mode={mode!r} is a directory but not a checkpoint (expected .../global_step_<N> "
               "holding driver.json); allowed: auto, disable, or such a directory")


def _device_problems(trainer: Any, rollout: Any, model: Any) -> Iterator[str]:
    """GPUs asked for where the workers run on this machine; engines and devices that go together."""
    if trainer.device == "cuda" and not (trainer.ray_address or os.environ.get("RAY_ADDRESS")):
        import torch

        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if found < trainer.n_gpus_per_node:
            yield (f"trainer.device='cuda' with trainer.n_gpus_per_node={trainer.n_gpus_per_node}, but this machine has "
                   f"{found} GPU(s); use trainer=cpu (trainer.device=cpu), or a smaller trainer.n_gpus_per_node")
    if rollout.name == "vllm":
        yield from _vllm_problems(model, trainer)


def _vllm_problems(model: Any, trainer: Any) -> list[str]:
    """What stops ``rollout.name=vllm`` with ``trainer.device``: when the workers run on this machine (no Ray
    address), a vLLM build that cannot drive that device, a version the adapter does not support, a broken
    torchvision beside the CPU build; anywhere, a model whose heads the CPU build's attention cannot run."""
    from hybridflow.workers.rollout import vllm_build  # package metadata only: vLLM is not imported

    key = "actor_rollout_ref.rollout.name='vllm'"
    problems = []
    if not (trainer.ray_address or os.environ.get("RAY_ADDRESS")):
        problems.extend(f"{key}: {reason}" for reason in vllm_build.unavailable_reasons(trainer.device))
        if not problems and trainer.device == "cpu":
            broken = vllm_build.torchvision_problem()
            if broken:
                problems.append(f"{key}: {broken}")
    path = str(model.path or "")
    if path and (path.startswith("builtin:") or os.path.isdir(path)):
        from hybridflow.workers.models import load_model_config  # transformers: only for a vllm run

        try:
            head = vllm_build.head_size_problem(load_model_config(path), trainer.device)
        except (ValueError, OSError):
            head = None  # an unknown builtin or an unreadable config is _model_problems' to report
        if head:
            problems.append(f"actor_rollout_ref.model.path={path!r} with {key} and trainer.device={trainer.device!r}: {head}")
    return problems


def _model_problems(cfg: Any) -> Iterator[str]:
    """The model path exists; tensor-parallel sizes split the model's heads (reads only its config)."""
    arr = cfg.actor_rollout_ref
    if not arr.model.path:
        return  # ModelConfig.problems says so
    path = str(arr.model.path)
    if not path.startswith("builtin:") and not os.path.isdir(path):
        yield f"actor_rollout_ref.model.path={path!r} is not a directory; give a local HF model directory or builtin:<name>"
        return
    sizes = {"actor_rollout_ref.actor.tensor_model_parallel_size": arr.actor.tensor_model_parallel_size,
             "actor_rollout_ref.rollout.tensor_model_parallel_size": arr.rollout.tensor_model_parallel_size}
    if arr.rollout.name != "builtin" or max(sizes.values()) <= 1:
        return
    from hybridflow.workers.models import load_model_config  # transformers: only when tp asks for the model's shape
    from hybridflow.workers.rollout.tp_plan import check_tp_size

    model_config = load_model_config(path)
    for key, size in sizes.items():
        try:
            check_tp_size(model_config, size)
        except ValueError as err:
            yield f"{key}={size}: {err}"


def _placement_problems(cfg: Any) -> Iterator[str]:
    """The pipelined rollout modes need the rollout on ranks of its own, and what split placement supports."""
    trainer, rollout = cfg.trainer, cfg.actor_rollout_ref.rollout
    if trainer.rollout_mode != "sync" and trainer.placement != "split":
        yield (f"trainer.rollout_mode={trainer.rollout_mode!r} overlaps generation with training and needs the rollout "
               "on ranks of its own: set trainer.placement=split (and trainer.rollout_ranks), or trainer.rollout_mode=sync")
    if trainer.placement != "split":
        return
    if trainer.rollout_mode != "sync" and not _single_generate(rollout.agent_loop):
        yield (f"trainer.rollout_mode={trainer.rollout_mode!r} streams single generations; the agent loop "
               f"{rollout.agent_loop!r} runs with trainer.rollout_mode=sync")
    if trainer.nnodes > 1:
        yield "trainer.placement=split runs on one node for now; set trainer.nnodes=1"


def _vllm_server_problems(cfg: Any) -> Iterator[str]:
    """vLLM in server mode: a ``vllm serve`` process is the rollout, and the agent loops are its clients."""
    trainer, rollout = cfg.trainer, cfg.actor_rollout_ref.rollout
    if rollout.name != "vllm" or rollout.mode != "server":
        return
    if _single_generate(rollout.agent_loop):
        yield (f"actor_rollout_ref.rollout.mode='server' with vLLM serves multi-turn agent loops; the agent loop "
               f"{rollout.agent_loop!r} generates in one batched call: set actor_rollout_ref.rollout.agent_loop="
               "tool_calling (experiment=tool_use), or actor_rollout_ref.rollout.mode=direct")
    if trainer.placement != "colocated" or trainer.rollout_mode != "sync":
        yield (f"actor_rollout_ref.rollout.mode='server' with vLLM runs the rollout in its own vllm serve process "
               f"beside the training ranks: trainer.placement={trainer.placement!r} and trainer.rollout_mode="
               f"{trainer.rollout_mode!r} must be colocated and sync")


def _single_generate(loop: str) -> bool:
    try:
        return get_agent_loop(loop).single_generate
    except UnknownNameError:
        return True  # _agent_problems names it


def _name_problems(cfg: Any) -> Iterator[str]:
    actor, trainer = cfg.actor_rollout_ref.actor, cfg.trainer
    if actor.loss_agg_mode is not None and actor.loss_agg_mode not in LOSS_AGG_MODES:
        yield f"actor_rollout_ref.actor.loss_agg_mode={actor.loss_agg_mode!r}; allowed: {', '.join(LOSS_AGG_MODES)}, or null"
    for key, value in (("actor_rollout_ref.actor.kl_loss_type", actor.kl_loss_type), ("algorithm.kl_penalty", cfg.algorithm.kl_penalty)):
        if value not in KL_PENALTIES:
            yield f"{key}={value!r}; allowed: {', '.join(KL_PENALTIES)}"
    unknown_loggers = [name for name in trainer.logger if name not in SINKS]
    if unknown_loggers:
        yield f"trainer.logger has {unknown_loggers}; allowed: {', '.join(SINKS)}"


def config_problems(cfg: Any) -> list[str]:
    """Every invalid setting of ``cfg`` (a PPOConfig or its DictConfig), one message each."""
    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_object(cfg)
    from hybridflow.trainer.ppo_trainer import needs_critic  # the trainer decides which roles exist

    problems = list(section_problems(cfg))
    problems += _plugin_problems(cfg)
    problems += _name_problems(cfg)
    problems += _placement_problems(cfg)
    problems += _vllm_server_problems(cfg)
    use_critic = not any(p.startswith("algorithm.adv_estimator:") for p in problems) and needs_critic(cfg)
    dims = ParallelDims.from_config(cfg, use_critic=use_critic)
    problems += dims.problems()
    problems += _reward_problems(cfg.reward, cfg.actor_rollout_ref.rollout.response_length)
    problems += _resume_problems(cfg.trainer)
    problems += _device_problems(cfg.trainer, cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.model)
    if not any(p.startswith("trainer.nnodes") or "tensor_model_parallel_size" in p for p in problems):
        problems += _model_problems(cfg)
    return problems


def config_warnings(cfg: Any) -> list[str]:
    """Valid but probably unintended settings, one message each (the run goes on)."""
    arr = cfg.actor_rollout_ref
    path = str(arr.model.path or "")
    out = []
    if cfg.trainer.rollout_mode != "sync" and cfg.algorithm.rollout_correction.rollout_is is None:
        out.append(f"trainer.rollout_mode={cfg.trainer.rollout_mode!r} trains on samples from older weights without a "
                   "correction: set algorithm.rollout_correction.rollout_is=token (truncated importance weights)")
    if path and not path.startswith("builtin:") and arr.rollout.response_length <= 16:
        out.append(f"actor_rollout_ref.model.path={path!r} is a real checkpoint, but the job keeps the builtin toy's "
                   f"settings (rollout.response_length={arr.rollout.response_length}, actor lr "
                   f"{arr.actor.optim.lr:g}): use experiment=gsm8k_grpo or set them for your model")
    if arr.rollout.name == "vllm" and cfg.trainer.device == "cpu" and arr.rollout.enable_sleep_mode:
        out.append("actor_rollout_ref.rollout.enable_sleep_mode=true does nothing with vLLM's CPU build (it has no sleep "
                   "mode): its weights and KV cache stay in host memory while the actor trains")
    return out


def check_config(cfg: Any) -> None:
    """Raise :class:`ConfigError` listing every invalid setting of ``cfg`` (see :func:`config_problems`)."""
    problems = config_problems(cfg)
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))


def check_datasets(cfg: Any, train_prompts: int, val_prompts: int, files: dict[str, list[str]]) -> None:
    """Raise :class:`ConfigError` when the loaded prompt sets cannot fill a step (before Ray starts).

    ``train_prompts`` / ``val_prompts`` count what is left after over-long prompts were dropped;
    ``files`` names the files each came from (``{"train": [...], "val": [...]}``).
    """
    problems = []
    batch = cfg.data.train_batch_size
    if train_prompts < batch:
        problems.append(
            f"data.train_batch_size={batch} is larger than the {train_prompts} training prompts left after dropping "
            f"those over data.max_prompt_length={cfg.data.max_prompt_length} tokens ({', '.join(map(_short, files['train']))}); "
            f"allowed: at most {train_prompts}"
        )
    if val_prompts < 1 and cfg.trainer.test_freq > 0:
        problems.append(f"data.val_files ({', '.join(map(_short, files['val']))}) have no prompts within "
                        f"data.max_prompt_length={cfg.data.max_prompt_length}; set trainer.test_freq=0 to train without validation")
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))


def _short(path: str) -> str:
    return Path(path).name

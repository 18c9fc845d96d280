"""Which roles a run builds, where its rollout runs, and the actor settings its estimator prescribes: read from the
config and the estimator's declaration, by the entry point (which groups to start), the config check (which keys
then matter) and the layout (``ParallelDims``' critic ranks)."""

from __future__ import annotations

import enum
from typing import Any

from hybridflow.configs.schema import PPOConfig
from hybridflow.plugins import RolloutEngineEntry, UnknownNameError, get_estimator, get_rollout_engine


class RolloutPlacement(enum.Enum):
    """Where the rollout engine runs (:func:`rollout_placement`)."""

    COLOCATED = "colocated"
    """In the training ranks, time-sliced with the actor (``trainer.placement=colocated``)."""
    GROUP = "group"
    """In a worker group of its own ranks, weights sent after every update (``trainer.placement=split``)."""
    SERVER = "server"
    """In a server process of the engine's own, which agent loops call over HTTP (``rollout.mode=server`` with
    an engine that has one: vLLM's ``vllm serve``)."""


def rollout_placement(config: Any) -> RolloutPlacement:
    """Where the rollout runs: the one place this is decided. It alone chooses the roles the entry point
    builds, the weight sync that connects them and the handle the driver generates with."""
    rollout = config.actor_rollout_ref.rollout
    engine = installed_rollout_engine(config)
    if rollout.mode == "server" and engine is not None and engine.server is not None:
        return RolloutPlacement.SERVER
    if config.trainer.placement == "split":
        return RolloutPlacement.GROUP
    return RolloutPlacement.COLOCATED


def installed_rollout_engine(config: Any) -> RolloutEngineEntry | None:
    """The entry ``actor_rollout_ref.rollout.name`` names, or None when no installed plugin registered it (the
    config check says so, listing the engines that exist)."""
    try:
        return get_rollout_engine(config.actor_rollout_ref.rollout.name)
    except UnknownNameError:
        return None


def needs_reference(config: PPOConfig) -> bool:
    """A reference policy is built only when a KL term uses it."""
    return bool(config.actor_rollout_ref.actor.use_kl_loss or config.algorithm.use_kl_in_reward)


def reference_in_actor(config: PPOConfig) -> bool:
    """With LoRA the reference is the actor's model with its adapters off: the actor group computes the
    reference log-probs, and no reference group is built."""
    return needs_reference(config) and config.actor_rollout_ref.model.lora_rank > 0


def needs_critic(config: PPOConfig) -> bool:
    """A critic is built when the config asks for one, or (by default) when the estimator needs one."""
    enable = config.critic.enable
    return get_estimator(config.algorithm.adv_estimator).needs_critic if enable is None else bool(enable)


def resolve_loss_agg_mode(config: PPOConfig) -> str:
    """The configured mode, else the estimator's recommendation, else ``token-mean``."""
    if config.actor_rollout_ref.actor.loss_agg_mode is not None:
        return config.actor_rollout_ref.actor.loss_agg_mode
    return get_estimator(config.algorithm.adv_estimator).actor_defaults.get("loss_agg_mode", "token-mean")


def resolve_loss_scale_factor(config: PPOConfig) -> int:
    """The constant T_max of ``seq-mean-token-sum-norm``: ``actor.loss_scale_factor``, else the most tokens a
    response can have, ``rollout.response_length`` (veRL's Dr.GRPO setting; its ``agg_loss`` falls back to the
    batch's padded width, which is that length only while every batch is padded to it). One number for the
    actor and the critic, whatever the estimator: Dr.GRPO's paper divides by the generation budget."""
    factor = config.actor_rollout_ref.actor.loss_scale_factor
    return config.actor_rollout_ref.rollout.response_length if factor is None else factor

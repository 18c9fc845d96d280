"""What the driver provides because the estimator declared it (``AdvantageEstimator.needs``).

Every column an estimator may declare has one provider: the trainer reads an
:class:`InputPlan` once and each stage does its part when the plan says so,
never because of the estimator's name::

    uid, old_log_probs     always there (steps 1 and 2; recomputed, or the rollout's own: recompute_old_log_prob)
    values                 step 5, the critic (built because the estimator needs one)
    sum_pi_squared         step 2, the actor's forward also returns it
    reward_baselines       step 4, one greedy response per prompt, scored (ReMax)
    reward_components      step 4, the verifiers' fields named by reward.component_keys (GDPO)
    rollout_is_weights     step 2, rollout correction, when algorithm.rollout_correction is on (optional input)

A column nobody provides is a config error before anything starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hybridflow.configs.roles import installed_rollout_engine
from hybridflow.core.keys import (
    OLD_LOG_PROBS,
    REWARD_BASELINES,
    REWARD_COMPONENTS,
    ROLLOUT_IS_WEIGHTS,
    SUM_PI_SQUARED,
    UID,
    VALUES,
)
from hybridflow.plugins import AdvantageEstimator

PROVIDED = (UID, OLD_LOG_PROBS, VALUES, SUM_PI_SQUARED, REWARD_BASELINES, REWARD_COMPONENTS, ROLLOUT_IS_WEIGHTS)


@dataclass(frozen=True)
class InputPlan:
    """Which extra work the stages do for the estimator."""

    sum_pi_squared: bool = False
    """Step 2: the actor also returns ``sum_pi_squared``."""
    greedy_baseline: bool = False
    """Step 4: a greedy response per prompt, scored, as ``reward_baselines``."""
    reward_components: tuple[str, ...] = ()
    """Step 4: these verifier result fields, in order, as ``reward_components``."""
    recompute_old_log_prob: bool = True
    """Step 2: a teacher-forced pass computes ``old_log_probs``; False: the rollout's ``rollout_log_probs`` serve."""

    @classmethod
    def for_estimator(cls, estimator: AdvantageEstimator, config: Any) -> InputPlan:
        """The plan for ``estimator`` under ``config`` (assumes :func:`input_problems` found nothing)."""
        columns = {need.column for need in estimator.needs}
        return cls(
            sum_pi_squared=SUM_PI_SQUARED in columns,
            greedy_baseline=REWARD_BASELINES in columns,
            reward_components=tuple(config.reward.component_keys) if REWARD_COMPONENTS in columns else (),
            recompute_old_log_prob=recompute_old_log_prob(config, needs_pass=SUM_PI_SQUARED in columns),
        )


def recompute_old_log_prob(config: Any, *, needs_pass: bool) -> bool:
    """``actor.recompute_old_log_prob`` resolved: ``auto`` recomputes unless the rollout's log-probs are the
    training forward's numbers (the built-in engine computing in fp32: it generates in the actor's compute dtype
    from the same weights, and in bf16 the two passes' roundings differ by ~1e-2) and nothing else needs the pass (a
    rollout correction comparing the two, an estimator's ``sum_pi_squared``: ``needs_pass``)."""
    arr = config.actor_rollout_ref
    setting = str(arr.actor.recompute_old_log_prob).lower()
    if setting != "auto":
        return setting == "true"
    if config.algorithm.rollout_correction.bypass_mode:  # veRL's bypass: the rollout's log-probs are the old ones
        return needs_pass
    fp32 = arr.actor.fsdp_config.compute_dtype(arr.model) == "float32"
    engine = installed_rollout_engine(config)
    same_numbers = fp32 and engine is not None and engine.log_probs_match_training
    stale = config.trainer.rollout_mode != "sync"  # the rollout's weights may be older than the trainer's
    return needs_pass or stale or config.algorithm.rollout_correction.rollout_is is not None or not same_numbers


def input_problems(estimator: AdvantageEstimator, config: Any) -> list[str]:
    """Declared inputs the driver cannot provide under ``config``, one message each."""
    name = config.algorithm.adv_estimator
    problems = []
    for need in estimator.needs:
        if need.column not in PROVIDED and not need.optional:
            problems.append(
                f"algorithm.adv_estimator={name!r} needs batch[{need.column!r}] ({need.meaning}), which "
                f"the driver does not provide; it provides: {', '.join(PROVIDED)}"
            )
        if need.column == REWARD_COMPONENTS and not config.reward.component_keys:
            problems.append(
                f"algorithm.adv_estimator={name!r} needs reward components: set reward.component_keys to "
                "the verifier result fields to use, e.g. '[format/score,math/score]' with a weighted route"
            )
    if str(config.actor_rollout_ref.actor.recompute_old_log_prob).lower() == "false":
        needs = (
            [f"algorithm.adv_estimator={name!r} needs sum_pi_squared"]
            if SUM_PI_SQUARED in {n.column for n in estimator.needs}
            else []
        )
        corr = config.algorithm.rollout_correction
        if corr.rollout_is is not None and not corr.bypass_mode:  # bypass compares them inside the loss
            needs.append("algorithm.rollout_correction compares the training and the rollout log-probs")
        problems += [
            f"actor_rollout_ref.actor.recompute_old_log_prob=false, but {why}, which the training pass "
            "computes: set it to auto or true"
            for why in needs
        ]
    return problems


def reward_components(extras: list[dict[str, Any]], keys: tuple[str, ...], missing: float) -> torch.Tensor:
    """(B, K) float32: field ``keys[k]`` of each sample's verifier result; ``missing`` where a sample lacks it."""
    return torch.tensor([[float(fields.get(key, missing)) for key in keys] for fields in extras], dtype=torch.float32)

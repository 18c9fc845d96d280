"""What plugins register: one small frozen record per named thing.

A plugin builds one of these and hands it to the ``register`` callback its
hook receives; the plugin manager validates it and files it under its name.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

_NAME = re.compile(r"^[a-z][a-z0-9_.\-]*$")


def keyword_options(fn: Callable[..., Any]) -> dict[str, Any]:
    """A function's keyword-only parameters that have defaults, with those defaults."""
    params = inspect.signature(fn).parameters.values()
    return {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY and p.default is not p.empty}


@dataclass(frozen=True)
class PluginEntry:
    """A named function a plugin provides; subclasses say what kind."""

    kind: ClassVar[str] = "entry"

    name: str
    fn: Callable[..., Any]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(
                f"{self.kind} name {self.name!r} must be lowercase letters, digits, '_', '.' or '-', starting with a letter"
            )
        if not callable(self.fn):
            raise TypeError(f"{self.kind} {self.name!r}: fn must be callable, got {type(self.fn).__name__}")

    @property
    def options(self) -> dict[str, Any]:
        """The function's options and their defaults (its keyword-only parameters)."""
        return keyword_options(self.fn)

    @property
    def summary(self) -> str:
        """First line of the function's docstring."""
        doc = inspect.getdoc(self.fn)
        return doc.strip().splitlines()[0] if doc else ""


@dataclass(frozen=True)
class AdvantageEstimator(PluginEntry):
    """An advantage estimator, resolved by ``algorithm.adv_estimator``.

    ``fn(token_level_rewards, response_mask, *, [index], [values], **options)``
    takes (B, T) float32 tensors and returns ``(advantages, returns)``, both
    (B, T). It receives ``index`` (B,) int64 group ids when ``needs_groups``
    and ``values`` (B, T) when ``needs_critic``. Its keyword-only parameters
    with defaults are its options.

    ``actor_defaults`` are actor settings the estimator's paper prescribes
    (for example Dr.GRPO's loss aggregation); the trainer applies them unless
    the config sets those keys itself.
    """

    kind: ClassVar[str] = "estimator"

    needs_critic: bool = False
    needs_groups: bool = False
    actor_defaults: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RewardVerifier(PluginEntry):
    """A reward verifier, resolved by the reward config's routes.

    ``fn(data_source, solution_str, ground_truth, extra_info, **kwargs)``
    returns a float score, or a dict with a ``"score"`` float and extra
    fields reported as metrics: the ``compute_score`` signature veRL users
    already write.
    """

    kind: ClassVar[str] = "reward verifier"


@dataclass(frozen=True)
class PolicyLoss(PluginEntry):
    """A policy-gradient loss, resolved by ``actor.policy_loss``.

    ``fn(old_log_probs, log_probs, advantages, response_mask, **options)``
    takes (B, T) tensors and returns ``(token_losses, metrics)``: a (B, T)
    loss per token (the actor aggregates it with the configured loss
    aggregation mode, normalized over the global mini-batch) and a dict of
    float diagnostics such as ``pg_clipfrac``. Its keyword-only parameters
    with defaults are its options.
    """

    kind: ClassVar[str] = "policy loss"

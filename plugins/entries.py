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

from hybridflow.core.keys import (
    OLD_LOG_PROBS,
    REWARD_BASELINES,
    REWARD_COMPONENTS,
    ROLLOUT_IS_WEIGHTS,
    SUM_PI_SQUARED,
    UID,
    VALUES,
)

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
                f"{self.kind} name {self.name!r} must be lowercase letters, digits, '_', '.' or '-', "
                "starting with a letter"
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
class EstimatorInput:
    """One thing an estimator needs beyond ``token_level_rewards`` and ``response_mask``.

    The adapter reads batch ``column`` (a name from ``core/keys.py``) and
    passes it to the estimator's function as the keyword ``arg``; the driver
    fills the column because an estimator declared it. ``dims`` is the shape
    (``B`` rows, ``T`` response tokens, ``K`` any width), checked against the
    rewards; tensors arrive as float32. A ``non_tensor`` column is categorical
    and arrives as (B,) int64 ids, equal values equal id. An ``optional``
    input is passed only when its column is present. ``meaning`` says, in one
    line, what the column must hold.
    """

    arg: str
    column: str
    dims: tuple[str, ...]
    meaning: str
    non_tensor: bool = False
    optional: bool = False

    @property
    def shape(self) -> str:
        """``dims`` as a shape, e.g. ``(B, T)``."""
        return f"({', '.join(self.dims)}{',' if len(self.dims) == 1 else ''})"


GROUP_IDS = EstimatorInput(
    "index",
    UID,
    ("B",),
    "one id per prompt, shared by its n samples: rows with equal uid form a group",
    non_tensor=True,
)
CRITIC_VALUES = EstimatorInput("values", VALUES, ("B", "T"), "the critic's value estimate at each response token")
POLICY_OLD_LOG_PROBS = EstimatorInput(
    "old_log_probs", OLD_LOG_PROBS, ("B", "T"), "log pi_old of each sampled token, recomputed under the training layout"
)
POLICY_SUM_PI_SQUARED = EstimatorInput(
    "sum_pi_squared",
    SUM_PI_SQUARED,
    ("B", "T"),
    "sum over the vocabulary of pi_old(v | prefix)^2 at each response position, from the same forward "
    "(and temperature) as old_log_probs",
)
GREEDY_BASELINE_SCORES = EstimatorInput(
    "reward_baselines", REWARD_BASELINES, ("B",), "outcome score of one greedy response to the row's prompt"
)
REWARD_COMPONENT_SCORES = EstimatorInput(
    "reward_components",
    REWARD_COMPONENTS,
    ("B", "K"),
    "the response's outcome score under each of K reward components, in one fixed order for the run",
)
ROLLOUT_CORRECTION_WEIGHTS = EstimatorInput(
    "rollout_is_weights",
    ROLLOUT_IS_WEIGHTS,
    ("B", "T"),
    "importance weights pi_old / pi_rollout per token (losses/rollout_correction.py), when rollout correction is on",
    optional=True,
)

_BASE_INPUTS = ("token_level_rewards", "response_mask")

ACTOR_DEFAULT_KEYS = ("loss_agg_mode",)
"""The ``actor_rollout_ref.actor`` keys an estimator's ``actor_defaults`` may set: the ones the trainer applies
(``configs/roles.py`` :func:`resolve_loss_agg_mode`). ``loss_scale_factor`` is not one: its default, the
rollout's ``response_length``, is a setting of the run, not a number an estimator could declare."""


@dataclass(frozen=True)
class AdvantageEstimator(PluginEntry):
    """An advantage estimator, resolved by ``algorithm.adv_estimator``.

    ``fn(token_level_rewards, response_mask, <needs>..., **options)`` takes
    (B, T) float32 tensors and returns ``(advantages, returns)``, both
    (B, T). ``needs`` lists what else it receives, as :class:`EstimatorInput`
    records (for example ``GROUP_IDS``, ``CRITIC_VALUES``,
    ``POLICY_SUM_PI_SQUARED``): each becomes a keyword argument read from a
    named batch column, and the driver provides the columns the estimator
    declares. ``needs_groups`` and ``needs_critic`` are shorthands for
    ``GROUP_IDS`` and ``CRITIC_VALUES`` in ``needs``; after construction the
    flags and ``needs`` always agree, whichever was given. Its keyword-only
    parameters with defaults, other than declared needs, are its options.

    ``actor_defaults`` are actor settings the estimator's paper prescribes
    (for example Dr.GRPO's loss aggregation); the trainer applies them unless
    the config sets those keys itself. Only the keys in
    :data:`ACTOR_DEFAULT_KEYS` are applied (``configs/roles.py``), so any other
    key is refused here, at registration, rather than silently ignored.
    """

    kind: ClassVar[str] = "estimator"

    needs_critic: bool = False
    needs_groups: bool = False
    actor_defaults: Mapping[str, Any] = field(default_factory=dict)
    needs: tuple[EstimatorInput, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        unapplied = sorted(set(self.actor_defaults) - set(ACTOR_DEFAULT_KEYS))
        if unapplied:
            raise ValueError(
                f"estimator {self.name!r}: actor_defaults sets {unapplied}, which the trainer does not "
                f"apply; allowed: {', '.join(ACTOR_DEFAULT_KEYS)}"
            )
        needs = tuple(self.needs)
        for need in needs:
            if not isinstance(need, EstimatorInput):
                raise TypeError(f"estimator {self.name!r}: needs must hold EstimatorInput records, got {need!r}")
        if self.needs_groups and GROUP_IDS not in needs:
            needs = (GROUP_IDS, *needs)
        if self.needs_critic and CRITIC_VALUES not in needs:
            needs = (*needs, CRITIC_VALUES)
        args = [need.arg for need in needs]
        clash = sorted({a for a in args if args.count(a) > 1 or a in _BASE_INPUTS})
        if clash:
            raise ValueError(f"estimator {self.name!r}: needs {clash} more than once (or as a base input)")
        missing = [a for a in args if not _accepts(self.fn, a)]
        if missing:
            raise TypeError(f"estimator {self.name!r} declares it needs {missing}, but its fn has no such parameter")
        # frozen: set the normalized declaration once, here, so the flags and the tuple cannot disagree
        object.__setattr__(self, "needs", needs)
        object.__setattr__(self, "needs_groups", GROUP_IDS in needs)
        object.__setattr__(self, "needs_critic", CRITIC_VALUES in needs)

    @property
    def options(self) -> dict[str, Any]:
        """Keyword-only parameters with defaults, except the declared needs (the batch fills those)."""
        declared = {need.arg for need in self.needs}
        return {k: v for k, v in keyword_options(self.fn).items() if k not in declared}


def _accepts(fn: Callable[..., Any], arg: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: cannot tell, trust the declaration
        return True
    return arg in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


@dataclass(frozen=True)
class RewardVerifier(PluginEntry):
    """A reward verifier, resolved by the reward config's routes.

    ``fn(data_source, solution_str, ground_truth, extra_info, **kwargs)``
    returns a float score, or a dict with a ``"score"`` float and extra
    fields reported as metrics: the ``compute_score`` signature veRL users
    already write.

    ``preload``: modules a reward pool worker imports before it takes its
    first sample, when a route uses this verifier (heavy imports ``fn``
    makes lazily, such as ``math_verify``), so their import time does not
    count against the first sample's timeout. The module defining ``fn`` is
    always imported first.
    """

    kind: ClassVar[str] = "reward verifier"

    preload: tuple[str, ...] = ()


@dataclass(frozen=True)
class PolicyLoss(PluginEntry):
    """A policy-gradient loss, resolved by ``actor.policy_loss``.

    ``fn(old_log_probs, log_probs, advantages, response_mask, *,
    rollout_is_weights=None, **options)`` takes (B, T) tensors and returns
    ``(token_losses, metrics)``: a (B, T) loss per token (the actor
    aggregates it with the configured loss aggregation mode, normalized over
    the global mini-batch) and a dict of float diagnostics such as
    ``pg_clipfrac``.

    ``rollout_is_weights`` is a (B, T) tensor of importance weights between
    the rollout policy and the training policy (computed by
    ``losses/rollout_correction.py``, no gradient) or None; the actor passes
    it when rollout correction is on, and the loss multiplies its per-token
    losses by it before returning them, as veRL does (GMPO's sequence-level
    loss uses the weights' geometric mean per sequence). It is a runtime
    input, not an option: the keyword-only parameters with defaults other
    than ``rollout_is_weights`` are the loss's options.
    """

    kind: ClassVar[str] = "policy loss"

    runtime_inputs: ClassVar[tuple[str, ...]] = ("rollout_is_weights",)

    @property
    def options(self) -> dict[str, Any]:
        """Keyword-only parameters with defaults, except the runtime inputs the actor passes."""
        return {k: v for k, v in keyword_options(self.fn).items() if k not in self.runtime_inputs}


HOOK_STAGES = ("after_reward", "before_update")
"""Where ``fit()`` runs a :class:`BatchHook`: after step 4 (scored), before step 7 (advantages computed)."""


@dataclass(frozen=True)
class BatchHook(PluginEntry):
    """A recipe step the driver runs at a fixed point of every training step (``algorithm.batch_hooks``).

    ``fn(batch, **options) -> (batch, metrics)`` receives the step's
    DataProto and returns it (changed or not) and a dict of float metrics
    (logged under ``batch_hooks/<name>/``). At ``stage``:

    * ``after_reward``: the batch is generated and scored (``responses``,
      ``token_level_scores``, ``token_level_rewards``, ``uid``, log-probs).
      The hook may reshape the rewards and may drop rows, whole groups only
      (all rows of a uid). While fewer than ``data.train_batch_size``
      prompts are left, the driver rolls out more prompts and runs the hooks
      on them, up to ``algorithm.max_rollout_batches`` batches (DAPO's
      dynamic sampling is such a hook);
    * ``before_update``: advantages and returns are computed; the hook may
      change values but not the rows (their count and the order of their uids are checked).

    Its keyword-only parameters with defaults are its options
    (``algorithm.batch_hook_options[name]``). It runs on the driver, on
    small tensors: no model, no Ray.
    """

    kind: ClassVar[str] = "batch hook"

    stage: str = "after_reward"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.stage not in HOOK_STAGES:
            raise ValueError(f"batch hook {self.name!r}: stage {self.stage!r}; allowed: {', '.join(HOOK_STAGES)}")


@dataclass(frozen=True)
class AgentLoop(PluginEntry):
    """An agent loop, resolved by ``actor_rollout_ref.rollout.agent_loop``: how one prompt becomes a trajectory.

    ``async fn(request, client, tools, **options) -> Trajectory`` receives an
    :class:`hybridflow.agents.AgentRequest` (the prompt's token ids, its row's
    fields, the tokenizer and the trajectory's token budget), a
    :class:`hybridflow.agents.PolicyClient` to sample from the policy and a
    :class:`hybridflow.agents.ToolBox` of the configured tools, and returns a
    :class:`hybridflow.agents.Trajectory`: the conversation's tokens after the
    prompt, with a loss mask that is 1 only on tokens the policy sampled.
    Many loops run at once on one event loop; the client batches their
    generations. Its keyword-only parameters with defaults are its options
    (``rollout.agent.options``).

    ``single_generate`` declares that the loop is exactly one generation of
    the prompt (``single_turn``): the driver then samples all ``n`` responses
    of a batch in one engine call whose prefill the samples share, instead of
    running the loop once per sample.
    """

    kind: ClassVar[str] = "agent loop"

    single_generate: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not inspect.iscoroutinefunction(self.fn):
            raise TypeError(f"agent loop {self.name!r}: fn must be an async function (async def)")


@dataclass(frozen=True)
class RolloutEngineEntry(PluginEntry):
    """A rollout engine, resolved by ``actor_rollout_ref.rollout.name``.

    ``fn(context) -> engine`` builds one rank's engine: it receives a
    :class:`hybridflow.workers.rollout.base.EngineContext` (the config, the
    layout, the tokenizer, the device, the rank's tensor-parallel group, and
    colocated the training model) and returns an object with the
    :class:`hybridflow.workers.rollout.base.RolloutEngine` interface. It is
    called once per rank, on every rank of the rollout together (it may be
    collective), after ``torch.distributed`` is up. Import heavy dependencies
    inside ``fn``: the plugin's module is imported by every process that looks
    up a name.

    ``check(config) -> list[str]`` (optional) says what stops the engine from
    running under a config (a missing build, an unsupported model), one message
    each; the trainer shows them before anything starts. ``warn(config)``
    (optional) says what runs but likely not as meant, printed as warnings.
    ``server(config, log_path)`` (optional) is the engine as a process of its own
    behind HTTP, for agent loops under ``rollout.mode=server`` (vLLM's
    ``vllm serve``): a context manager that starts it, with the weight-transfer
    calls the trainer's sync makes (``workers/rollout/vllm_server.py``).
    ``log_probs_match_training`` declares that the engine's ``rollout_log_probs``
    equal the training forward's in fp32 (same kernels and reductions), so the
    actor may skip recomputing them (``actor.recompute_old_log_prob=auto``).
    """

    kind: ClassVar[str] = "rollout engine"

    check: Callable[[Any], list[str]] | None = None
    warn: Callable[[Any], list[str]] | None = None
    server: Callable[..., Any] | None = None
    log_probs_match_training: bool = False

    def problems(self, config: Any) -> list[str]:
        """What stops this engine under ``config`` (its ``check``), each message as the check wrote it."""
        return list(self.check(config)) if self.check is not None else []

    def warnings(self, config: Any) -> list[str]:
        """Settings that run but likely not as meant under ``config`` (its ``warn``)."""
        return list(self.warn(config)) if self.warn is not None else []


class ToolError(Exception):
    """Raised by a tool's function for a call that failed: the message is the observation the policy reads, and
    the call's status is ``error`` whatever the message says (a program's output cannot pass for success)."""


@dataclass(frozen=True)
class Tool(PluginEntry):
    """A tool an agent loop may call, resolved by name from ``rollout.agent.tools``.

    ``fn(arguments, state) -> str`` gets the call's arguments (a dict, already
    checked against ``parameters``) and ``state``, the row's
    ``extra_info["tools_kwargs"][name]`` (what this prompt's instance of the
    tool knows, e.g. a hidden value; an empty dict when absent), and returns
    the observation text. It runs in a thread of the driver with the
    configured timeout: a tool that raises, hangs or returns something that is
    not a string becomes an error observation, never a failed step; a tool
    whose call failed in a way it can describe raises :class:`ToolError`
    with the observation as its message (status ``error``, however the text
    reads). A tool that runs model-written code must run it in a sandbox
    (:func:`hybridflow.sandbox.runner.run_python`), as ``python`` does.

    ``parameters`` is the JSON schema of the arguments (an ``object`` schema
    with ``properties`` and ``required``), shown to models in the OpenAI
    ``tools`` format by :meth:`openai_schema`.
    """

    kind: ClassVar[str] = "tool"

    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}, "required": []})

    def __post_init__(self) -> None:
        super().__post_init__()
        schema = self.parameters
        if not isinstance(schema, Mapping) or schema.get("type") != "object":
            raise ValueError(f"tool {self.name!r}: parameters must be a JSON object schema ({{'type': 'object', ...}})")
        unknown = set(schema.get("required", ())) - set(schema.get("properties", {}))
        if unknown:
            raise ValueError(f"tool {self.name!r}: required parameters {sorted(unknown)} are not in its properties")

    def openai_schema(self) -> dict[str, Any]:
        """The tool in the OpenAI ``tools`` format (what a chat template renders for the model)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description or self.summary,
                "parameters": dict(self.parameters),
            },
        }

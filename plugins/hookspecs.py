"""Hook specifications: what a hybridflow plugin may implement.

A plugin is a module (or object) listed under the ``hybridflow`` entry-point
group of its distribution's metadata, for example in ``setup.cfg``::

    [options.entry_points]
    hybridflow =
        my_estimator = my_package.my_estimator

and implementing one or more of the hooks below, marked with
:data:`hookimpl`. The framework's own estimators and verifiers are plugins
of exactly this kind.

Every hook here has the *register-callback* shape: the plugin receives a
``register`` function and calls it once per thing it provides. Names are
validated in one place (the plugin manager) and every registration is
attributed to the plugin and distribution that made it.
"""

from __future__ import annotations

from collections.abc import Callable

import pluggy

from hybridflow.plugins.entries import (
    AdvantageEstimator,
    AgentLoop,
    BatchHook,
    PolicyLoss,
    RewardVerifier,
    RolloutEngineEntry,
    Tool,
)

PROJECT_NAME = "hybridflow"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
"""Mark a plugin function as the implementation of a hook of the same name."""


@hookspec
def hybridflow_register_estimators(register: Callable[[AdvantageEstimator], None]) -> None:
    """Register advantage estimators.

    :param register: call ``register(AdvantageEstimator(...))`` once for
        each estimator the plugin provides.

    Called once per process, the first time an estimator is looked up (for
    example by ``compute_advantage`` or ``hybridflow plugins``); the returned
    value is ignored. A plugin must not do heavy work here (no model loading,
    no network): it only describes what it offers. Registering a name that
    another plugin also registers makes that name an error to look up, naming
    both distributions. Exceptions raised here are reported with the plugin's
    distribution and leave other plugins working. What an estimator reads
    beyond rewards and the mask (group ids, values, old log-probs, a greedy
    baseline's score, ...) is declared in its record's ``needs``; the driver
    provides those batch columns and the adapter checks they are there.
    """


@hookspec
def hybridflow_register_reward_verifiers(register: Callable[[RewardVerifier], None]) -> None:
    """Register reward verifiers.

    :param register: call ``register(RewardVerifier(...))`` once for each
        verifier the plugin provides.

    Called once per process, the first time a verifier is looked up; the
    returned value is ignored. The same rules as
    :func:`hybridflow_register_estimators` apply. A verifier's function may
    later run in a worker process of the reward pool, so it must be
    importable (a module-level function), not a closure.
    """


@hookspec
def hybridflow_register_policy_losses(register: Callable[[PolicyLoss], None]) -> None:
    """Register policy-gradient losses for the actor.

    :param register: call ``register(PolicyLoss(...))`` once for each loss
        the plugin provides.

    Called once per process (in each actor worker), the first time a loss is
    looked up; the returned value is ignored. The same rules as
    :func:`hybridflow_register_estimators` apply. The loss returns per-token
    losses; it must not aggregate them or call ``backward``: the actor owns
    aggregation, so the gradient does not depend on the data-parallel size.

    Every loss function must accept the keyword ``rollout_is_weights``
    (default None): a (B, T) tensor of rollout-to-training importance
    weights, computed by the driver (``losses/rollout_correction.py``) and
    carrying no gradient. When it is given, the loss multiplies its per-token
    losses by it; the actor passes it only when rollout correction is on. It
    is not an option and is not listed among the loss's options.
    """


@hookspec
def hybridflow_register_batch_hooks(register: Callable[[BatchHook], None]) -> None:
    """Register batch hooks: recipe steps the driver runs at fixed points of ``fit()``.

    :param register: call ``register(BatchHook(...))`` once for each hook
        the plugin provides.

    Called once per process (the driver's), the first time a hook is looked
    up; the returned value is ignored. The same rules as
    :func:`hybridflow_register_estimators` apply. A hook runs only when the
    config names it in ``algorithm.batch_hooks``; see :class:`BatchHook` for
    what it receives at each stage and what it may change. A hook must not
    start processes or touch the worker groups: it sees the batch only.
    """


@hookspec
def hybridflow_register_agent_loops(register: Callable[[AgentLoop], None]) -> None:
    """Register agent loops: how a prompt becomes a (possibly multi-turn) trajectory.

    :param register: call ``register(AgentLoop(...))`` once for each loop
        the plugin provides.

    Called once per process (the driver's), the first time a loop is looked
    up; the returned value is ignored. The same rules as
    :func:`hybridflow_register_estimators` apply. A loop runs only when
    ``actor_rollout_ref.rollout.agent_loop`` names it; see :class:`AgentLoop`
    for what it receives and must return (above all the loss mask: 1 on the
    tokens the policy sampled, 0 on everything else).
    """


@hookspec
def hybridflow_register_tools(register: Callable[[Tool], None]) -> None:
    """Register tools that agent loops may call.

    :param register: call ``register(Tool(...))`` once for each tool the
        plugin provides.

    Called once per process (the driver's), the first time a tool is looked
    up; the returned value is ignored. The same rules as
    :func:`hybridflow_register_estimators` apply. A tool is offered to the
    policy only when ``rollout.agent.tools`` lists it; its function receives
    model-written arguments, so it must treat them as untrusted (see
    :class:`Tool`).
    """


@hookspec
def hybridflow_register_rollout_engines(register: Callable[[RolloutEngineEntry], None]) -> None:
    """Register rollout engines: what turns prompts into sampled responses on a rank.

    :param register: call ``register(RolloutEngineEntry(name, build))`` once
        for each engine the plugin provides.

    Called once per process that looks an engine up (the driver, to check the
    config; each rollout rank, to build its engine); the returned value is
    ignored. The same rules as :func:`hybridflow_register_estimators` apply. An
    engine is built only when ``actor_rollout_ref.rollout.name`` names it; see
    :class:`RolloutEngineEntry` for what its factory receives and
    ``workers/rollout/base.py`` for the interface the engine must have. The
    hook must not import the engine's heavy dependencies (do that in the
    factory) nor start anything.
    """

"""The policy-loss contract: what every loss must do for the actor, whatever its formula.

The actor calls ``fn(old_log_probs, log_probs, advantages, response_mask,
rollout_is_weights=..., **options)``, aggregates the (B, T) token losses
with ``agg_loss`` and differentiates with respect to ``log_probs``.
:func:`check_policy_loss` does the same, in float32, under every loss
aggregation mode, and checks, each property on its own:

1. **outputs**: token losses are a (B, T) tensor with a gradient w.r.t.
   ``log_probs``, finite, with finite gradients; metrics are a dict of
   finite floats. Also on the edge cases: every token masked, far off
   policy (log-ratios up to +-10), a single token.
2. **masked tokens carry no loss**: changing ``log_probs``,
   ``old_log_probs``, ``advantages`` and ``rollout_is_weights`` at masked
   positions changes neither the aggregated loss nor any valid token's loss
   (to 1e-6).
3. **no gradient through masked tokens**: the gradient of the aggregated
   loss w.r.t. ``log_probs`` is exactly 0 at masked positions.
4. **zero advantage at ratio 1 gives zero gradient**: with
   ``log_probs == old_log_probs`` and all advantages 0, the gradient is 0
   (to 1e-7).
5. **the gradient at ratio 1 is the policy gradient**: with
   ``log_probs == old_log_probs`` and advantages constant along each row
   (as outcome estimators give), the gradient equals that of
   ``-A * log_probs`` under the same aggregation (to 1e-6, rtol 1e-4): the
   loss moves the policy the way the advantage says, with the step size of
   REINFORCE. A flipped sign fails here.
6. **unit rollout weights change nothing**: ``rollout_is_weights`` of all
   ones gives the same token losses, gradient and metrics as none.

Each call runs under a fixed torch seed, so a loss that samples (``clip_cov``
picks tokens at random) sees the same draw in both calls of a comparison.
A property the formula does not imply is declared off by the caller:
``zero_advantage_gives_zero_gradient=False``, or
``policy_gradient_at_ratio_one=False`` (``clip_cov`` removes the gradient of
a few high-covariance tokens even at ratio 1, by design).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from hybridflow.losses.aggregation import LOSS_AGG_MODES, agg_loss
from hybridflow.plugins import PolicyLoss, get_policy_loss
from hybridflow.testing.contract import (
    ContractReport,
    call,
    checked_options,
    mismatch,
    not_finite,
    resolve,
    run_properties,
)

VOCAB = 8


@dataclass(frozen=True)
class LossCase:
    """The inputs of one loss call, named by ``label`` in failure messages; all (B, T) float32."""

    label: str
    old_log_probs: torch.Tensor
    log_probs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    weights: torch.Tensor | None = None


@dataclass(frozen=True)
class LossOutput:
    token_losses: torch.Tensor
    metrics: Any
    loss: torch.Tensor  # aggregated under ``mode``
    grad: torch.Tensor  # d loss / d log_probs


def make_loss_case(label: str, seed: int, rows: int = 5, length: int = 7, spread: float = 0.3) -> LossCase:
    """Log-probs of a random policy over 8 tokens and of a nearby one (log-ratios ~ ``spread``), random advantages,
    responses of different lengths with one empty and one with a hole."""
    gen = torch.Generator().manual_seed(seed)
    logits = 1.5 * torch.randn(rows, length, VOCAB, generator=gen)
    moved = logits + spread * torch.randn(rows, length, VOCAB, generator=gen)
    old, new = (torch.log_softmax(x, dim=-1)[..., 0] for x in (logits, moved))
    sizes = torch.randint(1, length + 1, (rows,), generator=gen)
    if rows > 2:
        sizes[1] = 0  # an empty response
    mask = (torch.arange(length) < sizes.unsqueeze(-1)).float()
    if rows > 2 and length > 3:
        mask[0, :4] = torch.tensor([1.0, 0.0, 1.0, 1.0])  # a hole: an observation inside a multi-turn response
    return LossCase(label, old, new, torch.randn(rows, length, generator=gen), mask)


def check_policy_loss(
    loss: PolicyLoss | str,
    *,
    options: Mapping[str, Any] | None = None,
    zero_advantage_gives_zero_gradient: bool = True,
    policy_gradient_at_ratio_one: bool = True,
    seed: int = 0,
) -> ContractReport:
    """Check the policy-loss contract (module docstring) on ``loss``, a record or a registered name.

    ``options`` are passed to its function (an option it does not have is a
    ``TypeError``). Raises one ``AssertionError`` listing every broken
    property with its input and numbers; returns a
    :class:`~hybridflow.testing.contract.ContractReport` when all hold.
    """
    entry = resolve(loss, PolicyLoss, get_policy_loss)
    options = checked_options(entry, options)

    def run(case: LossCase, mode: str) -> LossOutput:
        return _run(entry, options, case, mode, seed)

    base = make_loss_case(f"a batch of 5 responses (seed {seed})", seed)
    edges = [
        replace(base, label="every token masked", mask=torch.zeros_like(base.mask)),
        make_loss_case(f"far off policy, log-ratios up to +-10 (seed {seed})", seed, spread=6.0),
        make_loss_case(f"a single token (seed {seed})", seed, rows=1, length=1),
    ]
    properties: list[tuple[str, Callable[[], None]]] = [
        ("outputs", lambda: [_outputs(run(case, mode), case) for case in [base, *edges] for mode in LOSS_AGG_MODES]),
        ("masked tokens carry no loss", lambda: _masked_no_loss(base, run, seed)),
        (
            "no gradient through masked tokens",
            lambda: [_masked_no_grad(run(base, mode), base, mode) for mode in LOSS_AGG_MODES],
        ),
    ]
    not_expected = {}
    at_one = replace(base, log_probs=base.old_log_probs.clone())
    if zero_advantage_gives_zero_gradient:
        still = replace(
            at_one, label=f"{base.label} at ratio 1, advantages 0", advantages=torch.zeros_like(base.advantages)
        )
        properties.append(("zero advantage at ratio 1 gives zero gradient", lambda: _zero_grad(run, still)))
    else:
        not_expected["zero advantage at ratio 1 gives zero gradient"] = "zero_advantage_gives_zero_gradient=False"
    if policy_gradient_at_ratio_one:
        rowwise = base.advantages[:, :1].expand_as(base.advantages).clone()
        pg = replace(at_one, label=f"{base.label} at ratio 1, advantages constant per row", advantages=rowwise)
        properties.append(("the gradient at ratio 1 is the policy gradient", lambda: _policy_gradient(run, pg)))
    else:
        not_expected["the gradient at ratio 1 is the policy gradient"] = "policy_gradient_at_ratio_one=False"
    properties.append(("unit rollout weights change nothing", lambda: _unit_weights(run, base)))
    return run_properties(f"policy loss {entry.name!r}", properties, not_expected)


def _run(entry: PolicyLoss, options: dict[str, Any], case: LossCase, mode: str, seed: int) -> LossOutput:
    log_probs = case.log_probs.clone().requires_grad_(True)
    extra = {} if case.weights is None else {"rollout_is_weights": case.weights.clone()}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = call(
            case.label,
            entry.fn,
            case.old_log_probs.clone(),
            log_probs,
            case.advantages.clone(),
            case.mask.clone(),
            **extra,
            **options,
        )
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], torch.Tensor)):
        raise AssertionError(f"on {case.label}: expected a tuple (token_losses, metrics), got {type(out).__name__}")
    token_losses, metrics = out
    if tuple(token_losses.shape) != tuple(case.mask.shape):
        raise AssertionError(
            f"on {case.label}: token losses have shape {tuple(token_losses.shape)}, expected {tuple(case.mask.shape)}"
        )
    if not token_losses.requires_grad:
        raise AssertionError(f"on {case.label}: the token losses carry no gradient w.r.t. log_probs")
    loss = agg_loss(token_losses, case.mask, mode)
    (grad,) = torch.autograd.grad(loss, log_probs, allow_unused=True)
    return LossOutput(
        token_losses.detach(), metrics, loss.detach(), torch.zeros_like(log_probs) if grad is None else grad
    )


def _outputs(out: LossOutput, case: LossCase) -> None:
    for what, tensor in (("token losses", out.token_losses), ("the gradient w.r.t. log_probs", out.grad)):
        problem = not_finite(tensor)
        if problem:
            raise AssertionError(f"on {case.label}: {what}: {problem}")
    if not isinstance(out.metrics, dict):
        raise AssertionError(f"on {case.label}: metrics must be a dict, got {type(out.metrics).__name__}")
    for key, value in out.metrics.items():
        if (
            not isinstance(key, str)
            or isinstance(value, bool)
            or not isinstance(value, float)
            or not math.isfinite(value)
        ):
            raise AssertionError(
                f"on {case.label}: metric {key!r} = {value!r} ({type(value).__name__}); metrics must be finite floats"
            )


def _masked_no_loss(base: LossCase, run: Callable[[LossCase, str], LossOutput], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed + 1)
    masked = base.mask == 0
    weights = torch.exp(0.3 * torch.randn(base.mask.shape, generator=gen)) * base.mask
    clean = replace(base, weights=weights)  # weights too, so a loss that reads them at masked positions shows
    noisy = replace(
        clean,
        label=f"{base.label}, with other values at masked positions",
        log_probs=torch.where(masked, -5 * torch.rand(base.mask.shape, generator=gen), base.log_probs),
        old_log_probs=torch.where(masked, -5 * torch.rand(base.mask.shape, generator=gen), base.old_log_probs),
        advantages=torch.where(masked, 10 * torch.randn(base.mask.shape, generator=gen), base.advantages),
        weights=torch.where(masked, 1 + 9 * torch.rand(base.mask.shape, generator=gen), weights),
    )
    for mode in LOSS_AGG_MODES:
        want, got = run(clean, mode), run(noisy, mode)
        if not math.isclose(float(got.loss), float(want.loss), rel_tol=1e-6, abs_tol=1e-6):
            raise AssertionError(
                f"on {noisy.label}: the {mode} loss changed from {float(want.loss):.8g} to {float(got.loss):.8g}"
            )
        valid = base.mask > 0
        problem = mismatch(got.token_losses[valid], want.token_losses[valid], atol=1e-6, rtol=1e-6)
        if problem:
            raise AssertionError(
                f"on {noisy.label}: valid tokens' losses changed: {problem} (indices among valid tokens)"
            )


def _masked_no_grad(out: LossOutput, case: LossCase, mode: str) -> None:
    leaked = (case.mask == 0) & (out.grad != 0)
    if leaked.any():
        at = [int(i) for i in leaked.nonzero()[0]]
        raise AssertionError(
            f"on {case.label}, {mode}: the gradient w.r.t. log_probs is non-zero at {int(leaked.sum())} of "
            f"{int((case.mask == 0).sum())} masked tokens; d loss / d log_probs{at} = {float(out.grad[tuple(at)]):.6g}"
        )


def _zero_grad(run: Callable[[LossCase, str], LossOutput], case: LossCase) -> None:
    for mode in LOSS_AGG_MODES:
        problem = mismatch(run(case, mode).grad, torch.zeros_like(case.mask), atol=1e-7)
        if problem:
            raise AssertionError(f"on {case.label}, {mode}: the gradient w.r.t. log_probs is not 0: {problem}")


def _policy_gradient(run: Callable[[LossCase, str], LossOutput], case: LossCase) -> None:
    for mode in LOSS_AGG_MODES:
        log_probs = case.log_probs.clone().requires_grad_(True)
        (want,) = torch.autograd.grad(agg_loss(-case.advantages * log_probs, case.mask, mode), log_probs)
        problem = mismatch(run(case, mode).grad, want, atol=1e-6, rtol=1e-4)
        if problem:
            raise AssertionError(f"on {case.label}, {mode}: the gradient is not that of -A * log_probs: {problem}")


def _unit_weights(run: Callable[[LossCase, str], LossOutput], case: LossCase) -> None:
    weighted = replace(case, label=f"{case.label}, rollout_is_weights all 1", weights=torch.ones_like(case.mask))
    plain, ones = run(case, "token-mean"), run(weighted, "token-mean")
    for what, got, want in (
        ("token losses", ones.token_losses, plain.token_losses),
        ("gradient", ones.grad, plain.grad),
    ):
        problem = mismatch(got, want, atol=1e-7, rtol=1e-6)
        if problem:
            raise AssertionError(f"on {weighted.label}: the {what} changed: {problem}")
    if ones.metrics != plain.metrics:
        raise AssertionError(f"on {weighted.label}: the metrics changed from {plain.metrics} to {ones.metrics}")

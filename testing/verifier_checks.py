"""The reward-verifier contract: what every verifier must do for the reward manager.

The reward manager runs a verifier in a pool of worker processes with a
wall-clock limit per response (``rewards/pool.py``); a response whose
verifier raises, or runs past the limit, is a failed sample (left out of
training under ``reward.on_failure=exclude``) and is counted as a reward error. :func:`check_reward_verifier` runs the
verifier the same way, in a :class:`~hybridflow.rewards.pool.ScoringPool`
of two workers, on the caller's cases and on three odd responses (an empty
one, a 1 MB one, a non-ASCII one with a NUL), each twice, and checks:

1. **returns within the timeout**: no call runs past ``timeout_s``.
2. **a finite score or an ordinary exception**: each call returns a finite
   float (or int), or a dict with a finite ``"score"``, exactly as the
   manager validates it (NaN fails), or raises an ``Exception``. A
   ``SystemExit`` or a killed worker fails, and so does, before anything
   runs, a function the workers cannot import (a closure, a lambda).
3. **deterministic**: both calls on one input give the same result (they
   may run in different processes, so ``hash()``-order dependence shows).
4. **expected scores**: each case ``(solution, ground_truth, score)`` scores
   ``score`` (to 1e-9); raising fails.
5. **odd responses scored without raising**, only with
   ``odd_responses_may_raise=False``: the stricter promise "odd text scores
   0" that the templates make.

An exception on odd text is allowed by default because the framework
survives it (it scores the response 0 and counts a reward error); a hang or
a NaN it cannot tell from a real score is not.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hybridflow.plugins import RewardVerifier, get_reward_verifier
from hybridflow.rewards.pool import Outcome, ScoringPool, WorkerStartError
from hybridflow.rewards.scoring import as_score_dict
from hybridflow.testing.contract import ContractReport, checked_options, resolve, run_properties
from hybridflow.testing.verifier_call import call_verifier

HUGE_RESPONSE = ("12 + 30 = 42, so the answer is \\boxed{42}. " * 30000)[: 1 << 20]
"""1 MB of answer-like text: many candidate answers for a parser to chew on."""
NON_ASCII_RESPONSE = "Ответ: ４２ — 答案是 42; ∑ π ≈ 3.14, naïve café 😀\u200b\x00 עברית \u202e42"
"""Cyrillic, full-width digits, CJK, math symbols, an emoji, a zero-width space, a NUL, right-to-left text."""
ODD_RESPONSES = {"an empty response": "", "a 1 MB response": HUGE_RESPONSE, "a non-ASCII response": NON_ASCII_RESPONSE}
SCORE_TOLERANCE = 1e-9


@dataclass(frozen=True)
class VerifierCase:
    """A response, its ground truth and the score the verifier must give it."""

    solution: str
    ground_truth: Any
    score: float


@dataclass(frozen=True)
class Verdict:
    """What one call came to: ``kind`` is ``"score"``, ``"raised"``, ``"invalid"``, ``"timeout"`` or ``"crashed"``."""

    kind: str
    detail: str
    value: dict[str, Any] | None = None

    def __str__(self) -> str:
        return f"score {self.value}" if self.kind == "score" else f"{self.kind}: {self.detail}"


@dataclass(frozen=True)
class Trial:
    label: str
    expected: float | None  # None for an odd response
    first: Verdict
    second: Verdict


def check_reward_verifier(
    verifier: RewardVerifier | str,
    *,
    cases: Sequence[VerifierCase | tuple[str, Any, float]] = (),
    ground_truth: Any = None,
    data_source: str = "hybridflow-contract-kit",
    extra_info: Any = None,
    kwargs: Mapping[str, Any] | None = None,
    odd_responses_may_raise: bool = True,
    timeout_s: float = 10.0,
) -> ContractReport:
    """Check the verifier contract (module docstring) on ``verifier``, a record or a registered name.

    ``cases`` are ``VerifierCase`` records or ``(solution, ground_truth,
    score)`` tuples; the odd responses are scored against ``ground_truth``
    (default: the first case's, else ``"1"``). ``kwargs`` are the verifier's
    options (one it does not have is a ``TypeError``). Raises one
    ``AssertionError`` listing every broken property with its input and
    result; returns a :class:`~hybridflow.testing.contract.ContractReport`
    when all hold.
    """
    entry = resolve(verifier, RewardVerifier, get_reward_verifier)
    kwargs = checked_options(entry, kwargs)
    cases = [c if isinstance(c, VerifierCase) else VerifierCase(*c) for c in cases]
    truth = ground_truth if ground_truth is not None else (cases[0].ground_truth if cases else "1")
    inputs = [
        (f"case {i} ({c.solution[:40]!r} vs {c.ground_truth!r})", c.solution, c.ground_truth, c.score)
        for i, c in enumerate(cases)
    ]
    inputs += [(f"{label} (vs {truth!r})", text, truth, None) for label, text in ODD_RESPONSES.items()]
    tasks = [(entry.fn, data_source, text, gt, extra_info, kwargs) for _, text, gt, _ in inputs for _ in range(2)]
    subject = f"reward verifier {entry.name!r}"
    try:  # the workers get the function by reference, as the reward manager sends it
        pickle.dumps(entry.fn)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise AssertionError(
            f"{subject}: its function cannot be sent to a reward worker ({type(exc).__name__}: {exc}); "
            "a verifier must be a module-level function of an importable module, not a closure or a lambda"
        ) from exc
    try:
        with ScoringPool(
            num_workers=2, timeout_s=timeout_s, preload=[entry.fn.__module__, call_verifier.__module__]
        ) as pool:
            outcomes = pool.run(call_verifier, tasks)
    except WorkerStartError as exc:
        raise AssertionError(
            f"{subject}: a reward worker could not import {entry.fn.__module__!r}, its function's module: {exc}"
        ) from exc
    verdicts = [_verdict(entry.name, o) for o in outcomes]
    trials = [
        Trial(label, expected, verdicts[2 * i], verdicts[2 * i + 1]) for i, (label, _, _, expected) in enumerate(inputs)
    ]

    properties: list[tuple[str, Callable[[], None]]] = [
        (f"returns within {timeout_s:g} s", lambda: _each(trials, _in_time)),
        ("a finite score or an ordinary exception", lambda: _each(trials, _valid)),
        ("deterministic", lambda: _each(trials, _deterministic)),
    ]
    if cases:
        properties.append(("expected scores", lambda: _each(trials, _expected)))
    not_expected = {}
    if odd_responses_may_raise:
        not_expected["odd responses scored without raising"] = "odd_responses_may_raise=True"
    else:
        properties.append(("odd responses scored without raising", lambda: _each(trials, _no_raise)))
    return run_properties(subject, properties, not_expected)


def _verdict(name: str, outcome: Outcome) -> Verdict:
    if outcome.status == "timeout":
        return Verdict("timeout", f"no result after {outcome.seconds:.1f} s; its worker was killed")
    if outcome.status == "error":
        return Verdict("crashed", outcome.error.strip().splitlines()[0] if outcome.error.strip() else "?")
    kind, value = outcome.value
    if kind == "raised":
        return Verdict("raised", value)
    try:
        return Verdict("score", "", as_score_dict(name, value))
    except TypeError as exc:
        return Verdict("invalid", str(exc))


def _each(trials: list[Trial], check: Callable[[Trial], str | None]) -> None:
    problems = [f"on {t.label}: {problem}" for t in trials for problem in [check(t)] if problem]
    if problems:
        raise AssertionError("; ".join(problems))


def _in_time(t: Trial) -> str | None:
    late = [v for v in (t.first, t.second) if v.kind == "timeout"]
    return late[0].detail if late else None


def _valid(t: Trial) -> str | None:
    for v in (t.first, t.second):
        if v.kind == "invalid":
            return v.detail
        if v.kind == "crashed":
            return f"{v.detail}; raise an Exception instead (the reward pool scores it 0 and counts a reward error)"
    return None


def _deterministic(t: Trial) -> str | None:
    if "timeout" in (t.first.kind, t.second.kind) or str(t.first) == str(t.second):
        return None
    return f"gave {t.first} the first time and {t.second} the second"


def _expected(t: Trial) -> str | None:
    if t.expected is None:
        return None
    if t.first.kind != "score":
        return f"expected score {t.expected:g}, got {t.first}"
    got = t.first.value["score"]
    if not math.isclose(got, t.expected, rel_tol=0.0, abs_tol=SCORE_TOLERANCE):
        return f"scored {got!r}, expected {t.expected!r}"
    return None


def _no_raise(t: Trial) -> str | None:
    if t.expected is None and t.first.kind == "raised":
        return f"raised {t.first.detail}; odd text must score (0), not raise"
    return None

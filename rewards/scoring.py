"""Scoring one sample: call its verifiers, check what they return, combine by weight.

:func:`score_sample` is what the reward pool's worker processes run. It
receives the verifier functions themselves (pickled by reference, so each
must be a module-level function its worker can import) with their weights
and keyword arguments, as resolved in the driver from the routes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ResolvedCall:
    """A verifier function with its name, weight and keyword arguments."""

    name: str
    fn: Callable[..., Any]
    weight: float = 1.0
    kwargs: Mapping[str, Any] = field(default_factory=dict)


def as_score_dict(name: str, result: Any) -> dict[str, Any]:
    """A verifier's return value as ``{"score": float, **extras}``; raises ``TypeError`` if malformed."""
    if isinstance(result, Mapping):
        if "score" not in result:
            raise TypeError(f"verifier {name!r} returned a dict without 'score': keys {sorted(result)}")
        out = dict(result)
    else:
        out = {"score": result}
    score = out["score"]
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(float(score)):
        raise TypeError(f"verifier {name!r} returned score {score!r}; a finite int or float is required")
    out["score"] = float(score)
    return out


def score_sample(
    calls: Sequence[ResolvedCall], data_source: str, solution_str: str, ground_truth: Any, extra_info: Any
) -> dict[str, Any] | None:
    """The weighted sum of the verifiers' scores, with their extra fields; None when every verifier abstained.

    With one verifier its extra fields are returned as they are; with
    several, each one's fields (its score included) are prefixed by its name
    (``format/score``). A verifier abstains by returning None (it cannot
    decide this sample: ``reward.combine=fallback`` then takes the reward
    model's score); among several, one that abstains adds 0.
    """
    results = [call.fn(data_source, solution_str, ground_truth, extra_info, **call.kwargs) for call in calls]
    if all(result is None for result in results):
        return None
    if len(calls) == 1:
        out = as_score_dict(calls[0].name, results[0])
        out["score"] *= calls[0].weight
        return out
    combined: dict[str, Any] = {"score": 0.0}
    for call, result in zip(calls, results):
        part = as_score_dict(call.name, 0.0 if result is None else result)
        combined["score"] += call.weight * part["score"]
        combined.update({f"{call.name}/{k}": v for k, v in part.items()})
    return combined

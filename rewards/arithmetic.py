"""Verifier ``arithmetic``: the response's leading integer must equal the ground truth.

The answer of a response is its **leading integer**: after optional leading
whitespace, an optional ``-`` followed by one or more digits, read as far as
the digits go (``"7"``, ``"7 because"``, ``"7<eos>"`` all answer 7; ``"72"``
answers 72; ``"x7"`` and ``""`` answer nothing). The score is 1.0 when that
integer equals ``int(ground_truth)``, else 0.0. The response text is the
decoded response up to EOS, special tokens removed, as the reward manager
passes it.

Used by the synthetic task (:mod:`hybridflow.data.synthetic`, data_source
``synthetic/arithmetic``); it suits any task whose answer is one integer
written first.
"""

from __future__ import annotations

import re
from typing import Any

from hybridflow.plugins import RewardVerifier, hookimpl

__all__ = ["compute_score", "leading_integer"]

_LEADING_INTEGER = re.compile(r"\s*(-?\d+)")


def leading_integer(text: str) -> int | None:
    """The integer a response starts with (see the module docstring), or None."""
    match = _LEADING_INTEGER.match(text)
    if match is None:
        return None
    try:
        return int(match.group(1))
    except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits)
        return None


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """1.0 iff the response's leading integer equals the ground truth, else 0.0."""
    answer = leading_integer(solution_str) if isinstance(solution_str, str) else None
    if answer is None:
        return 0.0
    try:
        expected = int(str(ground_truth).strip())
    except ValueError:
        return 0.0
    return 1.0 if answer == expected else 0.0


@hookimpl
def hybridflow_register_reward_verifiers(register):
    register(RewardVerifier(name="arithmetic", fn=compute_score))

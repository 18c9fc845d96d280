"""``my_reward``: partial credit for an integer answer close to the truth (a template verifier).

The answer a of a response is its leading integer (optional whitespace, an
optional ``-``, digits); y = int(ground_truth)::

    score = max(0, 1 - |a - y| / tolerance)      # 1 for the exact answer
    score = 0                                    # no leading integer, or y not an integer

The returned dict also carries ``exact`` (1.0 or 0.0); the reward manager
logs every numeric extra field as a metric (``reward/exact/mean``).

Route a data_source to it with ``reward.route``, e.g.
``'+reward.route={synthetic/arithmetic:my_reward}'``, and set its option with
``'+reward.verifier_kwargs={my_reward:{tolerance:2}}'`` (dict-valued keys take a leading ``+``).
"""

from __future__ import annotations

import re
from typing import Any

from hybridflow.plugins import RewardVerifier, hookimpl

_LEADING_INTEGER = re.compile(r"\s*(-?\d+)")


def my_reward_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, *, tolerance: float = 4.0
) -> dict[str, float]:
    """Partial credit for the response's leading integer: 1 when exact, falling to 0 at ``tolerance`` away.

    Returns ``{"score": max(0, 1 - |answer - truth| / tolerance), "exact": 1.0 or 0.0}``.

    Called by the reward manager's worker processes once per response, with
    the response decoded up to EOS. It must not raise on odd text: anything
    that is not an integer scores 0.
    """
    match = _LEADING_INTEGER.match(solution_str)
    try:
        truth = int(str(ground_truth).strip())
    except ValueError:
        return {"score": 0.0, "exact": 0.0}
    if match is None:
        return {"score": 0.0, "exact": 0.0}
    distance = abs(int(match.group(1)) - truth)
    return {"score": max(0.0, 1.0 - distance / tolerance), "exact": float(distance == 0)}


@hookimpl
def hybridflow_register_reward_verifiers(register):
    """Called once per process by hybridflow's plugin manager: describe, do no work."""
    register(RewardVerifier(name="my_reward", fn=my_reward_score))

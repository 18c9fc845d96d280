"""Verifier ``tool_task``: the synthetic tool task's answer (:mod:`hybridflow.data.synthetic_tool`).

The solution string is what the policy wrote, all turns joined (the reward
manager decodes the loss-masked tokens: observations are not in it). In the
``compact`` format every ``?`` the policy wrote ended a turn and called the
tool, so the **answer** is the text after the last ``?`` and the policy
**called** the tool iff the text holds a ``?``. Score::

    1.0                     the answer's leading integer equals the ground truth
    call_bonus (0.1)        wrong or no answer, but the tool was called
    0.0                     otherwise

The small bonus for calling is the task's shaping: an untrained policy calls
the tool about once in 32 samples and would otherwise first learn to guess
(which scores 0.2 at best); with it, calling pays before reading the
observation does. Validation accuracy counts scores >= 1 only: right answers.
"""

from __future__ import annotations

from typing import Any

from hybridflow.plugins import RewardVerifier, hookimpl
from hybridflow.rewards.arithmetic import leading_integer

__all__ = ["compute_score"]


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, *, call_bonus: float = 0.1
) -> dict[str, float]:
    """1.0 for the right final answer, ``call_bonus`` for a call without it, else 0.0; also ``called``."""
    text = solution_str if isinstance(solution_str, str) else ""
    called = "?" in text
    answer = leading_integer(text.rsplit("?", 1)[-1])
    try:
        right = answer is not None and answer == int(str(ground_truth).strip())
    except ValueError:
        right = False
    score = 1.0 if right else (call_bonus if called else 0.0)
    return {"score": score, "called": float(called)}


@hookimpl
def hybridflow_register_reward_verifiers(register):
    register(RewardVerifier(name="tool_task", fn=compute_score))

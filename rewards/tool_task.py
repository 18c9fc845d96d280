"""Verifier ``tool_task``: the synthetic tool task's answer (:mod:`hybridflow.data.synthetic_tool`).

The solution string is what the policy wrote, all turns joined (the reward
manager decodes the loss-masked tokens: observations are not in it). In the
``compact`` format a turn ends at ``?``, so the **answer** is the text after
the last ``?``. Whether the policy **called** the tool is not read from its
text (``5?`` looks like a call but is a malformed one): it is
``extra_info["tool_calls"]``, which the agent loop counted
(``agents/runner.py``). Score::

    1.0                     the answer's leading integer equals the ground truth
    call_bonus (0.1)        the tool was called and an integer answered, but the wrong one
    0.0                     otherwise (no answer, or a wrong one without a call)

The small bonus is the task's shaping: an untrained policy calls the tool
about once in 32 samples and would otherwise first learn to guess (which
scores 0.2 at best); with it, calling and then answering pays before reading
the observation does. It needs an answer: with a bonus for the call alone, a
measured run learned to call and then stop (every sample 0.1, so GRPO saw no
difference between them and never learned to read). Validation accuracy
counts scores >= 1 only: right answers.
"""

from __future__ import annotations

from typing import Any

from hybridflow.plugins import RewardVerifier, hookimpl
from hybridflow.rewards.arithmetic import leading_integer

__all__ = ["compute_score"]


def compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, *, call_bonus: float = 0.1
) -> dict[str, float]:
    """1.0 for the right final answer, ``call_bonus`` for a call and a wrong one, else 0.0; also ``called``."""
    text = solution_str if isinstance(solution_str, str) else ""
    calls = extra_info.get("tool_calls", 0) if isinstance(extra_info, dict) else 0
    called = isinstance(calls, int) and calls > 0
    answer = leading_integer(text.rsplit("?", 1)[-1])
    try:
        right = answer is not None and answer == int(str(ground_truth).strip())
    except ValueError:
        right = False
    score = 1.0 if right else (call_bonus if called and answer is not None else 0.0)
    return {"score": score, "called": float(called)}


@hookimpl
def hybridflow_register_reward_verifiers(register):
    register(RewardVerifier(name="tool_task", fn=compute_score))

"""``format``: a reward for the reasoning format ``<think>...</think>`` then an answer.

The response must be exactly one ``<think>`` block (non-empty, at the very
start, leading whitespace aside) followed by a non-empty answer that opens
no further ``<think>``. Score 1.0 or 0.0; it says nothing about correctness.

Combine it with a correctness verifier by weights in the reward routes, for
example ``reward.route={"openai/gsm8k": {"format": 0.1, "gsm8k": 0.9}}``
(see :mod:`hybridflow.rewards.routing`).
"""

from __future__ import annotations

import re
from typing import Any

from hybridflow.plugins import RewardVerifier, hookimpl

_THINK_THEN_ANSWER = re.compile(r"\A\s*<think>(?P<think>.*?)</think>(?P<answer>.*)\Z", re.DOTALL)


def follows_think_format(text: str) -> bool:
    """Whether ``text`` is one non-empty think block followed by a non-empty answer."""
    match = _THINK_THEN_ANSWER.match(text)
    if match is None:
        return False
    think, answer = match.group("think"), match.group("answer")
    if "<think>" in think or not think.strip():
        return False
    return bool(answer.strip()) and "<think>" not in answer and "</think>" not in answer


def format_score(data_source: str, solution_str: str, ground_truth: Any = None, extra_info: Any = None) -> float:
    """1.0 when the response is ``<think>reasoning</think>`` then an answer, else 0.0."""
    return 1.0 if follows_think_format(solution_str) else 0.0


@hookimpl
def hybridflow_register_reward_verifiers(register):
    register(RewardVerifier(name="format", fn=format_score))

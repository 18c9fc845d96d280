"""``math``: the final answer of a response, checked by math-verify.

The answer is the content of the **last** ``\\boxed{...}`` (or ``\\fbox``) in
the response; a response without one is read as plain text, where
math-verify picks the final answer ("the answer is 3/4", the last number).
The ground truth is read as if it were boxed. Equivalence is math-verify's:
numbers (``1/2``, ``0.5``, ``\\frac{1}{2}``), symbolic expressions
(``2\\sqrt{2}`` vs ``\\sqrt{8}``), intervals and sets.

Time: math-verify's own timeout uses ``signal.alarm``, which only works in a
process's main thread (elsewhere it raises, and a broad ``except`` then turns
every score into 0). It is switched off here (``parsing_timeout=None``,
``timeout_seconds=None``); the reward manager bounds each sample's wall time
in its worker processes instead. Parsing time grows fast with bracket
nesting (measured: 20 levels 1.3 s, 30 levels 2.8 s), so a candidate nested
deeper than :data:`MAX_NESTING` (or than the ground truth, plus 2) or longer
than :data:`MAX_ANSWER_CHARS` scores 0 without being parsed, reported as
``too_complex``.
"""

from __future__ import annotations

import logging
from typing import Any

from hybridflow.plugins import RewardVerifier, hookimpl

logger = logging.getLogger(__name__)

MAX_NESTING = 10
"""Deepest bracket nesting a candidate answer may have before it is refused."""
MAX_ANSWER_CHARS = 1000
"""Longest boxed answer that is parsed."""
PLAIN_TEXT_TAIL = 300
"""Without a box, only this many trailing characters are searched for an answer."""

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``, braces matched.

    Returns ``None`` when there is no box or the last one is never closed.
    ``\\boxed 5`` (no braces) yields ``"5"``.
    """
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    cmd = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    i = start + len(cmd)
    if i < len(text) and text[i] == " ":  # "\boxed 5"
        rest = text[i + 1 :].split("$")[0].strip()
        return rest or None
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def nesting_depth(text: str) -> int:
    """Deepest nesting of ``()[]{}`` brackets in ``text`` (unbalanced closers ignored)."""
    depth = deepest = 0
    for ch in text:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}" and depth > 0:
            depth -= 1
    return deepest


def _parse(text: str) -> list[Any]:
    from math_verify import parse  # heavy import (sympy), done once per process on first use

    return parse(text, parsing_timeout=None)


def _verify(gold: list[Any], pred: list[Any]) -> bool:
    from math_verify import verify

    return bool(verify(gold, pred, timeout_seconds=None))


def math_answer_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None
) -> dict[str, float]:
    """1.0 when the response's final answer equals the ground truth under math-verify, else 0.0.

    Returns ``{"score", "too_complex"}``; ``too_complex`` is 1.0 when the
    candidate was refused unparsed for its nesting depth or length. A
    ground truth that is not text or a number (``None`` above all, whose
    ``str`` would make ``\\boxed{None}`` correct) raises, so the sample is
    counted as a reward error (a failed sample: ``reward.on_failure``).
    """
    if isinstance(ground_truth, bool) or not isinstance(ground_truth, (str, int, float)):
        raise TypeError(
            f"math ground truth must be text or a number, got {type(ground_truth).__name__}: {ground_truth!r}"
        )
    # math-verify reads a dollar-wrapped answer inside \boxed{} as the bare one ($6$, $$\frac{1}{2}$$): no stripping
    gold_text = str(ground_truth).strip()
    boxed = last_boxed(solution_str)
    candidate = boxed if boxed is not None else solution_str[-PLAIN_TEXT_TAIL:]
    limit = max(MAX_NESTING, nesting_depth(gold_text) + 2)
    if nesting_depth(candidate) > limit or (boxed is not None and len(boxed) > MAX_ANSWER_CHARS):
        logger.debug(
            "math answer refused unparsed: nesting %d (limit %d), length %d",
            nesting_depth(candidate),
            limit,
            len(candidate),
        )
        return {"score": 0.0, "too_complex": 1.0}
    gold = _parse("\\boxed{" + gold_text + "}")
    if not gold:
        raise ValueError(f"math-verify could not parse the ground truth {gold_text[:200]!r}")
    pred = _parse("\\boxed{" + boxed + "}") if boxed is not None else _parse(candidate)
    correct = bool(pred) and _verify(gold, pred)
    return {"score": 1.0 if correct else 0.0, "too_complex": 0.0}


@hookimpl
def hybridflow_register_reward_verifiers(register):
    register(RewardVerifier(name="math", fn=math_answer_score, preload=("math_verify",)))

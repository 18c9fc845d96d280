"""``gsm8k`` and ``gsm8k_flexible``: numeric answers in the GSM8K convention.

The ground truth is the text after the last ``####`` (the whole string when
there is none). Two readings of the response, registered as two verifiers:

* ``gsm8k`` (strict): the number right after the last ``####`` in the
  response; no ``####``, no answer.
* ``gsm8k_flexible``: the last number anywhere in the response.

Numbers are normalized before they are compared as exact decimals: thousands
commas, a dollar sign, trailing units or words and a trailing period are
dropped, so ``$1,234.00.`` equals ``1234``. A score is 1.0 or 0.0.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from hybridflow.plugins import RewardVerifier, hookimpl

# A number as people write it: optional sign and dollar sign, digits with
# optional thousands commas, optional decimals (".5" included).
_NUMBER = r"-?\$?\s?(?:\d[\d,]*(?:\.\d+)?|\.\d+)"
_STRICT = re.compile(r"####\s*(" + _NUMBER + ")")
_ANY_NUMBER = re.compile(_NUMBER)


def normalize_number(text: str) -> Decimal | None:
    """The exact value of a number written like ``-$1,234.50.`` (``None`` if there is none)."""
    match = _ANY_NUMBER.search(text.strip())
    if match is None:
        return None
    # what _NUMBER matches, less spaces, commas and the dollar sign, is always a literal Decimal reads
    return Decimal(re.sub(r"[\s,$]", "", match.group(0)))


def ground_truth_answer(ground_truth: str) -> Decimal | None:
    """The number after the last ``####`` of a GSM8K answer (or of the whole string)."""
    return normalize_number(str(ground_truth).rsplit("####", 1)[-1])


def extract_strict(solution_str: str) -> Decimal | None:
    """The number after the last ``####`` in the response, or ``None``."""
    matches = _STRICT.findall(solution_str)
    return normalize_number(matches[-1]) if matches else None


def extract_flexible(solution_str: str) -> Decimal | None:
    """The last number anywhere in the response, or ``None``."""
    matches = _ANY_NUMBER.findall(solution_str)
    return normalize_number(matches[-1]) if matches else None


def _score(predicted: Decimal | None, ground_truth: str) -> float:
    expected = ground_truth_answer(ground_truth)
    if expected is None:
        raise ValueError(f"gsm8k ground truth has no number: {str(ground_truth)[:200]!r}")
    return 1.0 if predicted is not None and predicted == expected else 0.0


def gsm8k_strict_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    """1.0 when the number after the response's last ``####`` equals the ground truth's."""
    return _score(extract_strict(solution_str), ground_truth)


def gsm8k_flexible_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    """1.0 when the last number in the response equals the ground truth's."""
    return _score(extract_flexible(solution_str), ground_truth)


@hookimpl
def hybridflow_register_reward_verifiers(register):
    register(RewardVerifier(name="gsm8k", fn=gsm8k_strict_score))
    register(RewardVerifier(name="gsm8k_flexible", fn=gsm8k_flexible_score))

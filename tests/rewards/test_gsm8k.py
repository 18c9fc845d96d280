"""The ``gsm8k`` (strict) and ``gsm8k_flexible`` verifiers."""

from decimal import Decimal

import pytest

from hybridflow.plugins import get_reward_verifier
from hybridflow.rewards.gsm8k import gsm8k_flexible_score, gsm8k_strict_score, normalize_number

GT = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether she sold 48+24 = <<48+24=72>>72 clips.\n#### 72"

# (response, ground truth, strict score, flexible score)
CASES = [
    ("She sold 72 clips.\n#### 72", GT, 1.0, 1.0),
    ("#### 72", "72", 1.0, 1.0),
    ("####72", GT, 1.0, 1.0),
    ("The answer is 72", GT, 0.0, 1.0),  # no ####: strict finds nothing
    ("#### 71", GT, 0.0, 0.0),
    ("#### 72\nWait, I think it is 73.", GT, 1.0, 0.0),  # strict reads after ####, flexible the last number
    ("First #### 70 then #### 72", GT, 1.0, 1.0),  # the last #### wins
    ("#### 1,234", "#### 1234", 1.0, 1.0),  # thousands comma
    ("#### $18", "#### 18", 1.0, 1.0),  # dollar sign
    ("#### 18 dollars.", "#### 18", 1.0, 1.0),  # units and period
    ("It costs $18.00.", "#### 18", 0.0, 1.0),  # trailing zeros, dollar, period
    ("#### 18.5", "#### 18", 0.0, 0.0),
    ("#### -5", "#### -5", 1.0, 1.0),
    ("#### 5", "#### -5", 0.0, 0.0),
    ("The total is 1,000,000 dollars", "#### 1000000", 0.0, 1.0),
    ("no numbers here", GT, 0.0, 0.0),
    ("", GT, 0.0, 0.0),
    ("#### .5", "#### 0.5", 1.0, 1.0),
    ("I computed 3 + 4 = 7 so #### 7.", "7", 1.0, 1.0),
]


@pytest.mark.parametrize(("response", "ground_truth", "strict", "flexible"), CASES)
def test_gsm8k_cases(response, ground_truth, strict, flexible):
    assert gsm8k_strict_score("openai/gsm8k", response, ground_truth, None) == strict
    assert gsm8k_flexible_score("openai/gsm8k", response, ground_truth, None) == flexible


def test_enough_cases():
    assert len(CASES) >= 15


@pytest.mark.parametrize(
    ("text", "value"),
    [("$1,234.50.", Decimal("1234.50")), ("-7 apples", Decimal("-7")), ("none", None), ("$ 3", Decimal("3"))],
)
def test_normalize_number(text, value):
    assert normalize_number(text) == value


def test_ground_truth_without_number_raises():
    with pytest.raises(ValueError, match="no number"):
        gsm8k_strict_score("openai/gsm8k", "#### 3", "#### many", None)


def test_registered_as_plugins():
    assert get_reward_verifier("gsm8k").fn is gsm8k_strict_score
    assert get_reward_verifier("gsm8k_flexible").fn is gsm8k_flexible_score


@pytest.mark.parametrize(
    "text,value",
    [("-$ .5", "-0.5"), ("1,,2,", "12"), ("$-3", "-3"), ("--7", "-7"), ("1.2.3", "1.2"), ("- $ 4,000.", "4000")],
)
def test_every_number_the_pattern_finds_is_one_decimal_reads(text, value):
    """The pattern admits only what Decimal parses, so a model's oddest number never raises inside the verifier."""
    assert normalize_number(text) == Decimal(value)

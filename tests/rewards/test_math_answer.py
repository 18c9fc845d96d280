"""The ``math`` verifier on a table of answer pairs, plus its helpers."""

import time

import pytest

from hybridflow.plugins import get_reward_verifier
from hybridflow.rewards.math_answer import MAX_NESTING, last_boxed, math_answer_score, nesting_depth

# (response, ground truth, expected score): equivalent forms score 1, others 0.
CASES = [
    # fractions, decimals, integers
    (r"The answer is \boxed{\frac{1}{2}}.", "0.5", 1.0),
    (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
    (r"\boxed{1/2}", r"\frac12", 1.0),
    (r"\boxed{\dfrac{3}{4}}", "0.75", 1.0),
    (r"\boxed{0.25}", r"\frac{1}{3}", 0.0),
    (r"\boxed{42}", "42", 1.0),
    (r"\boxed{42.0}", "42", 1.0),
    (r"\boxed{-7}", "-7", 1.0),
    (r"\boxed{7}", "-7", 0.0),
    (r"\boxed{43}", "42", 0.0),
    (r"\boxed{1,000}", "1000", 1.0),
    (r"\boxed{10\%}", r"10\%", 1.0),
    # radicals and symbolic forms
    (r"\boxed{\sqrt{8}}", r"2\sqrt{2}", 1.0),
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", 1.0),
    (r"\boxed{\sqrt{2}}", r"2\sqrt{2}", 0.0),
    (r"\boxed{\frac{\sqrt{3}}{3}}", r"\frac{1}{\sqrt{3}}", 1.0),
    (r"\boxed{\pi}", r"\pi", 1.0),
    (r"\boxed{2\pi}", r"\pi", 0.0),
    (r"\boxed{x^2+2x+1}", r"(x+1)^2", 1.0),
    (r"\boxed{x^2+1}", r"(x+1)^2", 0.0),
    (r"\boxed{\frac{6}{4}}", r"\frac{3}{2}", 1.0),
    (r"\boxed{x^2}", "x^3", 0.0),
    (r"\boxed{\sqrt{3}}", "3", 0.0),
    (r"\boxed{\frac{2}{3}}", "0.67", 0.0),
    (r"\boxed{\sin^2 x + \cos^2 x}", "1", 1.0),
    (r"\boxed{3 + 2i}", "3+2i", 1.0),
    (r"\boxed{2^{10}}", "1024", 1.0),
    (r"\boxed{\log_2 8}", "3", 1.0),
    # intervals and sets
    (r"\boxed{[1, 2)}", "[1,2)", 1.0),
    (r"\boxed{(1, 2)}", "[1,2)", 0.0),
    (r"\boxed{(-\infty, 3]}", r"(-\infty,3]", 1.0),
    (r"\boxed{\{3, 1, 2\}}", r"\{1,2,3\}", 1.0),
    (r"\boxed{\{1, 2\}}", r"\{1,2,3\}", 0.0),
    (r"\boxed{x = 5}", "5", 1.0),
    (r"\boxed{5}", "x = 6", 0.0),
    (r"\boxed{[1, 2]}", "(1,2)", 0.0),
    # the last box wins; an earlier wrong box does not count
    (r"First \boxed{3}, but correcting myself: \boxed{4}", "4", 1.0),
    (r"First \boxed{4}, but correcting myself: \boxed{3}", "4", 0.0),
    (r"\fbox{12}", "12", 1.0),
    (r"nested \boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}", 1.0),
    # plain text, no box
    ("The final answer is 42.", "42", 1.0),
    ("So we get 3/4 in the end.", r"\frac{3}{4}", 1.0),
    ("Therefore the answer is $\\frac{1}{2}$.", "0.5", 1.0),
    ("The final answer is 41.", "42", 0.0),
    ("The answer is 12 apples.", "13", 0.0),
    ("I cannot solve this.", "42", 0.0),
    ("", "42", 0.0),
    (r"\boxed{}", "42", 0.0),
    (r"\boxed{unclosed 42", "7", 0.0),
    # ground truth written with dollars
    (r"\boxed{6}", "$6$", 1.0),
]


@pytest.mark.parametrize(("response", "ground_truth", "expected"), CASES)
def test_math_pairs(response, ground_truth, expected):
    assert math_answer_score("lighteval/MATH", response, ground_truth, None)["score"] == expected


def test_table_is_large_and_balanced():
    assert len(CASES) >= 40
    assert sum(e == 1.0 for *_, e in CASES) >= 15 and sum(e == 0.0 for *_, e in CASES) >= 15


def test_registered_as_plugin():
    assert get_reward_verifier("math").fn is math_answer_score


@pytest.mark.parametrize(
    ("text", "box"),
    [
        (r"a \boxed{1} b \boxed{\frac{2}{3}} c", r"\frac{2}{3}"),
        (r"\boxed{{a}{b}}", "{a}{b}"),
        (r"\boxed 5$", "5"),
        ("no box", None),
        (r"\boxed{open", None),
    ],
)
def test_last_boxed(text, box):
    assert last_boxed(text) == box


def test_nesting_depth():
    assert nesting_depth("(a[b{c}])") == 3
    assert nesting_depth("()()") == 1 and nesting_depth("(()(()))") == 3  # each closer goes back one level
    assert nesting_depth(")))(") == 1
    assert nesting_depth("x") == 0


def test_deep_nesting_is_refused_fast():
    deep = MAX_NESTING + 5
    response = r"\boxed{" + "(" * deep + "1" + ")" * deep + "}"
    start = time.monotonic()
    result = math_answer_score("math", response, "1", None)
    assert result == {"score": 0.0, "too_complex": 1.0}
    assert time.monotonic() - start < 0.5


def test_nesting_within_limit_is_parsed():
    response = r"\boxed{" + "(" * 3 + "1" + ")" * 3 + "}"
    assert math_answer_score("math", response, "1", None) == {"score": 1.0, "too_complex": 0.0}


def test_unparseable_ground_truth_raises():
    with pytest.raises(ValueError, match="ground truth"):
        math_answer_score("math", r"\boxed{1}", "", None)


def test_the_nesting_limit_is_ten_or_the_ground_truths_depth_plus_two():
    def nested(depth: int) -> str:
        return "(" * depth + "1" + ")" * depth

    # the documented numbers, written out: a test that read MAX_NESTING would move with it
    assert math_answer_score("math", r"\boxed{" + nested(10) + "}", "1")["too_complex"] == 0.0
    assert math_answer_score("math", r"\boxed{" + nested(11) + "}", "1")["too_complex"] == 1.0
    gold = nested(10)  # a deeper ground truth lets a candidate go two levels deeper still
    assert math_answer_score("math", r"\boxed{" + nested(12) + "}", gold)["too_complex"] == 0.0
    assert math_answer_score("math", r"\boxed{" + nested(13) + "}", gold)["too_complex"] == 1.0


def test_a_boxed_answer_of_up_to_1000_characters_is_parsed():
    number = "1" + "0" * 999  # 10^999: 1000 characters, the limit
    assert math_answer_score("math", r"\boxed{" + number + "}", number) == {"score": 1.0, "too_complex": 0.0}
    longer = number + "0"
    assert math_answer_score("math", r"\boxed{" + longer + "}", longer) == {"score": 0.0, "too_complex": 1.0}


def test_without_a_box_only_the_last_300_characters_are_read():
    # the tail starts exactly at the 7: one character more reads 17, one fewer reads no number at all
    response = "17" + " " * 299
    assert math_answer_score("math", response, "7")["score"] == 1.0
    assert math_answer_score("math", response, "17")["score"] == 0.0


def test_ground_truths_that_are_not_text_or_a_number_are_refused():
    assert math_answer_score("math", r"\boxed{42}", 42)["score"] == 1.0
    assert math_answer_score("math", r"\boxed{0.5}", 0.5)["score"] == 1.0
    for bad in (None, True, ["42"]):
        with pytest.raises(TypeError, match="math ground truth must be text or a number"):
            math_answer_score("math", r"\boxed{42}", bad)
    assert math_answer_score("math", r"\boxed{6}", "$$ 6 $$")["score"] == 1.0  # dollars stripped to the end
    assert math_answer_score("math", r"\boxed{6}", "$6")["score"] == 1.0  # a lone dollar is not a pair


@pytest.mark.parametrize(
    ("text", "box"),
    [
        (r"ends with \boxed", None),
        (r"\boxed $", None),
        (r"\boxed{1} then \fbox{2}", "2"),
        (r"\fbox{1} then \boxed{2}", "2"),
        (r"\boxed{a}}", "a"),
        (r"\boxed{{a}", None),
        (r"\boxed~{5}", None),  # only a brace or a space may follow the command
        (r"\boxed({5})", None),
        (r"\boxed{a~b|c}", "a~b|c"),  # only a brace closes
        (r"x\boxed 5", "5"),  # the answer starts after the space wherever the box starts
        ("\\boxed\n5", None),
        ("x" * 300 + r"\boxed", None),  # a box at the very end of a long response
    ],
)
def test_last_boxed_edges(text, box):
    assert last_boxed(text) == box


@pytest.mark.parametrize(
    ("ground_truth", "response"),
    [
        ("$6$", r"\boxed{6}"),
        ("$$6$$", r"\boxed{6}"),
        ("$ 6 $", r"\boxed{6}"),
        (r"$\frac{1}{2}$", r"\boxed{0.5}"),
        (r"$$ \sqrt{2} $$", r"\boxed{\sqrt{2}}"),
        ("$[1,2)$", r"\boxed{[1, 2)}"),
        (r"$\{1,2\}$", r"\boxed{\{2, 1\}}"),
    ],
)
def test_a_ground_truth_in_dollars_reads_as_the_bare_answer(ground_truth, response):
    assert math_answer_score("math", response, ground_truth)["score"] == 1.0

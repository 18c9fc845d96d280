"""The ``format`` and ``custom`` verifiers, routing, and combining verifiers by weight."""

import pytest

from hybridflow.rewards.custom import custom_score, load_function
from hybridflow.rewards.format import format_score
from hybridflow.rewards.gsm8k import gsm8k_strict_score
from hybridflow.rewards.routing import DEFAULT_ROUTES, Router, UnroutedDataSourceError
from hybridflow.rewards.scoring import ResolvedCall, as_score_dict, score_sample


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>add 2 and 2</think> #### 4", 1.0),
        ("\n <think>\nreasoning\n</think>\nThe answer is 4", 1.0),
        ("#### 4", 0.0),  # no think block
        ("<think>reasoning</think>", 0.0),  # no answer
        ("<think>  </think> 4", 0.0),  # empty reasoning
        ("intro <think>r</think> 4", 0.0),  # text before the think block
        ("<think>a</think> 4 <think>b</think> 5", 0.0),  # a second block
        ("<think>a <think>b</think> 4", 0.0),  # nested open tag
        ("<think>a</think> 4 </think>", 0.0),  # stray close tag
    ],
)
def test_format(text, expected):
    assert format_score("openai/gsm8k", text, None, None) == expected


def test_weighted_combination():
    calls = (ResolvedCall("format", format_score, 0.2), ResolvedCall("gsm8k", gsm8k_strict_score, 0.8))
    good = score_sample(calls, "openai/gsm8k", "<think>2+2</think> #### 4", "4", None)
    assert good == {"score": pytest.approx(1.0), "format/score": 1.0, "gsm8k/score": 1.0}
    wrong_format = score_sample(calls, "openai/gsm8k", "#### 4", "4", None)
    assert wrong_format["score"] == pytest.approx(0.8)
    wrong_answer = score_sample(calls, "openai/gsm8k", "<think>x</think> #### 5", "4", None)
    assert wrong_answer["score"] == pytest.approx(0.2)


@pytest.mark.parametrize("bad", [{"value": 1.0}, "1.0", float("nan"), True, None])
def test_malformed_scores_are_errors(bad):
    with pytest.raises(TypeError):
        as_score_dict("v", bad)


def test_routes_exact_glob_and_defaults():
    router = Router({"my/*": "math", "mixed": {"format": 0.1, "gsm8k": 0.9}, "openai/gsm8k": "gsm8k_flexible"})
    assert [c.name for c in router.resolve("my/data")] == ["math"]
    assert [c.name for c in router.resolve("lighteval/MATH")] == ["math"]  # a default
    assert [c.name for c in router.resolve("aime2024")] == ["math"]  # a default glob
    assert [c.name for c in router.resolve("openai/gsm8k")] == ["gsm8k_flexible"]  # user overrides default
    assert [(c.name, c.weight) for c in router.resolve("mixed")] == [("format", 0.1), ("gsm8k", 0.9)]
    assert DEFAULT_ROUTES["openai/gsm8k"] == "gsm8k"


def test_user_glob_before_default_glob():
    assert [c.name for c in Router({"aime_special*": "gsm8k"}).resolve("aime_special_1")] == ["gsm8k"]


def test_unrouted_data_source_lists_routes():
    with pytest.raises(UnroutedDataSourceError) as err:
        Router({"mine": "math"}).resolve("unknown/source")
    message = str(err.value)
    assert "unknown/source" in message and "mine -> math" in message and "openai/gsm8k -> gsm8k" in message


def test_verifier_kwargs_reach_calls():
    router = Router({"c": "code"}, verifier_kwargs={"code": {"timeout_s": 2.0}})
    assert router.resolve("c")[0].kwargs == {"timeout_s": 2.0}


USER_FILE = """
def my_score(data_source, solution_str, ground_truth, extra_info, bonus=0.0):
    return {"score": float(solution_str == ground_truth) + bonus, "length": len(solution_str)}

helper = 3
"""


def test_custom_function_from_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(USER_FILE)
    router = Router(custom_reward_function={"path": str(path), "name": "my_score", "kwargs": {"bonus": 0.5}})
    (call,) = router.resolve("anything/at/all")  # no route: everything goes to the custom function
    assert [c.name for c in router.resolve("synthetic/arithmetic")] == ["custom"]  # even a default's exact route
    assert [c.name for c in Router({}, {"path": str(path)}).resolve("openai/gsm8k")] == ["custom"]  # the config's {}
    assert call.name == "custom" and call.kwargs == {"path": str(path), "name": "my_score", "bonus": 0.5}
    assert custom_score("d", "abc", "abc", None, **call.kwargs) == {"score": 1.5, "length": 3}
    assert custom_score("d", "abd", "abc", None, **call.kwargs) == {"score": 0.5, "length": 3}


def test_custom_function_errors(tmp_path):
    path = tmp_path / "r.py"
    path.write_text(USER_FILE)
    with pytest.raises(AttributeError, match="my_score"):
        load_function(str(path), "missing")
    with pytest.raises(FileNotFoundError):
        load_function(str(tmp_path / "nope.py"))
    with pytest.raises(ValueError, match="custom_reward_function"):
        Router({"x": "custom"})

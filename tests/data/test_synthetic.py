"""The synthetic task (data/synthetic.py) and its verifier ``arithmetic`` (rewards/arithmetic.py)."""

from __future__ import annotations

import collections
import re

import pyarrow.parquet as pq
import pytest

from hybridflow.data.synthetic import DATA_SOURCE, generate_synthetic, make_example
from hybridflow.plugins import get_reward_verifier
from hybridflow.rewards.arithmetic import compute_score, leading_integer

PROMPT = re.compile(r"^max\((\d),(\d),(\d),(\d)\)=$")


def _rows(path):
    return pq.read_table(path).to_pylist()


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    paths = generate_synthetic(str(tmp_path_factory.mktemp("synthetic")), train_size=3000, val_size=400, seed=0)
    return {name: _rows(path) for name, path in paths.items()}


def test_files_and_sizes(tmp_path):
    paths = generate_synthetic(str(tmp_path / "out"), train_size=50, val_size=20, seed=1)
    assert paths == {"train": str(tmp_path / "out" / "train.parquet"), "val": str(tmp_path / "out" / "val.parquet")}
    assert len(_rows(paths["train"])) == 50 and len(_rows(paths["val"])) == 20
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["train.parquet", "val.parquet"]


def test_schema_and_ground_truth(splits):
    for split, rows in splits.items():
        for index, row in enumerate(rows):
            assert row["data_source"] == DATA_SOURCE
            assert row["ability"] == "arithmetic"
            assert row["extra_info"] == {"split": split, "index": index}
            (message,) = row["prompt"]
            assert message["role"] == "user"
            digits = [int(d) for d in PROMPT.match(message["content"]).groups()]
            assert row["reward_model"] == {"ground_truth": str(max(digits)), "style": "rule"}


def test_train_and_val_prompts_are_disjoint(splits):
    train = {r["prompt"][0]["content"] for r in splits["train"]}
    val = {r["prompt"][0]["content"] for r in splits["val"]}
    assert len(val) > 150 and len(train) > 1500
    assert not train & val


def test_answers_are_uniform_over_two_to_nine(splits):
    """A policy that ignores the question must score about 1/8, never above 0.2."""
    for rows in splits.values():
        counts = collections.Counter(int(r["reward_model"]["ground_truth"]) for r in rows)
        assert sorted(counts) == list(range(2, 10))
        assert max(counts.values()) / len(rows) < 0.17


def test_deterministic_in_the_seed(tmp_path):
    a = generate_synthetic(str(tmp_path / "a"), train_size=200, val_size=50, seed=5)
    b = generate_synthetic(str(tmp_path / "b"), train_size=200, val_size=50, seed=5)
    c = generate_synthetic(str(tmp_path / "c"), train_size=200, val_size=50, seed=6)
    for split in ("train", "val"):
        assert _rows(a[split]) == _rows(b[split])
        assert _rows(a[split]) != _rows(c[split])


@pytest.mark.parametrize("sizes", [(0, 10), (10, 0)])
def test_bad_sizes(tmp_path, sizes):
    with pytest.raises(ValueError, match="must be positive"):
        generate_synthetic(str(tmp_path), train_size=sizes[0], val_size=sizes[1])


def test_make_example_checks_digits():
    assert make_example([0, 9, 3], split="train", index=2)["reward_model"]["ground_truth"] == "9"
    with pytest.raises(ValueError):
        make_example([1, 10], split="train", index=0)


@pytest.mark.parametrize(
    ("response", "answer"),
    [("7", 7), (" 7", 7), ("7)))", 7), ("7 8", 7), ("72", 72), ("-3x", -3), ("x7", None), ("", None), ("-", None)],
)
def test_leading_integer(response, answer):
    assert leading_integer(response) == answer


@pytest.mark.parametrize(
    ("response", "truth", "score"),
    [
        ("8", "8", 1.0),
        ("8====", "8", 1.0),
        ("\n8", "8", 1.0),
        ("08", "8", 1.0),
        ("88", "8", 0.0),
        ("9", "8", 0.0),
        ("7", "8", 0.0),  # below the truth is as wrong as above it
        ("-8", "8", 0.0),
        ("1000", "1000", 1.0),  # past CPython's cached small ints: compared by value
        ("-1000", " -1000 ", 1.0),
        ("max(8)", "8", 0.0),
        ("", "8", 0.0),
        ("8", "not a number", 0.0),
        ("9" * 5000, "9", 0.0),  # too long for int(): a 0, not a crash
    ],
)
def test_compute_score(response, truth, score):
    assert compute_score(DATA_SOURCE, response, truth) == score


def test_verifier_is_registered_as_a_plugin(splits):
    verifier = get_reward_verifier("arithmetic")
    assert verifier.fn is compute_score
    row = splits["val"][0]
    truth = row["reward_model"]["ground_truth"]
    assert verifier.fn(row["data_source"], truth, truth, row["extra_info"]) == 1.0

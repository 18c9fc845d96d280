"""Reward verifiers broken on purpose, each in one realistic way, for proving that the contract kit fails on them.

Module-level functions, so the kit's reward workers can import them (the test
puts this folder on ``sys.path``); the module imports nothing heavy (no
torch), so those workers start in a fraction of a second.
"""

import math
import random
import sys


def exact_match(data_source, solution_str, ground_truth, extra_info=None):
    """1.0 when the stripped response equals the ground truth."""
    return float(solution_str.strip() == str(ground_truth))


def nan_on_empty(data_source, solution_str, ground_truth, extra_info=None):
    """The share of lines that equal the ground truth: 0 / 0 = NaN for an empty response."""
    lines = solution_str.splitlines()
    hits = sum(line.strip() == str(ground_truth) for line in lines)
    return hits / len(lines) if lines else math.nan


def hangs_on_long(data_source, solution_str, ground_truth, extra_info=None):
    """A parser that never finishes on a long response."""
    while len(solution_str) > 10_000:
        pass
    return exact_match(data_source, solution_str, ground_truth)


def sampled_score(data_source, solution_str, ground_truth, extra_info=None):
    """A score with noise in it: not the same twice."""
    return exact_match(data_source, solution_str, ground_truth) + random.random()


def exits_on_non_ascii(data_source, solution_str, ground_truth, extra_info=None):
    """Ends its process on text it cannot encode, instead of raising."""
    if not solution_str.isascii():
        sys.exit("cannot score non-ASCII text")
    return exact_match(data_source, solution_str, ground_truth)


def raises_on_empty(data_source, solution_str, ground_truth, extra_info=None):
    """Exact match that raises ValueError on an empty response (allowed unless odd text must score)."""
    if not solution_str:
        raise ValueError("empty response")
    return exact_match(data_source, solution_str, ground_truth)

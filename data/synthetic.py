"""The default verifiable task: the largest of four digits.

A prompt is one user message ``"max(3,8,1,5)="``; the answer is ``"8"``.
The verifier ``arithmetic`` (:mod:`hybridflow.rewards.arithmetic`) scores
1.0 when the response starts with that integer. data_source:
``synthetic/arithmetic``.

Why this task. The demo must show a *randomly initialised* tiny policy learn
by RL alone, on two CPU cores, in minutes (validation accuracy from <= 0.2 to
>= 0.8), honestly: the reward is only the verifier's 0/1 and validation
prompts are never trained on. That asks for:

* a reward a random policy finds: the answer is one token (a digit) out of
  the built-in tokenizer's 32, so an untrained policy is right about 1 time
  in 32 (times the chance its next token is not another digit); with 8
  samples per prompt many groups hold a correct sample from the first steps,
  which is all GRPO needs;
* a low starting point: the answer (the maximum) is drawn uniformly from
  2..9 and the digits below it at random, so any policy that ignores the
  question scores about 1/8 (with i.i.d. digits, "always 9" would score
  0.34). Maxima 0 and 1 are left out: only 1 and 15 of the 10,000 tuples
  have them, so a uniform answer would make ``max(0,0,0,0)`` a tenth of the
  training set, an easy constant-answer trap that stalled early runs;
* a function a tiny transformer learns fast and that carries over to unseen
  prompts: the answer is *one of the prompt's tokens*, chosen by a rule
  shared by all prompts (attend to the largest digit, copy it). Every
  rewarded sample teaches the same attention-and-copy circuit.

What was measured (a throwaway on-policy GRPO loop with the built-in engine:
16 prompts x 8 samples, 8 response tokens, token-mean loss, AdamW lr 1e-3,
no KL, ``builtin:tiny-qwen2``, one CPU thread, about 0.25 s a step): greedy
validation accuracy 0.0 at step 0 for every seed; then, over four model
seeds, 1.0 at step 300, 0.87 at step 250, a plateau at 0.77 from step 400,
and 0.45 at step 600. The plateaus are collapsed policies (entropy gone, a
few digits confused), so the trainer's settings decide the rest. Variants
that did no better: three digits, hidden size 128. The first candidate,
``(a + b) mod 10`` over two-digit operands (a 10 x 10 table with no shared
structure), did not learn in 1,500 RL steps, nor in 600 *supervised* steps.

Splits: the 10,000 digit tuples are split once by a seeded permutation
(20% of them form the validation pool), so no validation prompt is ever a
training prompt. Rows are then drawn per split: the maximum ``m`` uniformly
from 2..9, then a tuple with maximum ``m`` from the pool, with replacement
(small maxima have few tuples: 65 in all have maximum 2, so such prompts
repeat, in both splits).

Rows follow veRL's parquet schema: ``data_source``, ``prompt`` (chat
messages), ``ability``, ``reward_model`` (``ground_truth``, ``style``) and
``extra_info`` (``split``, ``index``). Generation is deterministic in ``seed``.
"""

from __future__ import annotations

import logging
import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["DATA_SOURCE", "MIN_ANSWER", "NUM_DIGITS", "generate_synthetic", "make_example", "write_parquet_atomically"]

logger = logging.getLogger(__name__)

DATA_SOURCE = "synthetic/arithmetic"
NUM_DIGITS = 4
_NUM_TUPLES = 10**NUM_DIGITS
MIN_ANSWER = 2  # maxima 0 and 1 have 1 and 15 of the 10,000 tuples: see the module docstring
_VAL_POOL_FRACTION = 0.2


def make_example(digits: tuple[int, ...] | list[int], *, split: str, index: int) -> dict:
    """One row of the task (``max(d1,...,dk)=``) in veRL's schema."""
    if not digits or any(not 0 <= d <= 9 for d in digits):
        raise ValueError(f"digits must be a non-empty sequence of 0..9, got {digits!r}")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": "max(" + ",".join(str(d) for d in digits) + ")="}],
        "ability": "arithmetic",
        "reward_model": {"ground_truth": str(max(digits)), "style": "rule"},
        "extra_info": {"split": split, "index": index},
    }


def _tuple_digits(codes: np.ndarray) -> np.ndarray:
    """Tuple codes 0..9999 -> (N, NUM_DIGITS) digits, most significant first."""
    powers = 10 ** np.arange(NUM_DIGITS - 1, -1, -1)
    return (codes[:, None] // powers[None, :]) % 10


def _draw_rows(pool: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` tuple codes from ``pool``: the maximum uniform over those present, then a tuple."""
    maxima = _tuple_digits(pool).max(axis=1)
    by_max = [pool[maxima == m] for m in range(10)]
    present = np.array([m for m in range(MIN_ANSWER, 10) if len(by_max[m])])
    chosen_max = rng.choice(present, size=size)
    return np.array([by_max[m][rng.integers(len(by_max[m]))] for m in chosen_max], dtype=np.int64)


def write_parquet_atomically(rows: list[dict], path: str) -> None:
    """Write ``rows`` to ``path`` beside it, then rename: a concurrent reader or writer (two ranks, two jobs of a
    sweep) never sees a torn file."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".parquet.tmp")
    os.close(fd)
    try:
        pq.write_table(pa.Table.from_pylist(rows), tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def generate_synthetic(
    output_dir: str, *, train_size: int = 8192, val_size: int = 512, seed: int = 0
) -> dict[str, str]:
    """Write ``train.parquet`` and ``val.parquet`` of the task into ``output_dir``.

    :returns: split name (``"train"``, ``"val"``) -> parquet path.
    :raises ValueError: when a size is not positive.
    """
    if train_size < 1 or val_size < 1:
        raise ValueError(f"train_size ({train_size}) and val_size ({val_size}) must be positive")
    rng = np.random.default_rng(seed)
    codes = rng.permutation(_NUM_TUPLES)
    n_val = int(_NUM_TUPLES * _VAL_POOL_FRACTION)
    pools = {"train": codes[n_val:], "val": codes[:n_val]}
    os.makedirs(output_dir, exist_ok=True)
    paths = {}
    for split, size in (("train", train_size), ("val", val_size)):
        drawn = _tuple_digits(_draw_rows(pools[split], size, rng))
        rows = [make_example(tuple(int(d) for d in digits), split=split, index=i) for i, digits in enumerate(drawn)]
        paths[split] = os.path.join(output_dir, f"{split}.parquet")
        write_parquet_atomically(rows, paths[split])
        logger.info("wrote %d %s rows of %s to %s", len(rows), split, DATA_SOURCE, paths[split])
    return paths

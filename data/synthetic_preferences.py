"""Preference pairs on the default task (:mod:`hybridflow.data.synthetic`): what ``hybridflow-train-rm`` learns from.

Each row is a prompt of the task (``max(3,8,1,5)=``, as chat messages), a
``chosen`` response, the right answer (``"8"``, or, half the time, the answer
followed by a junk character and up to two more characters, ``"8)x"``, ``"8x12"``:
the verifier reads the leading integer, and an untrained policy that writes
several tokens puts the right digit first long before it learns to stop), and a ``rejected`` one, a
wrong answer, with ``data_source`` ``synthetic/arithmetic`` and ``extra_info``
(``split``, ``index``, ``rejected_kind``). A reward model trained on them is
meant to stand in for the task's verifier (``rewards/arithmetic.py``) in RL:
every chosen response scores 1.0 under that verifier and every rejected one
0.0. The rejected answers are of four kinds, each for a failure a policy shows
on this task (shares: :data:`REJECTED_KINDS`):

* ``prompt_digit`` (30%): one of the prompt's other digits, below the maximum,
  as a policy writes a digit: alone, followed by junk (as a chosen answer may
  be, so a trailing junk is no clue either way) or repeated (``"6666"``), a
  third of the time each (:func:`with_tail`).
  The hard negative: a reward model that only checks "the answer is a digit of
  the prompt" ranks it level with the right one, so it must find the maximum.
  A prompt whose digits are all the maximum (``max(5,5,5,5)``) gets an
  ``other_digit`` instead;
* ``above_max`` (20%): a digit above the maximum, so in no prompt digit,
  written as above. The other hard negative: without it a reward model learns
  "not one of the smaller digits" and pays any larger digit (measured: GRPO
  then answered 7 to every prompt);
* ``other_digit`` (10%): any digit but the answer, in the prompt or not (a prompt whose maximum is 9 has no
  ``above_max``: it gets this), written as above;
* ``junk`` (10%): zero to three of the built-in tokenizer's non-digit
  characters (``"(x"``, ``"="``; zero characters is the empty response, an
  immediate EOS). An untrained policy answers like this, so the first RL
  steps are scored on such responses: they must score below a right answer.
  The space is left out: under transformers 5 ``AutoTokenizer`` reloads the
  built-in tokenizer of a saved Qwen2 model as ``Qwen2Tokenizer``, whose
  byte-level pre-tokenizer drops it, so a text with a space would not score
  the same after the reward model is saved and loaded;
* ``longer_number`` (10%): the answer with one to three more digits after it
  (``"85"``, ``"8888"``). The verifier reads the leading integer (85 is not 8),
  and a policy that may write several tokens drifts into repeating its digit:
  a reward model that scored ``"8888"`` like ``"8"`` would pay it to;
* ``late_answer`` (20%): one or two junk characters, then the answer (``"(8"``,
  ``"x,8)"``). The verifier reads no integer at the start, so it scores 0; a
  reward model that learned "the answer is in the response" would pay it, and
  a policy finds that (measured: GRPO against a reward model trained without
  this kind raised the model's score for 300 steps at a validation accuracy of
  0).

What a policy writes decides what the set must cover: a reward model is only
trained where its pairs are, and RL searches the rest. Each kind above exists
because a GRPO run against a reward model trained without it found the hole
(a 4-token policy repeating a wrong digit, ``"6666"``, scored above a right
answer on prompts where 6 is not the maximum; a junk character before the
answer).

Splits and prompts are the task's own: the prompts are the rows
:func:`~hybridflow.data.synthetic.generate_synthetic` draws for ``seed``, so
the validation prompts come from its validation pool of digit tuples, never
trained on, and are the RL task's validation prompts for the same seed. The
rejected answers are drawn from a generator of their own (``[seed, 1]``), so
they leave the task's draws alone. Generation is deterministic in ``seed``.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile

import numpy as np
import pyarrow.parquet as pq

from hybridflow.data.synthetic import DATA_SOURCE, generate_synthetic, write_parquet_atomically

__all__ = [
    "JUNK_CHARACTERS",
    "REJECTED_KINDS",
    "SUFFIX_SHARE",
    "answer_with_junk",
    "generate_preferences",
    "rejected_answer",
    "with_junk",
    "with_tail",
]

logger = logging.getLogger(__name__)

JUNK_CHARACTERS = "+-*%=(),?aimnx"
"""The built-in tokenizer's characters that are neither digits nor the space (junk never maps to ``<unk>``, and
tokenizes alike before and after a save, see the module docstring)."""

REJECTED_KINDS = {
    "prompt_digit": 0.3,
    "above_max": 0.2,
    "other_digit": 0.1,
    "junk": 0.1,
    "longer_number": 0.1,
    "late_answer": 0.2,
}
"""Kind of wrong answer -> its share of the rejected responses (see the module docstring)."""

SUFFIX_SHARE = 0.5
"""The share of chosen answers, and of wrong-digit rejected ones, followed by one to three junk characters."""

_REJECTED_STREAM = 1  # the rejected answers' generator is seeded [seed, 1]: apart from the task's draws


def rejected_answer(digits: list[int], rng: np.random.Generator) -> tuple[str, str]:
    """A wrong answer to ``max(digits)=`` and its kind (one of :data:`REJECTED_KINDS`)."""
    answer = max(digits)
    kind = str(rng.choice(list(REJECTED_KINDS), p=list(REJECTED_KINDS.values())))
    below = sorted({d for d in digits if d != answer})
    if kind == "prompt_digit" and not below:
        kind = "other_digit"  # every digit is the maximum: the prompt has no other digit to offer
    if kind == "prompt_digit":
        return with_tail(str(rng.choice(below)), rng), kind
    if kind == "above_max" and answer == 9:
        kind = "other_digit"  # no digit is above 9
    if kind == "above_max":
        return with_tail(str(rng.integers(answer + 1, 10)), rng), kind
    if kind == "other_digit":
        return with_tail(str(rng.choice([d for d in range(10) if d != answer])), rng), kind
    if kind == "junk":
        return "".join(rng.choice(list(JUNK_CHARACTERS), size=int(rng.integers(0, 4)))), kind
    if kind == "late_answer":
        lead = "".join(rng.choice(list(JUNK_CHARACTERS), size=int(rng.integers(1, 3))))
        return with_junk(lead + str(answer), rng), kind
    return str(answer) + "".join(str(d) for d in rng.integers(0, 10, size=int(rng.integers(1, 4)))), kind


def with_junk(answer: str, rng: np.random.Generator) -> str:
    """``answer``, or (:data:`SUFFIX_SHARE` of the time) ``answer`` and one to three junk characters: the verifier
    reads the same integer from both."""
    return answer if rng.random() >= SUFFIX_SHARE else answer_with_junk(answer, rng)


def with_tail(digit: str, rng: np.random.Generator) -> str:
    """A wrong ``digit`` as a policy writes it: alone, with junk after it (as a chosen answer may have), or
    repeated up to four times (``"6666"``: a 4-token policy's favourite; the verifier reads 6666, not 6)."""
    tail = int(rng.integers(0, 3))
    if tail == 0:
        return digit
    if tail == 1:
        return answer_with_junk(digit, rng)
    return digit * int(rng.integers(2, 5))


def answer_with_junk(answer: str, rng: np.random.Generator) -> str:
    """``answer``, a junk character, then zero to two characters of junk or digits (``"8)"``, ``"8x12"``): the
    verifier reads the leading integer, which the junk character ends, so it reads ``answer`` from all of them."""
    tail = rng.choice(list(JUNK_CHARACTERS + "0123456789"), size=int(rng.integers(0, 3)))
    return answer + str(rng.choice(list(JUNK_CHARACTERS))) + "".join(tail)


def _digits(prompt: list[dict]) -> list[int]:
    """The digits of a task prompt (``max(3,8,1,5)=`` -> [3, 8, 1, 5])."""
    return [int(d) for d in re.findall(r"\d", prompt[-1]["content"])]


def _pairs(task_rows: list[dict], rng: np.random.Generator) -> list[dict]:
    """One preference row per task row: its prompt, the right answer, a wrong one."""
    rows = []
    for row in task_rows:
        rejected, kind = rejected_answer(_digits(row["prompt"]), rng)
        rows.append(
            {
                "prompt": row["prompt"],
                "chosen": with_junk(row["reward_model"]["ground_truth"], rng),
                "rejected": rejected,
                "data_source": DATA_SOURCE,
                "extra_info": {**row["extra_info"], "rejected_kind": kind},
            }
        )
    return rows


def generate_preferences(out_dir: str, seed: int = 0, *, train_size: int = 4096, val_size: int = 512) -> dict[str, str]:
    """Write ``train.parquet`` and ``val.parquet`` of preference pairs into ``out_dir``.

    :returns: split name (``"train"``, ``"val"``) -> parquet path.
    :raises ValueError: when a size is not positive.
    """
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng([seed, _REJECTED_STREAM])
    paths = {}
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".task-") as scratch:
        task = generate_synthetic(scratch, train_size=train_size, val_size=val_size, seed=seed)
        for split in ("train", "val"):
            rows = _pairs(pq.read_table(task[split]).to_pylist(), rng)
            paths[split] = os.path.join(out_dir, f"{split}.parquet")
            write_parquet_atomically(rows, paths[split])
            logger.info("wrote %d %s preference pairs of %s to %s", len(rows), split, DATA_SOURCE, paths[split])
    return paths

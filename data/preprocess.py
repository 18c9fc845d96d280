"""Convert public datasets to the training schema: ``python -m hybridflow.data.preprocess``.

::

    python -m hybridflow.data.preprocess gsm8k --input test-00000-of-00001.parquet   # to ~/data/gsm8k
    python -m hybridflow.data.preprocess math --input train.jsonl --split train       # to ~/data/math
    python -m hybridflow.data.preprocess synthetic --train-size 8192                  # to ~/data/synthetic
    python -m hybridflow.data.preprocess synthetic_tool --output runs/tool_data

The output directory is ``--output``, by default ``~/data/<dataset>`` as in
veRL's examples (``configs/data/gsm8k.yaml`` reads ``~/data/gsm8k``): a
dataset lives outside the source tree, whatever directory the command runs in.

Input files are the datasets as a user downloads them, jsonl or parquet:
GSM8K rows have ``question`` and ``answer`` (the reasoning, then
``#### 72``); MATH rows have ``problem`` and ``solution`` (answer in the
last ``\\boxed{}``), or an ``answer`` column (MATH-500), which wins. Output
is ``DIR/<split>.parquet`` in veRL's schema: ``data_source``, ``prompt``
(one user message: the question and an instruction), ``ability``,
``reward_model`` (``style``, ``ground_truth``) and ``extra_info``
(``split``, ``index`` and the original fields). The split is ``--split``,
else ``test`` when the file name says so, else ``train``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from hybridflow.rewards.gsm8k import ground_truth_answer
from hybridflow.rewards.math_answer import last_boxed

logger = logging.getLogger(__name__)

DEFAULT_OUTPUT_ROOT = "~/data"
"""Where each dataset's directory goes when ``--output`` is not given (``~/data/gsm8k``, as veRL's examples)."""

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def read_records(path: str) -> list[dict[str, Any]]:
    """Rows of a ``.jsonl`` / ``.json`` / ``.parquet`` file as dicts; errors name the file and line."""
    if path.endswith(".parquet"):
        return pq.read_table(path).to_pylist()
    with open(path, encoding="utf-8") as f:
        if path.endswith(".json"):
            data = json.load(f)
            if not isinstance(data, list):
                raise ValueError(f"{path}: expected a JSON list of records")
            return data
        records = []
        for number, line in enumerate(f, start=1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}, line {number}: not JSON: {exc}") from exc
        return records


def _require(path: str, index: int, record: dict[str, Any], fields: Sequence[str]) -> None:
    missing = [f for f in fields if not isinstance(record.get(f), str)]
    if missing:
        raise ValueError(f"{path}, row {index}: missing or non-text field(s) {missing}; the row has {sorted(record)}")


def gsm8k_row(record: dict[str, Any], *, split: str, index: int, path: str = "<input>") -> dict[str, Any]:
    """One GSM8K record (``question``, ``answer``) as a training row."""
    _require(path, index, record, ("question", "answer"))
    answer = ground_truth_answer(record["answer"])
    if answer is None or "####" not in record["answer"]:
        raise ValueError(f"{path}, row {index}: answer has no '#### <number>': {record['answer'][-80:]!r}")
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": f"{record['question']} {GSM8K_INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {
            "style": "rule",
            "ground_truth": record["answer"].rsplit("####", 1)[-1].strip().replace(",", ""),
        },
        "extra_info": {"split": split, "index": index, "question": record["question"], "answer": record["answer"]},
    }


def math_row(
    record: dict[str, Any], *, split: str, index: int, path: str = "<input>", data_source: str = "lighteval/MATH"
) -> dict[str, Any]:
    """One MATH record (``problem`` and ``solution`` or ``answer``) as a training row."""
    _require(path, index, record, ("problem",))
    answer = record.get("answer")
    if not isinstance(answer, str) or not answer.strip():
        solution = record.get("solution")
        answer = last_boxed(solution) if isinstance(solution, str) else None
    if not answer:
        raise ValueError(f"{path}, row {index}: no 'answer' field and no \\boxed{{}} answer in 'solution'")
    extra = {"split": split, "index": index}
    extra.update({k: str(record[k]) for k in ("level", "type", "subject", "unique_id") if k in record})
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": f"{record['problem']} {MATH_INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer.strip()},
        "extra_info": extra,
    }


def infer_split(path: str) -> str:
    """``test`` when the file name mentions test, else ``train``."""
    return "test" if "test" in os.path.basename(path).lower() else "train"


def convert(
    records: Iterable[dict[str, Any]], make_row: Callable[..., dict[str, Any]], *, split: str, path: str, **kwargs: Any
) -> list[dict[str, Any]]:
    """Training rows for ``records`` (``make_row`` is :func:`gsm8k_row` or :func:`math_row`)."""
    return [make_row(record, split=split, index=i, path=path, **kwargs) for i, record in enumerate(records)]


def write_rows(rows: list[dict[str, Any]], output_dir: str, split: str) -> str:
    """Write ``rows`` to ``output_dir/<split>.parquet``; returns the path."""
    if not rows:
        raise ValueError(f"no rows to write for split {split!r}")
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, f"{split}.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path)
    logger.info("wrote %d rows to %s", len(rows), path)
    return path


def default_output(dataset: str) -> str:
    """The output directory of ``dataset`` when ``--output`` is not given: ``~/data/<dataset>``, expanded."""
    return os.path.join(os.path.expanduser(DEFAULT_OUTPUT_ROOT), dataset)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hybridflow.data.preprocess",
        description="Convert public datasets to the training schema (veRL parquet).",
    )
    sub = parser.add_subparsers(dest="dataset", required=True)
    for name in ("gsm8k", "math"):
        p = sub.add_parser(name, help=f"convert a downloaded {name.upper()} file (jsonl or parquet)")
        p.add_argument("--input", required=True, help="the downloaded file")
        p.add_argument(
            "--output", help=f"output directory (gets <split>.parquet; default {DEFAULT_OUTPUT_ROOT}/{name})"
        )
        p.add_argument("--split", help="split name (default: test if the file name says so, else train)")
        if name == "math":
            p.add_argument(
                "--data-source", default="lighteval/MATH", help="data_source of the rows (routes the reward)"
            )
    for name, task in (("synthetic", "the synthetic arithmetic task"), ("synthetic_tool", "the synthetic tool task")):
        p = sub.add_parser(name, help=f"generate {task}")
        p.add_argument("--output", help=f"output directory (default {DEFAULT_OUTPUT_ROOT}/{name})")
        p.add_argument("--train-size", type=int)
        p.add_argument("--val-size", type=int)
        p.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, str]:
    """Run the command line; returns split name -> written parquet path."""
    args = _parser().parse_args(argv)
    args.output = default_output(args.dataset) if args.output is None else os.path.expanduser(args.output)
    if args.dataset in ("synthetic", "synthetic_tool"):
        from hybridflow.data import SYNTHETIC_GENERATORS  # written alongside, imported only when asked

        _, generate = SYNTHETIC_GENERATORS["arithmetic" if args.dataset == "synthetic" else "tool"]
        sizes = {k: v for k, v in (("train_size", args.train_size), ("val_size", args.val_size)) if v is not None}
        return generate(args.output, seed=args.seed, **sizes)
    split = args.split or infer_split(args.input)
    records = read_records(args.input)
    if args.dataset == "gsm8k":
        rows = convert(records, gsm8k_row, split=split, path=args.input)
    else:
        rows = convert(records, math_row, split=split, path=args.input, data_source=args.data_source)
    return {split: write_rows(rows, args.output, split)}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for split_name, written in main().items():
        logger.info("%s: %s", split_name, written)

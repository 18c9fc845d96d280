"""Load training parquet files, validated, into rows and DataProtos.

:func:`load_rows` reads one or more files in veRL's schema and checks them
before anything trains on them; every error names the file (and the row):

* a missing file, a zero-byte or non-parquet file, a file of no rows, a
  missing column (``data_source``, ``prompt``, ``reward_model``);
* a column of the wrong type: ``data_source`` text; ``prompt`` text or a
  list of ``{"role", "content"}`` messages; ``reward_model`` a struct with a
  text ``ground_truth``; ``extra_info`` (optional) a struct or map;
* a null where a value is required (named by row);
* an over-long prompt (more tokens than ``max_prompt_length``): an error, or,
  with ``filter_overlong=True``, a dropped row counted in the returned
  :class:`LoadReport`.

:func:`to_data_proto` puts ``data_source``, ``ground_truth``,
``extra_info`` and the raw prompt into non-tensor columns.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from hybridflow.core.data_proto import DataProto
from hybridflow.core.keys import DATA_SOURCE, EXTRA_INFO, GROUND_TRUTH, RAW_PROMPT

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model")


class DatasetError(ValueError):
    """A training file that does not follow the schema."""


@dataclass
class LoadReport:
    """What loading kept and dropped, per file."""

    rows: int = 0
    dropped_overlong: dict[str, int] = field(default_factory=dict)


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_messages(t: pa.DataType) -> bool:
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return False
    item = t.value_type
    return (
        pa.types.is_struct(item)
        and {"role", "content"} <= {f.name for f in item}
        and all(_is_text(item.field(n).type) for n in ("role", "content"))
    )


def check_schema(path: str, schema: pa.Schema) -> None:
    """Raise :class:`DatasetError` naming ``path`` for missing or mistyped columns."""
    missing = [c for c in REQUIRED_COLUMNS if c not in schema.names]
    if missing:
        raise DatasetError(
            f"{path}: missing column(s) {missing} (required: {', '.join(REQUIRED_COLUMNS)}); it has {schema.names}"
        )
    problems = []
    if not _is_text(schema.field("data_source").type):
        problems.append(f"data_source must be text, is {schema.field('data_source').type}")
    prompt = schema.field("prompt").type
    if not (_is_text(prompt) or _is_messages(prompt)):
        problems.append(f"prompt must be text or a list of {{role, content}} messages, is {prompt}")
    reward = schema.field("reward_model").type
    has_truth = pa.types.is_struct(reward) and reward.get_field_index("ground_truth") >= 0
    if not (has_truth and _is_text(reward.field("ground_truth").type)):
        problems.append(f"reward_model must be a struct with a text ground_truth, is {reward}")
    if "extra_info" in schema.names:
        extra = schema.field("extra_info").type
        if not (pa.types.is_struct(extra) or pa.types.is_map(extra) or pa.types.is_null(extra)):
            problems.append(f"extra_info must be a struct or a map, is {extra}")
    if problems:
        raise DatasetError(f"{path}: " + "; ".join(problems))


def _check_row(path: str, index: int, row: dict[str, Any]) -> None:
    if not row["data_source"]:
        raise DatasetError(f"{path}, row {index}: data_source is null or empty")
    if row["prompt"] is None or (isinstance(row["prompt"], list) and not row["prompt"]):
        raise DatasetError(f"{path}, row {index}: prompt is null or empty")
    if isinstance(row["prompt"], list) and any(m is None or m.get("content") is None for m in row["prompt"]):
        raise DatasetError(f"{path}, row {index}: a prompt message is null or has no content")
    if row["reward_model"] is None or row["reward_model"].get("ground_truth") is None:
        raise DatasetError(f"{path}, row {index}: reward_model.ground_truth is null")


def prompt_length(prompt: Any, tokenizer: Any) -> int:
    """Tokens of a prompt: through the tokenizer's chat template when it has one, else of the text."""
    if isinstance(prompt, list):
        if getattr(tokenizer, "chat_template", None):
            # rendered, then encoded: with tokenize=True recent transformers return a BatchEncoding,
            # whose len() is its number of keys, not of tokens
            text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
            return len(tokenizer.encode(text, add_special_tokens=False))
        prompt = "\n".join(m["content"] for m in prompt)
    return len(tokenizer.encode(prompt, add_special_tokens=False))


def load_rows(
    paths: str | Sequence[str],
    *,
    tokenizer: Any = None,
    max_prompt_length: int | None = None,
    filter_overlong: bool = False,
) -> tuple[list[dict[str, Any]], LoadReport]:
    """Validated rows of the parquet files, in order, and a :class:`LoadReport`.

    Prompt lengths are checked when both ``tokenizer`` and
    ``max_prompt_length`` are given; over-long prompts raise, or are dropped
    and counted when ``filter_overlong``.
    """
    paths = [paths] if isinstance(paths, str) else list(paths)
    rows: list[dict[str, Any]] = []
    report = LoadReport()
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: {'a directory, not a file' if os.path.isdir(path) else 'no such file'}")
        if os.path.getsize(path) == 0:
            raise DatasetError(f"{path}: the file is empty (0 bytes), not a parquet file")
        try:
            table = pq.read_table(path)
        except (pa.ArrowInvalid, OSError) as exc:
            raise DatasetError(f"{path}: not a readable parquet file: {exc}") from exc
        if table.num_rows == 0:
            raise DatasetError(f"{path}: the file has no rows")
        check_schema(path, table.schema)
        dropped = 0
        for index, row in enumerate(table.to_pylist()):
            _check_row(path, index, row)
            if tokenizer is not None and max_prompt_length is not None:
                n = prompt_length(row["prompt"], tokenizer)
                if n > max_prompt_length:
                    if not filter_overlong:
                        raise DatasetError(
                            f"{path}, row {index}: prompt has {n} tokens > max_prompt_length {max_prompt_length} "
                            "(set filter_overlong to drop such rows)"
                        )
                    dropped += 1
                    continue
            rows.append(row)
        if dropped:
            report.dropped_overlong[path] = report.dropped_overlong.get(path, 0) + dropped
            logger.warning(
                "%s: dropped %d of %d rows with prompts over %d tokens",
                path,
                dropped,
                table.num_rows,
                max_prompt_length,
            )
    report.rows = len(rows)
    return rows, report


def to_data_proto(rows: Sequence[dict[str, Any]]) -> DataProto:
    """A DataProto with non-tensor columns ``data_source``, ``ground_truth``, ``extra_info`` and ``raw_prompt``."""
    return DataProto.from_dict(
        non_tensors={
            DATA_SOURCE: [r["data_source"] for r in rows],
            GROUND_TRUTH: [r["reward_model"]["ground_truth"] for r in rows],
            EXTRA_INFO: [dict(r.get("extra_info") or {}) for r in rows],
            RAW_PROMPT: [r["prompt"] for r in rows],
        }
    )

"""Prompts for the driver: tokenized once, batched with a resumable position.

Rows arrive in veRL's schema (``data_source``, ``prompt`` as chat messages or
plain text, ``reward_model.ground_truth``, ``extra_info``). Each prompt is
rendered with the tokenizer's chat template (plain text is used as is),
tokenized once, and prompts longer than ``max_prompt_length`` tokens are
dropped and counted. Batches are left-padded, as the rollout engine expects.

The loader's position is two integers (epoch, batch index); the order of an
epoch is a permutation drawn from ``seed + epoch``. Saving the position and
restoring it resumes on exactly the batch that would have come next, also on
an epoch boundary.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hybridflow.core import DataProto
from hybridflow.core.chat import render_prompt
from hybridflow.core.keys import (
    ATTENTION_MASK,
    DATA_SOURCE,
    EPOCH,
    EXTRA_INFO,
    GROUND_TRUTH,
    INPUT_IDS,
    POSITION_IDS,
    PROMPT_ID,
    PROMPT_TEXT,
    RAW_PROMPT,
)
from hybridflow.core.rollout_batch import left_pad

logger = logging.getLogger(__name__)


@dataclass
class PromptSet:
    """Tokenized prompts with their verifier inputs, aligned by index."""

    token_ids: list[list[int]]
    texts: list[str]
    """Each prompt as the policy reads it (rendered by its chat template)."""
    raw: list[Any]
    """Each prompt as loaded: chat messages (list of dicts) or text; a reward model with a template of its own
    renders these."""
    data_sources: list[str]
    ground_truths: list[str | None]
    extra_infos: list[dict]
    row_ids: list[int] = field(default_factory=list)
    """Each prompt's row in the rows it was read from (over-long rows dropped leave gaps): its stable id."""
    filtered_too_long: int = 0

    @classmethod
    def from_rows(cls, rows: Sequence[Mapping[str, Any]], tokenizer: Any, max_prompt_length: int) -> PromptSet:
        """Tokenize ``rows``; prompts over ``max_prompt_length`` tokens are dropped and counted."""
        kept = cls([], [], [], [], [], [])
        unk, tokens = getattr(tokenizer, "unk_token_id", None), [0, 0]
        for row_id, row in enumerate(rows):
            text = render_prompt(row["prompt"], tokenizer)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            tokens[0] += sum(i == unk for i in ids) if unk is not None else 0
            tokens[1] += len(ids)
            if len(ids) > max_prompt_length:
                kept.filtered_too_long += 1
                continue
            kept.token_ids.append(ids)
            kept.row_ids.append(row_id)
            kept.texts.append(text)
            kept.raw.append(row["prompt"] if isinstance(row["prompt"], str) else [dict(m) for m in row["prompt"]])
            kept.data_sources.append(row["data_source"])
            truth = row["reward_model"]["ground_truth"]
            kept.ground_truths.append(
                truth if truth is None else str(truth)
            )  # None stays None: a reward error, not "None"
            kept.extra_infos.append(dict(row.get("extra_info") or {}))
        if kept.filtered_too_long:
            logger.warning("dropped %d prompts longer than %d tokens", kept.filtered_too_long, max_prompt_length)
        if tokens[1] and tokens[0] / tokens[1] > 0.01:
            logger.warning(
                "%.0f%% of the prompt tokens are the tokenizer's unknown token %r: this tokenizer does not "
                "cover the data (builtin:* models have a character tokenizer for the synthetic task only; "
                "set actor_rollout_ref.model.path to a real checkpoint)",
                100 * tokens[0] / tokens[1],
                getattr(tokenizer, "unk_token", None),
            )
        if not kept.token_ids:
            raise ValueError(
                f"no prompts left: all {len(rows)} are longer than data.max_prompt_length={max_prompt_length}"
            )
        return kept

    def __len__(self) -> int:
        return len(self.token_ids)

    def batch(self, indices: Sequence[int], pad_id: int) -> DataProto:
        """The prompts at ``indices`` as a left-padded DataProto with their verifier columns."""
        ids, mask, positions = left_pad([self.token_ids[i] for i in indices], pad_id)
        return DataProto.from_dict(
            {INPUT_IDS: ids, ATTENTION_MASK: mask, POSITION_IDS: positions},
            {
                DATA_SOURCE: [self.data_sources[i] for i in indices],
                GROUND_TRUTH: [self.ground_truths[i] for i in indices],
                EXTRA_INFO: [self.extra_infos[i] for i in indices],
                RAW_PROMPT: [self.raw[i] for i in indices],
                PROMPT_TEXT: [self.texts[i] for i in indices],
                PROMPT_ID: np.array([self.row_ids[i] for i in indices], dtype=np.int64),
            },
        )


class PromptLoader:
    """Epochs of fixed-size prompt batches (the last partial batch is dropped) with a resumable position."""

    def __init__(self, prompts: PromptSet, batch_size: int, pad_id: int, *, shuffle: bool, seed: int) -> None:
        if batch_size > len(prompts):
            raise ValueError(f"data.train_batch_size={batch_size} is larger than the {len(prompts)} prompts available")
        self.prompts, self.batch_size, self.pad_id = prompts, batch_size, pad_id
        self.shuffle, self.seed = shuffle, seed
        self.epoch, self.index = 0, 0

    @property
    def batches_per_epoch(self) -> int:
        return len(self.prompts) // self.batch_size

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.prompts))
        return np.random.default_rng(self.seed + epoch).permutation(len(self.prompts))

    def next_batch(self) -> DataProto:
        """The batch at the current position; advances it (rolling over to the next epoch)."""
        if self.index >= self.batches_per_epoch:
            self.epoch, self.index = self.epoch + 1, 0
        order = self._order(self.epoch)
        start = self.index * self.batch_size
        self.index += 1
        batch = self.prompts.batch(order[start : start + self.batch_size].tolist(), self.pad_id)
        batch.non_tensor_batch[EPOCH] = np.full(len(batch), self.epoch, dtype=np.int64)
        return batch

    def state_dict(self) -> dict[str, int]:
        """The position: restore it with :meth:`load_state_dict` to continue exactly here."""
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])

    def __iter__(self) -> Iterator[DataProto]:
        while True:
            yield self.next_batch()

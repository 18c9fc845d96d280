"""The synthetic tool task: the largest of four digits, one of which only a tool can show.

A prompt is ``"max(3,0,4,?)="``: three visible digits (0..4) and a hidden one
(5..9, uniform), so the hidden digit is always the answer. The policy can
only know it by calling the ``reveal`` tool, whose instance for this prompt
holds the digit (``extra_info["tools_kwargs"]["reveal"]["value"]``). With
the ``tool_calling`` loop in the ``compact`` format, a turn that is ``?``
calls it; the observation shows the digit and the policy answers in its next
turn::

    <|user|>max(3,0,4,?)=<|assistant|>?    <|system|>7<|assistant|>    7<eos>
            prompt                   policy  observation (loss mask 0)  policy

Why it needs the tool: the hidden digit is drawn independently of the
visible ones, so without the observation no policy beats a uniform guess over
5..9 (0.2); validation prompts are drawn from the same distribution and the
hidden digits are new draws, so nothing can be memorized either. The
verifier ``tool_task`` (:mod:`hybridflow.rewards.tool_task`) scores the final
answer. data_source: ``synthetic/tool``.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from hybridflow.data.synthetic import write_parquet_atomically

__all__ = ["DATA_SOURCE", "generate_tool_task", "make_tool_example"]

logger = logging.getLogger(__name__)

DATA_SOURCE = "synthetic/tool"
VISIBLE = 3
VISIBLE_RANGE = (0, 4)
HIDDEN_RANGE = (5, 9)


def make_tool_example(visible: tuple[int, ...] | list[int], hidden: int, *, split: str, index: int) -> dict:
    """One row (``max(v1,...,?)=``, answer ``hidden``) in veRL's schema, with the tool's state in ``extra_info``."""
    if (
        not all(VISIBLE_RANGE[0] <= d <= VISIBLE_RANGE[1] for d in visible)
        or not HIDDEN_RANGE[0] <= hidden <= HIDDEN_RANGE[1]
    ):
        raise ValueError(f"visible digits must be in {VISIBLE_RANGE} and the hidden one in {HIDDEN_RANGE}")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": "max(" + ",".join(str(d) for d in visible) + ",?)="}],
        "ability": "tool_use",
        "reward_model": {"ground_truth": str(hidden), "style": "rule"},
        "extra_info": {"split": split, "index": index, "tools_kwargs": {"reveal": {"value": int(hidden)}}},
    }


def generate_tool_task(
    output_dir: str, *, train_size: int = 8192, val_size: int = 512, seed: int = 0
) -> dict[str, str]:
    """Write ``train.parquet`` and ``val.parquet`` of the task into ``output_dir``; split name -> path."""
    if train_size < 1 or val_size < 1:
        raise ValueError(f"train_size ({train_size}) and val_size ({val_size}) must be positive")
    rng = np.random.default_rng(seed)
    os.makedirs(output_dir, exist_ok=True)
    paths = {}
    for split, size in (("train", train_size), ("val", val_size)):
        visible = rng.integers(VISIBLE_RANGE[0], VISIBLE_RANGE[1] + 1, size=(size, VISIBLE))
        hidden = rng.integers(HIDDEN_RANGE[0], HIDDEN_RANGE[1] + 1, size=size)
        rows = [
            make_tool_example([int(d) for d in v], int(h), split=split, index=i)
            for i, (v, h) in enumerate(zip(visible, hidden))
        ]
        paths[split] = os.path.join(output_dir, f"{split}.parquet")
        write_parquet_atomically(rows, paths[split])
        logger.info("wrote %d %s rows of %s to %s", len(rows), split, DATA_SOURCE, paths[split])
    return paths

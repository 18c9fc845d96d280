"""Left-padding prompts, and concatenating rollouts generated separately, whose prompt and response widths differ.

:func:`left_pad` lays token lists out as the rollout engines expect them
(padded on the left, position ids counting real tokens only).

Each generation left-pads its prompts to its longest prompt and right-pads
its responses to its longest response, so two rollouts of the same run can
have different widths. :func:`concat_rollouts` pads every part to the widest
(prompt side on the left, response side on the right, with ``pad_id`` for
token ids and 0 for masks, positions and per-token values) and then
concatenates; which column runs along which axis is named once, in
``core/keys.py``. The padding is masked, so nothing computed from the masks
changes. A column outside those groups is left as it is (so one of another
width fails in the concatenation, naming itself).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from hybridflow.core.data_proto import DataProto
from hybridflow.core.keys import INPUT_IDS, PROMPT_COLUMNS, PROMPTS, RESPONSE_COLUMNS, RESPONSES, SEQUENCE_COLUMNS

__all__ = ["concat_rollouts", "left_pad", "positions_from_mask"]

_TOKEN_IDS = (PROMPTS, RESPONSES, INPUT_IDS)


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of left-padded rows: 0, 1, ... over real tokens, 0 on pads; (B, P) -> (B, P)."""
    positions = attention_mask.long().cumsum(dim=-1) - 1
    return positions.masked_fill(attention_mask == 0, 0)


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, position_ids), each (B, max_len), padded on the left."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        if seq:
            ids[i, width - len(seq) :] = torch.tensor(list(seq), dtype=torch.long)
            mask[i, width - len(seq) :] = 1
    return ids, mask, positions_from_mask(mask)


def right_pad(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), each (B, max_len), padded on the right (a reward model's texts)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        if seq:
            ids[i, : len(seq)] = torch.tensor(list(seq), dtype=torch.long)
            mask[i, : len(seq)] = 1
    return ids, mask


def concat_rollouts(parts: Sequence[DataProto], pad_id: int) -> DataProto:
    """``DataProto.concat`` of rollouts after padding each to the widest prompt and response."""
    widths = [(p.batch[PROMPTS].shape[1], p.batch[RESPONSES].shape[1]) for p in parts]
    prompt_width, response_width = max(w[0] for w in widths), max(w[1] for w in widths)
    return DataProto.concat(
        [_pad(p, prompt_width - pw, response_width - rw, pad_id) for p, (pw, rw) in zip(parts, widths)]
    )


def _pad(part: DataProto, left: int, right: int, pad_id: int) -> DataProto:
    if not (left or right):
        return part
    out = DataProto(dict(part.batch), dict(part.non_tensor_batch), dict(part.meta_info))
    for key, value in part.batch.items():
        sides = (
            (left, 0)
            if key in PROMPT_COLUMNS
            else (left, right)
            if key in SEQUENCE_COLUMNS
            else (0, right)
            if key in RESPONSE_COLUMNS
            else None
        )
        if sides is None:  # not along P or T (a (B,) score, (B, K) components): nothing to pad
            continue
        fill = pad_id if key in _TOKEN_IDS else 0
        out.batch[key] = F.pad(value, sides, value=fill) if value.dim() == 2 else _pad_rows(value, sides, fill)
    return out


def _pad_rows(value: torch.Tensor, sides: tuple[int, int], fill: int) -> torch.Tensor:
    """Pad dim 1 of a tensor of any rank (F.pad pads the last dims)."""
    moved = value.movedim(1, -1)
    return F.pad(moved, sides, value=fill).movedim(-1, 1)

"""concat_rollouts: rollouts of different prompt and response widths become one batch, padding on the right sides."""

import numpy as np
import torch

from hybridflow.core import DataProto
from hybridflow.core.rollout_batch import concat_rollouts


def rollout(prompt_width, response_width, rows=2, pad=0):
    """A rollout-shaped batch whose prompts fill the whole width and responses are ``response_width`` long."""
    prompts = torch.arange(1, rows * prompt_width + 1).view(rows, prompt_width) + 100
    responses = torch.arange(1, rows * response_width + 1).view(rows, response_width) + 200
    mask = torch.ones(rows, response_width)
    return DataProto.from_dict(
        {
            "prompts": prompts,
            "responses": responses,
            "response_mask": mask,
            "old_log_probs": -mask * 0.5,
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": torch.ones(rows, prompt_width + response_width),
            "position_ids": torch.arange(prompt_width + response_width).repeat(rows, 1),
            "reward_baselines": torch.tensor([1.0] * rows),
        },
        {"uid": np.array([f"p{prompt_width}"] * rows, dtype=object)},
    )


def test_narrow_parts_are_padded_prompt_left_response_right():
    out = concat_rollouts([rollout(3, 2), rollout(2, 4)], pad_id=7)
    assert out.batch["prompts"].shape == (4, 3) and out.batch["responses"].shape == (4, 4)
    first, second = out[0], out[2]
    assert first.batch["responses"][0].tolist() == [201, 202, 7, 7]  # right-padded with the pad id
    assert first.batch["response_mask"][0].tolist() == [1, 1, 0, 0]
    assert first.batch["old_log_probs"][0].tolist() == [-0.5, -0.5, 0.0, 0.0]
    assert second.batch["prompts"][0].tolist() == [7, 101, 102]  # left-padded
    assert second.batch["input_ids"][0].tolist() == [7, 101, 102, 201, 202, 203, 204]
    assert first.batch["input_ids"][0].tolist() == [101, 102, 103, 201, 202, 7, 7]
    assert second.batch["attention_mask"][0].tolist() == [0, 1, 1, 1, 1, 1, 1]
    assert out.batch["reward_baselines"].tolist() == [1.0] * 4  # (B,) columns untouched
    assert out.non_tensor_batch["uid"].tolist() == ["p3", "p3", "p2", "p2"]


def test_equal_widths_concatenate_as_they_are():
    a, b = rollout(3, 2), rollout(3, 2)
    assert torch.equal(
        concat_rollouts([a, b], 0).batch["input_ids"], torch.cat([a.batch["input_ids"], b.batch["input_ids"]])
    )

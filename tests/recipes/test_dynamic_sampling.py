"""DAPO's dynamic sampling hook: groups whose scores are all equal leave the batch, whole."""

import numpy as np
import pytest
import torch

from hybridflow.core import DataProto
from hybridflow.plugins import get_batch_hook
from hybridflow.recipes.dynamic_sampling import drop_uniform_groups


def scored(scores, uids):
    t = torch.zeros(len(scores), 3)
    t[:, -1] = torch.tensor(scores)
    return DataProto.from_dict(
        {"token_level_scores": t, "token_level_rewards": t - 0.5 * torch.arange(len(scores))[:, None]},
        {"uid": np.array(uids, dtype=object)},
    )


def test_groups_of_equal_scores_are_dropped_and_the_rest_kept_whole_in_order():
    # groups by uid, not position: b's rows are not adjacent
    batch = scored([1, 0, 1, 1, 0, 0, 1, 1], ["a", "a", "b", "c", "c", "d", "d", "b"])
    kept, metrics = drop_uniform_groups(batch)
    assert kept.non_tensor_batch["uid"].tolist() == ["a", "a", "c", "c", "d", "d"]  # b: 1, 1 -> dropped
    assert metrics == {"kept_groups": 3.0, "dropped_groups": 1.0}


def test_metric_reward_reads_the_rewards_after_penalties():
    batch = scored([1, 1, 0, 0], ["a", "a", "b", "b"])  # rewards subtract 0.5 x row index: no group is uniform
    kept, metrics = drop_uniform_groups(batch, metric="reward")
    assert len(kept) == 4 and metrics["dropped_groups"] == 0.0
    with pytest.raises(ValueError, match="metric 'acc'; allowed: score, reward"):
        drop_uniform_groups(batch, metric="acc")


def test_registered_as_an_after_reward_hook():
    hook = get_batch_hook("dynamic_sampling")
    assert hook.stage == "after_reward" and hook.options == {"metric": "score"}

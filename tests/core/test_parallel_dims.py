"""ParallelDims: one answer for every layout question, and every rule it breaks named."""

import numpy as np
import pytest
import torch

from hybridflow.core import DP_COMPUTE_METRIC, DataProto, GroupLayout, RankLayout
from hybridflow.core.parallel_dims import ParallelDims, RoleLayout


def dims(world=4, actor_tp=2, rollout_tp=1, train=8, mini=4, n=2, micro=4, critic_micro=4, use_critic=True):
    return ParallelDims(world, actor_tp, rollout_tp, train, mini, n, micro, critic_micro, use_critic)


def test_layouts_of_four_ranks_with_actor_tp_2():
    d = dims()
    assert (d.actor.dp, d.actor.tp, d.actor.rows_per_mini_batch) == (2, 2, 4)  # 4 prompts x 2 samples over 2 dp ranks
    assert (d.critic.dp, d.critic.tp, d.critic.rows_per_mini_batch) == (4, 1, 2)  # the critic is FSDP over all 4
    assert (d.rollout.dp, d.rollout.tp) == (4, 1)
    assert d.actor.mesh == ((2, 2), ("dp", "tp")) and d.critic.mesh == ((4,), ("dp",))
    assert d.optimizer_steps_per_epoch == 2 and d.rows_per_step == 16


def group_layout(layout: RoleLayout) -> GroupLayout:
    """The dispatch layout of a role's mesh: dp groups of tp consecutive ranks, tp coordinate 0 collects."""
    return GroupLayout(
        tuple(RankLayout(r // layout.tp, layout.dp, r % layout.tp == 0) for r in range(layout.dp * layout.tp))
    )


def optimizer_step_rows(layout: RoleLayout, rows: int) -> list[set[int]]:
    """The rows each optimizer step sees: the arranged batch split by the update's dispatch mode, then each
    rank's share walked in mini-batches as PPOActor / PPOCritic do (``make_iterator``, no shuffle)."""
    batch = DataProto.from_dict({"row": torch.arange(rows)})
    plan = DP_COMPUTE_METRIC.dispatch(group_layout(layout), (layout.arrange_for_update(batch),), {})
    steps = [list(args[0].make_iterator(layout.rows_per_mini_batch)) for args in plan.rank_args]
    return [set(torch.cat([rank[k].batch["row"] for rank in steps]).tolist()) for k in range(len(steps[0]))]


def test_actor_and_critic_step_on_the_same_rows_whatever_their_dp():
    d = dims()
    actor, critic = optimizer_step_rows(d.actor, d.rows_per_step), optimizer_step_rows(d.critic, d.rows_per_step)
    assert actor == critic == [set(range(0, 8)), set(range(8, 16))]  # mini-batch k is rows [8k, 8k + 8)
    # over 2 ranks: rank 0 holds rows 0-3 (its half of mini-batch 0), then 8-11 (of mini-batch 1). A plain
    # contiguous split would give the first step rows 0-3 + 8-11 on 2 ranks, 0-1 + 4-5 + 8-9 + 12-13 on 4
    arranged = RoleLayout(2, 1, 4).arrange_for_update(DataProto.from_dict({"row": torch.arange(16)}))
    assert arranged.batch["row"].tolist() == [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15]


def test_arrangement_keeps_non_tensor_columns_with_their_rows():
    batch = DataProto.from_dict(
        {"row": torch.arange(8)}, {"uid": np.array([f"u{i // 2}" for i in range(8)], dtype=object)}
    )
    out = RoleLayout(2, 1, 2).arrange_for_update(batch)
    assert [f"u{r // 2}" for r in out.batch["row"].tolist()] == out.non_tensor_batch["uid"].tolist()
    with pytest.raises(ValueError, match="6 rows do not split into mini-batches of 2 ranks x 2 rows"):
        RoleLayout(2, 1, 2).arrange_for_update(batch[:6])


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            {"world": 4, "actor_tp": 3},
            "trainer.nnodes x trainer.n_gpus_per_node=4 must be a multiple of 3 (actor tensor-parallel "
            "groups of actor_rollout_ref.actor.tensor_model_parallel_size=3 consecutive ranks tile "
            "the ranks); allowed sizes: 1, 2, 4",
        ),
        ({"rollout_tp": 0}, "actor_rollout_ref.rollout.tensor_model_parallel_size=0 must be >= 1"),
        ({"train": 0}, "data.train_batch_size=0 must be >= 1"),
        ({"critic_micro": 0}, "critic.ppo_micro_batch_size_per_gpu=0 must be >= 1"),
        ({"train": 6, "mini": 4}, "data.train_batch_size=6 must be a multiple of 4"),
        # mini 3 x n 2 = 6 rows: 3 per actor dp rank, but not a whole number over the critic's 4 ranks
        (
            {"train": 6, "mini": 3, "rollout_tp": 2},
            "ppo_mini_batch_size x rollout.n=6 must be a multiple of 4 (each mini-batch's rows are split evenly over "
            "the 4 critic",
        ),
        ({"world": 0}, "trainer.nnodes x trainer.n_gpus_per_node = 0; need at least one rank"),
    ],
)
def test_each_broken_rule_names_key_value_and_what_would_work(kwargs, message):
    assert any(message in p for p in dims(**kwargs).problems()), dims(**kwargs).problems()


def test_the_critic_rule_applies_only_with_a_critic():
    assert dims(train=6, mini=3, rollout_tp=2, use_critic=False).problems() == []
    assert dims().problems() == []

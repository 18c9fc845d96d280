"""Dispatch modes and @register, without Ray: plans and collects checked by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from hybridflow.core import (
    ALL_TO_ALL,
    DP_COMPUTE,
    DP_COMPUTE_METRIC,
    DP_COMPUTE_PROTO,
    ONE_TO_ALL,
    DataProto,
    DispatchMode,
    DispatchPlan,
    Execute,
    GroupLayout,
    RankLayout,
    Worker,
    register,
)
from hybridflow.core.dispatch import (
    FutureShard,
    Padding,
    Pending,
    RegisteredMethod,
    Registration,
    expansion,
    strip_padding,
)

# dp=2 x tp=2, row-major mesh: ranks 0,1 form dp group 0; ranks 2,3 dp group 1;
# the tp coordinate 0 (ranks 0 and 2) is each group's representative.
MESH_2X2 = GroupLayout(
    (RankLayout(0, 2, True), RankLayout(0, 2, False), RankLayout(1, 2, True), RankLayout(1, 2, False))
)


def _rows(n: int) -> DataProto:
    return DataProto.from_dict({"x": torch.arange(n * 3).reshape(n, 3)}, {"id": [f"r{i}" for i in range(n)]})


def test_dp_proto_splits_across_dp_and_replicates_across_tp() -> None:
    plan = DP_COMPUTE_PROTO.dispatch(MESH_2X2, (_rows(8),), {})
    assert plan.context.pad_size == 0
    seen = [list(args[0].non_tensor_batch["id"]) for args in plan.rank_args]
    first, second = [f"r{i}" for i in range(4)], [f"r{i}" for i in range(4, 8)]
    assert seen == [first, first, second, second]
    assert DP_COMPUTE_PROTO.collect_ranks(MESH_2X2) == [0, 2]
    out = DP_COMPUTE_PROTO.collect(MESH_2X2, [plan.rank_args[0][0], plan.rank_args[2][0]], plan.context)
    assert list(out.non_tensor_batch["id"]) == [f"r{i}" for i in range(8)]
    assert torch.equal(out.batch["x"], torch.arange(24).reshape(8, 3))


def test_dp_proto_pads_five_rows_over_two_and_strips_after_collect() -> None:
    layout = GroupLayout.flat(2)
    plan = DP_COMPUTE_PROTO.dispatch(layout, (), {"data": _rows(5)})
    assert plan.context == Padding(pad_size=1, shard_rows=3)  # 5 rows -> 6: one padding row
    assert [len(kw["data"]) for kw in plan.rank_kwargs] == [3, 3]
    # The padding row is a copy of row 0, appended at the end.
    assert list(plan.rank_kwargs[1]["data"].non_tensor_batch["id"]) == ["r3", "r4", "r0"]
    out = DP_COMPUTE_PROTO.collect(layout, [kw["data"] for kw in plan.rank_kwargs], plan.context)
    assert list(out.non_tensor_batch["id"]) == ["r0", "r1", "r2", "r3", "r4"]


def _samples(shard: DataProto, n: int) -> DataProto:
    """What a row-expanding method returns: n adjacent copies of each input row, numbered by sample."""
    out = shard.repeat(n, interleave=True)
    out.non_tensor_batch["id"] = np.array(
        [f"{row}.{i % n}" for i, row in enumerate(out.non_tensor_batch["id"])], dtype=object
    )
    return out


def test_padded_row_expanding_call_returns_rows_times_n_with_each_prompt_n_times() -> None:
    """5 prompts x 4 samples on 2 ranks: 6 padded prompts, 12 rows per rank, 20 rows back (not 23)."""
    layout = GroupLayout.flat(2)
    plan = DP_COMPUTE_PROTO.dispatch(layout, (_rows(5),), {})
    out = DP_COMPUTE_PROTO.collect(layout, [_samples(args[0], 4) for args in plan.rank_args], plan.context)
    assert list(out.non_tensor_batch["id"]) == [f"r{p}.{s}" for p in range(5) for s in range(4)]


def test_padded_call_with_a_fractional_expansion_is_refused() -> None:
    layout = GroupLayout.flat(2)
    plan = DP_COMPUTE_PROTO.dispatch(layout, (_rows(5),), {})  # shards of 3 rows
    with pytest.raises(ValueError, match="got 4 output rows for an input shard of 3"):
        DP_COMPUTE_PROTO.collect(layout, [args[0][:2].repeat(2) for args in plan.rank_args], plan.context)
    assert strip_padding(_samples(plan.rank_args[1][0], 2), chunk_rows=3, real_rows=2).non_tensor_batch[
        "id"
    ].tolist() == ["r3.0", "r3.1", "r4.0", "r4.1"]


def test_dp_proto_rejects_non_dataproto_and_unequal_lengths() -> None:
    with pytest.raises(TypeError, match="positional argument 1 is a int"):
        DP_COMPUTE_PROTO.dispatch(GroupLayout.flat(2), (_rows(4), 3), {})
    with pytest.raises(ValueError, match=r"equal lengths, got \[3, 4\]"):
        DP_COMPUTE_PROTO.dispatch(GroupLayout.flat(2), (_rows(4), _rows(3)), {})
    with pytest.raises(TypeError, match="must return a DataProto"):
        DP_COMPUTE_PROTO.collect(GroupLayout.flat(2), [_rows(1), {"loss": 1.0}], Padding(0, 0))


def test_dp_metric_returns_every_rank_output() -> None:
    plan = DP_COMPUTE_METRIC.dispatch(MESH_2X2, (_rows(4),), {})
    assert [len(a[0]) for a in plan.rank_args] == [2, 2, 2, 2]
    assert DP_COMPUTE_METRIC.collect(MESH_2X2, [1.0, 2.0, 3.0, 4.0], plan.context) == [1.0, 2.0, 3.0, 4.0]


def test_one_to_all_and_all_to_all() -> None:
    layout = GroupLayout.flat(3)
    plan = ONE_TO_ALL.dispatch(layout, (7,), {"k": "v"})
    assert list(plan.rank_args) == [(7,)] * 3 and list(plan.rank_kwargs) == [{"k": "v"}] * 3
    plan = ALL_TO_ALL.dispatch(layout, ([1, 2, 3],), {"k": ["a", "b", "c"]})
    assert list(plan.rank_args) == [(1,), (2,), (3,)]
    assert list(plan.rank_kwargs) == [{"k": "a"}, {"k": "b"}, {"k": "c"}]
    with pytest.raises(ValueError, match=r"one entry per rank \(3\), got a list of length 2"):
        DP_COMPUTE.dispatch(layout, ([1, 2],), {})


def _scale_by_rank(layout: GroupLayout, args: tuple, kwargs: dict) -> DispatchPlan:
    return DispatchPlan([(args[0] * r,) for r in range(layout.world_size)], [kwargs] * layout.world_size)


def test_user_defined_mode_in_a_few_lines() -> None:
    # Rank r gets r * x; the collect step adds the outputs up.
    scaled_sum = DispatchMode("SCALED_SUM", _scale_by_rank, lambda layout, outs, ctx: sum(outs))
    plan = scaled_sum.dispatch(GroupLayout.flat(4), (2,), {})
    assert [a[0] for a in plan.rank_args] == [0, 2, 4, 6]
    assert scaled_sum.collect(GroupLayout.flat(4), [a[0] * 10 for a in plan.rank_args], plan.context) == 120


def test_register_stores_one_typed_object_and_keeps_the_method_callable() -> None:
    class W(Worker):
        @register(dispatch=DP_COMPUTE_PROTO, execute=Execute.RANK_ZERO, blocking=False)
        def double(self, data: DataProto) -> DataProto:
            """Doubles x."""
            return DataProto.from_dict({"x": data.batch["x"] * 2})

    attr = W.__dict__["double"]
    assert isinstance(attr, RegisteredMethod)
    assert attr.registration.dispatch is DP_COMPUTE_PROTO
    assert attr.registration.execute is Execute.RANK_ZERO and attr.registration.blocking is False
    out = W().double(_rows(2))  # a plain local call still works
    assert torch.equal(out.batch["x"], torch.tensor([[0, 2, 4], [6, 8, 10]]))
    with pytest.raises(TypeError, match="must be a DispatchMode"):
        register(dispatch="dp_compute_proto")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Execute member"):
        register(execute="rank_zero")  # type: ignore[arg-type]


def test_layout_validation() -> None:
    assert MESH_2X2.collect_ranks() == [0, 2] and MESH_2X2.dp_size == 2
    with pytest.raises(ValueError, match="exactly one collect rank"):
        GroupLayout((RankLayout(0, 1, True), RankLayout(0, 1, True)))
    with pytest.raises(ValueError, match="disagree"):
        GroupLayout((RankLayout(0, 1, True), RankLayout(0, 2, True)))


class _Ready(Pending):
    def __init__(self, value: DataProto) -> None:
        self.value = value

    def get(self, timeout_s: float | None = None) -> DataProto:
        return self.value


def test_future_shard_cuts_inside_the_worker_and_strips_its_padding() -> None:
    future = _Ready(_rows(5))
    plan = DP_COMPUTE_PROTO.dispatch(GroupLayout.flat(2), (future,), {})
    assert [type(a[0]) for a in plan.rank_args] == [FutureShard, FutureShard]
    shard0, real0 = plan.rank_args[0][0].resolve()
    shard1, real1 = plan.rank_args[1][0].resolve()
    assert (len(shard0), real0, len(shard1), real1) == (3, 3, 3, 2)
    assert list(strip_padding(shard1, 3, real1).non_tensor_batch["id"]) == ["r3", "r4"]
    with pytest.raises(ValueError, match="got 1 output rows for an input shard of 3"):
        strip_padding(_rows(1), 3, 2)


@pytest.mark.parametrize("rows,dp,padding", [(5, 4, Padding(3, 2)), (7, 4, Padding(1, 2)), (9, 3, Padding(0, 3))])
def test_a_shard_holds_the_padded_rows_over_the_dp_size(rows, dp, padding) -> None:
    # rows padded up to a multiple of dp, split in dp shards: 5 over 4 -> 8 rows, 2 per shard; 7 -> 8; 9 over 3 -> 3
    plan = DP_COMPUTE_PROTO.dispatch(GroupLayout.flat(dp), (_rows(rows),), {})
    assert plan.context == padding
    assert [len(a[0]) for a in plan.rank_args] == [padding.shard_rows] * dp


@pytest.mark.parametrize("dp", [1, 2])
def test_a_call_on_futures_only_adds_no_padding_of_its_own(dp) -> None:
    # the workers cut and pad the future's batch themselves; the driver's collect must strip nothing
    assert DP_COMPUTE_PROTO.dispatch(GroupLayout.flat(dp), (_Ready(_rows(5)),), {}).context == Padding(0, 0)
    plan = DP_COMPUTE_PROTO.dispatch(GroupLayout.flat(2), (_Ready(_rows(5)),), {})
    outputs = [_rows(3), _rows(2)]  # what the ranks return once each stripped its own padding
    assert len(DP_COMPUTE_PROTO.collect(GroupLayout.flat(2), outputs, plan.context)) == 5


def test_ranks_that_expand_their_rows_by_different_factors_are_refused() -> None:
    layout = GroupLayout.flat(2)
    plan = DP_COMPUTE_PROTO.dispatch(layout, (_rows(5),), {})  # shards of 3 rows, one padding row
    outputs = [_samples(plan.rank_args[0][0], 2), _samples(plan.rank_args[1][0], 4)]
    with pytest.raises(ValueError, match=r"different numbers of output rows per input row: \[2, 4\]"):
        DP_COMPUTE_PROTO.collect(layout, outputs, plan.context)


def test_a_shard_with_one_real_row_keeps_that_rows_samples_only() -> None:
    # 1 real row of 3, two samples each: the first 2 output rows stay (1 x 2), not 1 ** 2 = 1
    out = strip_padding(_samples(_rows(3), 2), chunk_rows=3, real_rows=1)
    assert out.non_tensor_batch["id"].tolist() == ["r0.0", "r0.1"]


def test_expansion_is_a_whole_positive_factor() -> None:
    assert expansion(4, 1) == 4 and expansion(6, 3) == 2
    for output_rows, input_rows in [(4, 0), (4, -2), (0, -1)]:
        with pytest.raises(ValueError, match="must return the same whole number of rows"):
            expansion(output_rows, input_rows)


def test_a_future_shard_past_the_end_of_the_batch_is_all_padding() -> None:
    # 1 row over 4 dp ranks: padded to 4, one per shard; ranks 1 to 3 hold padding only (0 real rows, not -1 or 1)
    reals = [FutureShard(_Ready(_rows(1)), rank, 4).resolve()[1] for rank in range(4)]
    assert reals == [1, 0, 0, 0]


def test_a_layout_of_many_ranks() -> None:
    # ranks past CPython's small-int cache (256): dp ranks compared by value
    layout = GroupLayout.flat(300)
    assert layout.dp_size == 300 and layout.collect_ranks() == list(range(300))
    with pytest.raises(ValueError, match="disagree on the data-parallel size: \\[\\]"):
        GroupLayout(())


def test_reads_cut_each_dataproto_argument_to_its_columns_and_pass_the_rest() -> None:
    data = DataProto.from_dict({"x": torch.zeros(2, 1), "y": torch.ones(2, 1)}, {"id": ["a", "b"]}, {"step": 3})
    args, kwargs = Registration(reads=("y", "id", "absent")).select_inputs((data, 7), {"other": data, "flag": True})
    for lean in (args[0], kwargs["other"]):
        assert set(lean.batch.keys()) == {"y"} and set(lean.non_tensor_batch) == {"id"} and lean.meta_info["step"] == 3
    assert args[1] == 7 and kwargs["flag"] is True
    args, kwargs = Registration().select_inputs((data,), {"flag": True})  # no reads declared: everything passes
    assert args[0] is data and kwargs == {"flag": True}


def test_defaults_a_method_gets_from_register_and_a_mode_from_dispatchmode() -> None:
    @register()
    def plain(self):
        return None

    assert plain.registration.blocking is True and plain.registration.dispatch is ONE_TO_ALL
    for mode in (ONE_TO_ALL, ALL_TO_ALL, DP_COMPUTE):  # they never read the dp layout
        assert not mode.needs_layout and not mode.collect_copies
    assert DP_COMPUTE_PROTO.needs_layout and DP_COMPUTE_METRIC.needs_layout
    # only PROTO concatenates its outputs into new memory; METRIC hands the ranks' own objects back
    assert DP_COMPUTE_PROTO.collect_copies and not DP_COMPUTE_METRIC.collect_copies


def test_what_register_records_and_a_split_leaves_cannot_be_changed_afterwards() -> None:
    records = (Registration(), Padding(1, 2), FutureShard(_Ready(_rows(1)), 0, 1), RankLayout(0, 1, True))
    for record in (*records, GroupLayout.flat(1), DP_COMPUTE_PROTO, RegisteredMethod(len), DispatchPlan([], [])):
        with pytest.raises(dataclasses.FrozenInstanceError):
            record.__setattr__(dataclasses.fields(record)[0].name, None)


def test_a_registration_blocks_unless_told_not_to() -> None:
    assert Registration().blocking is True and Registration().dispatch is ONE_TO_ALL


def test_per_rank_arguments_need_exactly_one_entry_per_rank() -> None:
    for entries in ([1, 2, 3, 4], [1, 2]):  # one too many is as wrong as one too few
        with pytest.raises(ValueError, match=r"one entry per rank \(3\), got a list of length"):
            ALL_TO_ALL.dispatch(GroupLayout.flat(3), (entries,), {})
    many = list(range(300))  # past CPython's cached small ints: lengths compared by value
    assert [a[0] for a in ALL_TO_ALL.dispatch(GroupLayout.flat(300), (many,), {}).rank_args] == many


def test_a_dp_group_without_a_collect_rank_is_refused() -> None:
    with pytest.raises(ValueError, match=r"dp rank 0 must have exactly one collect rank, found ranks \[\]"):
        GroupLayout((RankLayout(0, 1, False),))


def test_strip_padding_leaves_what_is_not_a_dataproto_as_it_is() -> None:
    metrics = [{"loss": 1.0}, {"loss": 2.0}, {"loss": 3.0}]  # a metric list from a shard with one padding row
    assert strip_padding(metrics, chunk_rows=3, real_rows=2) is metrics


def test_a_pending_result_must_say_how_to_get_it() -> None:
    class NoGet(Pending):
        pass

    with pytest.raises(TypeError, match="abstract"):
        NoGet()

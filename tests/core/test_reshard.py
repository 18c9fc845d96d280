"""Train-to-rollout resharding on 4 gloo ranks: every rollout block equals the slice of the unsharded weight.

Layouts: FSDP2 over 4 ranks -> rollout TP 1, 2, 4, and dp 2 x tp 2 -> rollout
TP 1, 4; models: tiny-llama (tied embeddings) / tiny-qwen2, and a Qwen2 with
a vocabulary of 30 rows (uneven over 4 ranks and against the rollout blocks).
One spawn per layout runs every check; rollout tensors start as NaN, so a
missed element fails ``torch.equal``.
"""

import pytest
import torch
import torch.multiprocessing as mp
from reshard_ranks import LARGE_BUCKET, SMALL_BUCKET, STEP_BUCKET, reshard_rank, reshard_tamper_rank

from hybridflow.core.reshard import Box, TensorSlice, _route, _schedule, _split
from hybridflow.core.worker import free_ports


def test_box_intersection_by_hand():
    a = Box((0, 0), (8, 64))
    assert a.intersect(Box((6, 32), (4, 64))) == Box((6, 32), (2, 32))
    assert a.intersect(Box((8, 0), (8, 64))) is None
    assert TensorSlice(1, 16, 32).box((64, 64)) == Box((0, 16), (64, 16))
    full = torch.arange(8 * 6).view(8, 6)
    assert torch.equal(Box((2, 0), (4, 6)).view_of(full[2:6], Box((3, 2), (2, 3))), full[3:5, 2:5])


def test_split_and_schedule_respect_the_bucket():
    # a (5, 7) float32 block cut to at most 8 elements: rows of 7 fit, one per piece
    assert [b.shape for b in _split(Box((0, 0), (5, 7)), 8)] == [(1, 7)] * 5
    # rows too wide for the bucket are cut along the inner dim
    assert _split(Box((2, 0), (1, 10)), 4) == [Box((2, 0), (1, 4)), Box((2, 4), (1, 4)), Box((2, 8), (1, 2))]
    # FSDP over 4 ranks (rows 0-1, 2-3, 4-5, 6-7 of an [8, 4] weight) to TP 2 (rank % 2 wants rows 0-3 or 4-7)
    held = {r: Box((2 * r, 0), (2, 4)) for r in range(4)}
    wanted = {r: (Box((4 * (r % 2), 0), (4, 4)), torch.float32) for r in range(4)}
    pieces = _route("w", held, wanted, [0] * 4)
    moves = sorted((p.src, p.dst, p.box.offset[0]) for p in pieces if p.src != p.dst)
    assert moves == [(0, 2, 0), (1, 0, 2), (1, 2, 2), (2, 1, 4), (2, 3, 4), (3, 1, 6)]
    remote = [p for p in pieces if p.src != p.dst]
    rounds = _schedule(remote, 4, bucket_bytes=64)  # 2 rows x 4 floats = 32 bytes per piece
    for members in rounds:
        for rank in range(4):
            assert sum(p.nbytes for p in members if rank in (p.src, p.dst)) <= 64
    assert sum(len(m) for m in rounds) == 6


def _run(tmp_path, layout, models, qs):
    mp.start_processes(
        reshard_rank, args=(4, free_ports(1)[0], layout, models, qs, str(tmp_path)), nprocs=4, start_method="spawn"
    )
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(4)]


def _check(reports, models, qs):
    for report in reports:
        for name in models:
            full_bytes = report[name, "full_bytes"]
            assert report[name, "changed"], f"{name}: the training step changed nothing"
            for q in qs:
                for bucket in (SMALL_BUCKET, LARGE_BUCKET):
                    case = report[name, q, bucket]
                    stats = case["stats"]
                    assert case["wrong"] == [], (name, q, bucket)
                    assert stats.peak_extra_bytes <= bucket
                    # a rank receives exactly its rollout blocks, less what it already holds
                    assert stats.bytes_received + stats.bytes_local == case["target_bytes"]
                small = report[name, q, SMALL_BUCKET]["stats"]
                large = report[name, q, LARGE_BUCKET]["stats"]
                assert small.rounds > large.rounds >= 1
                assert small.peak_extra_bytes <= full_bytes / 50
                assert (small.bytes_sent, small.bytes_received) == (large.bytes_sent, large.bytes_received)
                after = report[name, q, "after_step"]
                assert after["wrong"] == [], (name, q)
                assert after["stats"].peak_extra_bytes <= STEP_BUCKET


@pytest.mark.slow
def test_fsdp4_to_rollout_tp_1_2_4(tmp_path):
    models, qs = ("builtin:tiny-llama", "uneven-qwen2"), (1, 2, 4)
    reports = _run(tmp_path, "fsdp", models, qs)
    _check(reports, models, qs)
    # FSDP(4) -> TP 1: every rank receives the three quarters it does not hold
    # (tiny-llama: every weight splits evenly over 4 ranks)
    stats = reports[0]["builtin:tiny-llama", 1, LARGE_BUCKET]["stats"]
    full_bytes = reports[0]["builtin:tiny-llama", "full_bytes"]
    assert (stats.bytes_local, stats.bytes_received) == (full_bytes // 4, 3 * full_bytes // 4)


@pytest.mark.slow
def test_dp2_tp2_to_rollout_tp_1_4(tmp_path):
    models, qs = ("builtin:tiny-qwen2", "uneven-qwen2"), (1, 4)
    _check(_run(tmp_path, "dp2xtp2", models, qs), models, qs)


def test_a_round_corrupted_in_transit_is_caught_and_nothing_after_it_is_written(tmp_path):
    """FSDP 2 -> rollout TP 1, one flipped bit in what rank 1 receives in round 0: rank 1 raises WeightSyncError naming
    the round, the sender and itself, its weights stay unwritten; rank 0 finishes; the next run is whole on both."""
    mp.start_processes(reshard_tamper_rank, args=(2, free_ports(1)[0], str(tmp_path)), nprocs=2, start_method="spawn")
    caught, clean = (torch.load(tmp_path / f"tamper{r}.pt", weights_only=False) for r in (1, 0))
    assert caught["first"]["error"].startswith("reshard round 0: the chunk from rank 0 (")
    assert (
        "arrived corrupted on rank 1 (its fingerprint differs from the sender's); the rounds before it were"
        in (caught["first"]["error"])
    )
    assert caught["first"]["unwritten"] > 0  # the corrupted round and the ones after it left NaN behind
    assert clean["first"]["rounds"] > 1 and clean["first"]["verify_s"] > 0
    for report in (caught, clean):
        assert report["second"]["wrong"] == []

"""The trainer-to-rollout weight transfer (core/weight_transfer.py) between two worlds of CPU ranks.

Two FSDP2 training ranks change their weights twice; after each change trainer
rank 0 broadcasts them to two rollout ranks that hold tensor-parallel blocks
(vocab 30 and 4 heads over tp 2). Each rollout block must equal the slice of
the gathered training weight, exactly, with the version sent.
"""

import pytest
import torch
import torch.multiprocessing as mp
from reshard_ranks import build_model
from transfer_ranks import BUCKET, transfer_rank

from hybridflow.core.weight_transfer import buckets, fingerprint, manifest_of
from hybridflow.core.worker import free_ports
from hybridflow.workers.rollout.tp_plan import rollout_slice


def test_buckets_cut_the_manifest_by_size_and_dtype():
    manifest = [
        ("a", (4, 4), "float32"),
        ("b", (4,), "float32"),
        ("c", (100,), "float32"),
        ("d", (2,), "bfloat16"),
        ("e", (3,), "bfloat16"),
        ("f", (1,), "float32"),
    ]
    # 64 + 16 bytes fit 100; c (400 bytes) is alone; d and e share a dtype; f starts a float32 bucket again
    assert buckets(manifest, 100) == [[0, 1], [2], [3, 4], [5]]
    assert buckets(manifest, 10_000) == [[0, 1, 2], [3, 4], [5]]


@pytest.mark.slow
def test_rollout_blocks_equal_the_gathered_training_weights_after_each_sync(tmp_path):
    mp.start_processes(transfer_rank, args=(free_ports(3), str(tmp_path)), nprocs=4, start_method="spawn")
    config = build_model("uneven-qwen2").config
    manifest = manifest_of(build_model("uneven-qwen2").named_parameters())
    previous = None
    for version in (1, 2):
        full = torch.load(tmp_path / f"full{version}.pt")
        assert previous is None or not torch.equal(full["model.embed_tokens.weight"], previous)  # the weights moved
        previous = full["model.embed_tokens.weight"]
        for tp_rank in (0, 1):
            held = torch.load(tmp_path / f"rollout{tp_rank}_{version}.pt")
            assert held["version"] == version
            assert held["buckets"] == len(buckets(manifest, BUCKET)) > 5
            for name, block in held["params"].items():
                want = rollout_slice(name, tuple(full[name].shape), config, tp_rank, 2).take(full[name])
                assert torch.equal(block, want), (name, tp_rank, version)


def test_a_fingerprint_changes_with_one_flipped_bit_in_any_dtype():
    for flat in (torch.randn(1000), torch.randn(999).to(torch.bfloat16), torch.arange(7, dtype=torch.uint8)):
        before = fingerprint(flat)
        assert fingerprint(flat.clone()) == before
        flat.view(torch.uint8)[-1] ^= 1
        assert fingerprint(flat) != before, flat.dtype
    two = torch.tensor([1.0, 2.0])  # one 64-bit word: 0x40000000_3f800000 (little-endian)
    assert fingerprint(two) == 0x40000000_3F800000
    assert fingerprint(torch.tensor([1.0, 2.0, 1.0])) == 0x40000000_3F800000 + 0x80 + 0x3F  # the last 4 bytes, summed
    assert fingerprint(torch.full((2,), -1, dtype=torch.int64)) == -2  # mod 2**64, signed


def test_a_bucket_corrupted_in_transit_is_caught_and_nothing_of_it_or_after_it_is_written(tmp_path):
    """One flipped bit in bucket 2 of version 1: the receiver writes buckets 0-1 only, raises WeightSyncError naming
    the bucket, its weight, the version and the member; the sender finishes, and version 2 arrives whole."""
    import json

    from transfer_ranks import TAMPER_WEIGHTS, tamper_rank

    mp.start_processes(tamper_rank, args=(free_ports(1)[0], str(tmp_path)), nprocs=2, start_method="spawn")
    sent = json.loads((tmp_path / "tamper0.json").read_text())
    received = json.loads((tmp_path / "tamper1.json").read_text())
    assert sent == {"sent1": [4, True], "sent2": [4, True]}
    first = received["received1"]
    assert first["error"] == (
        "weight sync of version 1: bucket 2 of 4 (w2) arrived corrupted on member 1 of 2 (its fingerprint differs "
        "from the sender's); the buckets before it were written, so the rollout holds a mixture of versions and must "
        "not generate"
    )
    assert sorted(first["written"]) == ["w0", "w1"]
    second = received["received2"]
    assert second["version"] == 2
    assert second["written"] == {name: (t * 2).tolist() for name, t in TAMPER_WEIGHTS}


def test_a_rollout_rank_whose_sync_failed_stops_its_stream_and_generates_nothing():
    """The rollout worker's fail-closed rule, with stand-ins for the transfer, the engine and the stream (a unit
    test: the corrupted transfer itself runs for real above)."""
    from hybridflow.core.weight_transfer import WeightSyncError
    from hybridflow.workers.rollout.worker import RolloutWorker

    class Transfer:
        def incoming(self, bucket):
            raise WeightSyncError("weight sync of version 3: bucket 1 of 2 (w1) arrived corrupted")

    class Stream:
        closed = False

        def paused(self, weights=False):
            import contextlib

            return contextlib.nullcontext()

        def close(self):
            Stream.closed = True

    worker = RolloutWorker.__new__(RolloutWorker)
    rollout = type("Rollout", (), {"reshard_bucket_mb": 1})
    worker.config = type("Config", (), {"actor_rollout_ref": type("Roles", (), {"rollout": rollout})})
    worker.transfer, worker.stream, worker.broken_sync = Transfer(), Stream(), None
    worker.env = type("Env", (), {"rank": 0})
    with pytest.raises(WeightSyncError, match="bucket 1 of 2"):
        worker.receive_weights()
    assert Stream.closed  # the stream's thread stops: no decode step runs on the mixture
    for generate in (worker.generate_sequences, worker.generate_stream):
        with pytest.raises(WeightSyncError, match="rollout rank 0 generates nothing after a failed weight sync"):
            generate(None)

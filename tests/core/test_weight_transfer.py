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

from hybridflow.core.weight_transfer import buckets, manifest_of
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

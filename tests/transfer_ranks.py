"""The spawned ranks of tests/core/test_weight_transfer.py (importable by name).

Ranks 0-1 train (FSDP2 over their own gloo world), ranks 2-3 hold the rollout
with tensor parallelism 2 (their own gloo world); a WeightTransfer group joins
trainer rank 0 and both rollout ranks. Every rank saves what it holds after
each transfer; the test compares.
"""

import os
import sys

import torch
import torch.distributed as dist
from reshard_ranks import build_model
from torch.distributed.device_mesh import init_device_mesh

from hybridflow.core.weight_transfer import WeightTransfer, manifest_of
from hybridflow.workers.fsdp import full_parameters, shard_model
from hybridflow.workers.rollout.builtin import block_writer
from hybridflow.workers.rollout.tensor_parallel import build_tp_rollout_model
from hybridflow.workers.rollout.vllm_engine import iter_full_weights

BUCKET = 4096  # bytes: smaller than most weight matrices, so buckets hold one to a few weights


def transfer_rank(rank, ports, out_dir):
    torch.set_num_threads(1)
    trainer = rank < 2
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ports[0] if trainer else ports[1]))
    dist.init_process_group("gloo", rank=rank % 2, world_size=2)
    try:
        model = build_model("uneven-qwen2")
        if trainer:
            _train_and_send(rank, model, ports[2], out_dir)
        else:
            _receive(rank, model.config, ports[2], out_dir)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _train_and_send(rank, model, port, out_dir):
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    model = shard_model(model, mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    transfer = None
    if rank == 0:
        transfer = WeightTransfer("127.0.0.1", port, 0, 3, torch.device("cpu"))
        transfer.publish(manifest_of(model.named_parameters()))
    for version in (1, 2):
        ids = torch.randint(0, 30, (2, 6), generator=torch.Generator().manual_seed(version))
        model(input_ids=ids).logits.square().mean().backward()  # any step that changes every weight
        optimizer.step()
        optimizer.zero_grad()
        weights = iter_full_weights(model)
        if transfer is None:
            for _ in weights:
                pass
        else:
            transfer.send(weights, version, BUCKET)
        full = full_parameters(model)
        if rank == 0:
            torch.save(full, os.path.join(out_dir, f"full{version}.pt"))


def _receive(rank, config, port, out_dir):
    tp_rank = rank - 2
    rollout = build_tp_rollout_model(config, dist.group.WORLD, tp_rank, 2)
    params = dict(rollout.named_parameters())
    transfer = WeightTransfer("127.0.0.1", port, 1 + tp_rank, 3, torch.device("cpu"))
    transfer.read_manifest()
    write = block_writer(params, config, tp_rank, 2)
    for version in (1, 2):
        with torch.no_grad():
            stats = transfer.receive(write, BUCKET)
        held = {name: p.detach().clone() for name, p in params.items()}
        torch.save(
            {"version": stats.version, "buckets": stats.buckets, "params": held},
            os.path.join(out_dir, f"rollout{tp_rank}_{version}.pt"),
        )


# Four weights of 64 float32 (256 bytes) in buckets of 256 bytes: four buckets, one weight each.
TAMPER_WEIGHTS = [(f"w{i}", torch.arange(64, dtype=torch.float32) + 100 * i) for i in range(4)]


def tamper_rank(rank, port, out_dir):
    """Member 0 sends two versions; member 1 flips one bit of bucket 2 of the first as it arrives (a test seam)."""
    import json

    from hybridflow.core.weight_transfer import WeightSyncError

    torch.set_num_threads(1)
    transfer = WeightTransfer("127.0.0.1", port, rank, 2, torch.device("cpu"), timeout_s=60)
    record = {}
    if rank == 0:
        transfer.publish(manifest_of(TAMPER_WEIGHTS))
        for version in (1, 2):
            stats = transfer.send(((n, t * version) for n, t in TAMPER_WEIGHTS), version, 256)
            record[f"sent{version}"] = [stats.buckets, stats.verify_seconds > 0]
    else:
        transfer.read_manifest()

        def flip_a_bit(index, flat):
            if index == 2 and flat[0] == 200.0:  # the first version's bucket 2 only
                flat.view(torch.int32)[5] ^= 1 << 3

        transfer.tamper = flip_a_bit
        for version in (1, 2):
            written = {}
            try:
                stats = transfer.receive(lambda name, t: written.__setitem__(name, t.tolist()), 256)
                record[f"received{version}"] = {"version": stats.version, "written": written}
            except WeightSyncError as err:
                record[f"received{version}"] = {"error": str(err), "written": written}
    with open(os.path.join(out_dir, f"tamper{rank}.json"), "w") as out:
        json.dump(record, out)
    sys.stdout.flush()
    os._exit(0)

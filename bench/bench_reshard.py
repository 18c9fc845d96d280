"""Train-to-rollout weight move: the in-memory reshard vs two ways without it.

    python bench/bench_reshard.py [--ranks 4] [--tp 2] [--repeats 3] [--bucket-mb 64] [--device cpu|cuda]

A ~100M-parameter Qwen2 (built from a config, random weights) is sharded with
FSDP2 over ``--ranks`` ranks (the training layout); each rank also holds its
rollout tensor-parallel block (``--tp``) of the same model. Each rank then
refreshes its rollout block from the training shards three ways, timed and
with the extra bytes it allocates:

* **reshard**: ``core/reshard.py`` (plan made once, then one run per update;
  extra memory: the send + receive buffers of one bucket);
* **(a) gather all**: every rank gathers the whole state dict
  (``full_tensor()`` of every parameter, kept until the copy is done) and
  copies its blocks out of it;
* **(b) checkpoint**: the full state dict is gathered to rank 0, written to
  disk with ``torch.save`` (and fsync'ed), then every rank loads it and copies
  its blocks (the way to move weights between layouts without resharding).

Every way ends with the same rollout blocks (checked against each other).
Times are the median over ``--repeats`` runs, the max over ranks; bytes are
the max over ranks of what the method allocates (counted from tensor sizes on
CPU; ``torch.cuda.max_memory_allocated`` deltas with ``--device cuda``).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from transformers import AutoModelForCausalLM, Qwen2Config

from hybridflow.core.reshard import gather_full_state, plan_reshard
from hybridflow.core.worker import free_ports
from hybridflow.workers.fsdp import shard_model
from hybridflow.workers.rollout.tensor_parallel import build_tp_rollout_model
from hybridflow.workers.rollout.tp_plan import rollout_slice

MiB = 2**20


def model_config() -> Qwen2Config:
    """~100M parameters: 12 layers of width 768, 12 query / 4 KV heads, a 32k vocabulary (tied)."""
    return Qwen2Config(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )


def _cuda_peak_since(before: int, device: torch.device) -> int:
    return torch.cuda.max_memory_allocated(device) - before if device.type == "cuda" else 0


def _reset_peak(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


@torch.no_grad()
def copy_blocks(full: dict[str, torch.Tensor], targets: dict[str, torch.Tensor], slices) -> None:
    """Copy each target's block out of full tensors."""
    for name, target in targets.items():
        target.copy_(slices[name].take(full[name]))


def gather_all(sources, targets, slices, device) -> tuple[float, int]:
    """(a) every rank materializes every full tensor, then copies its blocks."""
    before = _reset_peak(device)
    start = time.perf_counter()
    full = gather_full_state(sources)
    copy_blocks(full, targets, slices)
    counted = sum(t.numel() * t.element_size() for t in full.values())
    del full
    dist.barrier()
    return time.perf_counter() - start, _cuda_peak_since(before, device) or counted


def via_checkpoint(sources, targets, slices, path: str, device) -> tuple[float, int]:
    """(b) the full state to rank 0, torch.save + fsync, every rank loads it and copies its blocks."""
    before = _reset_peak(device)
    start = time.perf_counter()
    rank = dist.get_rank()
    counted = 0
    state = {}
    for name, param in sources:  # FSDP shards: every rank joins each gather, rank 0 keeps them
        full = param.full_tensor()
        if rank == 0:
            state[name] = full.cpu()
            counted += full.numel() * full.element_size()
    if rank == 0:
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
    del state
    dist.barrier()
    loaded = torch.load(path, map_location=device, weights_only=True)
    copy_blocks(loaded, targets, slices)
    counted = max(counted, sum(t.numel() * t.element_size() for t in loaded.values()))
    del loaded
    dist.barrier()
    return time.perf_counter() - start, _cuda_peak_since(before, device) or counted


def bench_rank(rank: int, world: int, port: int, args, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world)
    config = model_config()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(device)
    params = sum(p.numel() for p in model.parameters())
    train_mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",))
    rollout_mesh = init_device_mesh(device.type, (world // args.tp, args.tp), mesh_dim_names=("dp", "tp"))
    tp_rank = rollout_mesh.get_local_rank("tp")
    rollout = build_tp_rollout_model(
        config, rollout_mesh.get_group("tp") if args.tp > 1 else None, tp_rank, args.tp, device=device
    )
    model = shard_model(model, train_mesh)
    sources = list(model.named_parameters())
    targets = dict(rollout.named_parameters())
    shapes = {name: tuple(p.shape) for name, p in sources}
    slices = {name: rollout_slice(name, shapes[name], config, tp_rank, args.tp) for name in targets}

    plan_start = time.perf_counter()
    plan = plan_reshard(sources, targets, slices)
    plan_s = time.perf_counter() - plan_start
    bucket = int(args.bucket_mb * MiB)
    ours, ours_bytes = [], 0
    for _ in range(args.repeats):
        before = _reset_peak(device)
        dist.barrier()
        stats = plan.run(bucket)
        dist.barrier()
        ours.append(stats.seconds)
        ours_bytes = max(ours_bytes, _cuda_peak_since(before, device) or stats.peak_extra_bytes)
    reference = {name: t.clone() for name, t in targets.items()}

    gathered, gathered_bytes = [], 0
    for _ in range(args.repeats):
        seconds, nbytes = gather_all(sources, targets, slices, device)
        gathered.append(seconds)
        gathered_bytes = max(gathered_bytes, nbytes)
    same_a = all(torch.equal(reference[n], t) for n, t in targets.items())

    path = os.path.join(args.ckpt_dir, "full_state.pt")  # one directory for all ranks, made by main()
    saved, saved_bytes = [], 0
    for _ in range(args.repeats):
        dist.barrier()
        seconds, nbytes = via_checkpoint(sources, targets, slices, path, device)
        saved.append(seconds)
        saved_bytes = max(saved_bytes, nbytes)
    dist.barrier()
    same_b = all(torch.equal(reference[n], t) for n, t in targets.items())

    row = torch.tensor(
        [
            statistics.median(ours),
            ours_bytes,
            statistics.median(gathered),
            gathered_bytes,
            statistics.median(saved),
            saved_bytes,
            plan_s,
        ],
        dtype=torch.float64,
        device=device,
    )
    dist.all_reduce(row, op=dist.ReduceOp.MAX)
    if rank == 0:
        results.update(params=params, row=row.cpu().tolist(), same=(same_a and same_b))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--tp", type=int, default=2, help="rollout tensor-parallel size")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bucket-mb", type=float, default=64.0)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--ckpt-dir", default=None, help="where (b) writes its checkpoint (default: a temp dir)")
    args = parser.parse_args()
    scratch = tempfile.TemporaryDirectory(dir=args.ckpt_dir)
    args.ckpt_dir = scratch.name
    port = free_ports(1)[0]
    manager = mp.Manager()
    results = manager.dict()
    with scratch:
        mp.spawn(bench_rank, args=(args.ranks, port, args, results), nprocs=args.ranks, join=True)
    ours, ours_b, gath, gath_b, saved, saved_b, plan_s = results["row"]
    print(
        f"model: {results['params'] / 1e6:.1f}M parameters (fp32, {results['params'] * 4 / MiB:.0f} MiB); "
        f"FSDP over {args.ranks} ranks -> rollout TP {args.tp}; bucket {args.bucket_mb:g} MiB; device {args.device}; "
        f"torch {torch.__version__}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    )
    print(f"all three ways end with identical rollout blocks: {results['same']}; plan (once): {plan_s:.3f} s\n")
    print("| method | seconds per move | x reshard | peak extra MiB per rank | x reshard |")
    print("|---|---:|---:|---:|---:|")
    for label, seconds, nbytes in (
        ("reshard (core/reshard.py)", ours, ours_b),
        ("(a) every rank gathers the full state", gath, gath_b),
        ("(b) full checkpoint to disk and back", saved, saved_b),
    ):
        print(
            f"| {label} | {seconds:.3f} | {seconds / ours:.1f} | {nbytes / MiB:.1f} | {nbytes / max(ours_b, 1):.1f} |"
        )
    print(
        f"\ntargets: (b) / reshard time = {saved / ours:.1f} (>= 5); reshard / (a) peak bytes = "
        f"{ours_b / gath_b:.3f} (<= 0.25)"
    )


if __name__ == "__main__":
    main()

"""The cost of one trainer-to-rollout weight sync (``trainer.placement=split``) for a ~100M-parameter model.

    python bench/bench_weight_sync.py [--trainer-ranks 2] [--buckets-mb 16,64,256] [--repeats 3]

A Qwen2 of ~110M parameters (hidden 768, 12 layers, 12 heads, 4 KV heads,
MLP 2048, vocabulary 32,000 tied: random weights, fp32, 440 MB) is FSDP2-sharded
over ``--trainer-ranks`` CPU ranks (their own gloo world); one rollout rank
holds the full model. Per bucket size, each repeat measures
:meth:`WeightTransfer.send` / ``receive`` as the trainer's ``send_weights``
runs them (the FSDP all-gather of each weight included), and, side by side in
the same processes, the path through the disk a checkpoint-based hand-off
takes (trainer rank 0 gathers and ``torch.save``\\ s the state dict, the
rollout ``torch.load``\\ s it and copies it in), and the same transfer without
the buckets' fingerprints (``WeightTransfer.verify`` off on both ends; the two
take turns, the order swapped every repeat), so the fingerprints' cost is a
ratio. After every transfer the rollout's weights are compared with the
trainer's, exactly. Prints a Markdown table of medians.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh
from transformers import Qwen2Config, Qwen2ForCausalLM

from hybridflow.core.weight_transfer import WeightTransfer, manifest_of
from hybridflow.core.worker import free_ports
from hybridflow.workers.fsdp import full_parameters, shard_model
from hybridflow.workers.rollout.vllm_engine import iter_full_weights

CONFIG = dict(
    vocab_size=32_000,
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=4,
    max_position_embeddings=1024,
    tie_word_embeddings=True,
)


def model():
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(**CONFIG)).float()


def rank_main(rank, trainers, ports, buckets_mb, repeats, scratch, results):
    torch.set_num_threads(1)
    trainer = rank < trainers
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ports[0]))
    if trainer:
        dist.init_process_group("gloo", rank=rank, world_size=trainers)
    net = model()
    members = 2
    try:
        if trainer:
            net = shard_model(net, init_device_mesh("cpu", (trainers,), mesh_dim_names=("dp",)))
        transfer = None
        if rank == 0 or not trainer:
            transfer = WeightTransfer("127.0.0.1", ports[1], 0 if trainer else 1, members, torch.device("cpu"))
            transfer.publish(manifest_of(net.named_parameters())) if trainer else transfer.read_manifest()
        params = dict(net.named_parameters())
        for mb, repeat, verify in _schedule(buckets_mb, repeats):
            version = repeat + 1
            if transfer is not None:
                transfer.verify = verify  # both ends switch at the same point of the schedule
            tag = "" if verify else "_unverified"
            if trainer:
                weights = iter_full_weights(net)
                if transfer is None:
                    for _ in weights:
                        pass
                else:
                    stats = transfer.send(weights, version, mb << 20)
                    results.put(("send" + tag, mb, stats.seconds, stats.bytes))
                    results.put(("send_verify" + tag, mb, stats.verify_seconds, 0))
                if verify:
                    _disk_send(net, rank, scratch, results, mb)
                full = full_parameters(net)
                if rank == 0:
                    torch.save(full, os.path.join(scratch, "check.pt"))
            else:
                with torch.no_grad():
                    stats = transfer.receive(lambda name, t: params[name].copy_(t), mb << 20)
                results.put(("receive" + tag, mb, stats.seconds, stats.bytes))
                results.put(("receive_verify" + tag, mb, stats.verify_seconds, 0))
                if verify:
                    _disk_receive(params, scratch, results, mb)
            _barrier(transfer, trainer, rank)
            if not trainer:
                want = torch.load(os.path.join(scratch, "check.pt"))
                assert all(torch.equal(params[k], want[k]) for k in params), "rollout weights differ"
                with torch.no_grad():
                    for p in params.values():
                        p.zero_()  # the next transfer must write every weight again
            _barrier(transfer, trainer, rank)
        if trainer:
            dist.barrier()
    finally:
        if trainer:
            dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def _schedule(buckets_mb, repeats):
    """(bucket MiB, repeat, fingerprints on) in the order every rank runs them: on and off take turns, the order
    swapped every repeat, so neither always runs first."""
    for mb in buckets_mb:
        for repeat in range(repeats):
            for verify in (True, False) if repeat % 2 == 0 else (False, True):
                yield mb, repeat, verify


def _barrier(transfer, trainer, rank):
    """Trainer ranks and the rollout line up (the transfer group links rank 0 and the rollout)."""
    if trainer:
        dist.barrier()
    if transfer is not None:
        flag = torch.zeros(1)
        transfer.group.broadcast(flag, 0).wait()


def _disk_send(net, rank, scratch, results, mb):
    start = time.perf_counter()
    full = full_parameters(net)
    if rank == 0:
        torch.save(full, os.path.join(scratch, "weights.pt"))
        os.replace(os.path.join(scratch, "weights.pt"), os.path.join(scratch, "ready.pt"))
        results.put(("disk_save", mb, time.perf_counter() - start, 0))


def _disk_receive(params, scratch, results, mb):
    path = os.path.join(scratch, "ready.pt")
    while not os.path.exists(path):
        time.sleep(0.001)
    start = time.perf_counter()
    state = torch.load(path)
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(state[name])
    os.remove(path)
    results.put(("disk_load", mb, time.perf_counter() - start, 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trainer-ranks", type=int, default=2)
    parser.add_argument("--buckets-mb", default="16,64,256")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    buckets_mb = [int(b) for b in args.buckets_mb.split(",")]
    params = sum(p.numel() for p in model().parameters())
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    ports = free_ports(2)
    with tempfile.TemporaryDirectory() as scratch:
        procs = [
            ctx.Process(
                target=rank_main, args=(r, args.trainer_ranks, ports, buckets_mb, args.repeats, scratch, results)
            )
            for r in range(args.trainer_ranks + 1)
        ]
        for p in procs:
            p.start()
        rows = []
        expected = len(buckets_mb) * args.repeats * 10  # per repeat: 8 transfer rows (on and off), 2 disk rows
        while len(rows) < expected:
            rows.append(results.get(timeout=600))
        for p in procs:
            p.join()
    print(
        f"\n{platform.processor() or platform.machine()}, {params / 1e6:.0f}M parameters (fp32, "
        f"{4 * params / 2**20:.0f} MiB), {args.trainer_ranks} FSDP2 trainer ranks -> 1 rollout rank, gloo, "
        f"medians of {args.repeats}\n"
    )
    print(
        "| bucket MiB | send s | receive s | GB/s | bytes | disk: save s | disk: load s | disk / transfer "
        "| unfingerprinted s | fingerprint s (send + receive) | fingerprinted / not |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for mb in buckets_mb:
        med = lambda kind: statistics.median(r[2] for r in rows if r[0] == kind and r[1] == mb)  # noqa: E731
        sent = next(r[3] for r in rows if r[0] == "send" and r[1] == mb)
        transfer = max(med("send"), med("receive"))
        bare = max(med("send_unverified"), med("receive_unverified"))
        disk = med("disk_save") + med("disk_load")
        print(
            f"| {mb} | {med('send'):.2f} | {med('receive'):.2f} | {sent / transfer / 1e9:.2f} | {sent:,} "
            f"| {med('disk_save'):.2f} | {med('disk_load'):.2f} | {disk / transfer:.2f}x | {bare:.2f} "
            f"| {med('send_verify') + med('receive_verify'):.3f} | {transfer / bare:.3f} |"
        )


if __name__ == "__main__":
    main()

"""Where a receiving rank's host memory goes while ``load_sharded_model`` runs: 4 gloo ranks, cold and warm.

    python bench/bench_loading_stages.py [--ranks 4]

``bench/bench_loading.py`` measures what loading adds per rank; this splits
rank 1's (a rank that does not read) into the stages of
``workers.loading.load_sharded_model``, each as RSS after ``gc.collect()``
and ``malloc_trim(0)`` minus the same just before the call: the meta
skeleton built, sharded (still on meta), ``to_empty`` (its shards allocated;
pages are resident only once written), the state received. The ~100M model
of ``bench_loading.py`` (a bf16 checkpoint loaded as fp32). Twice, in fresh
processes: **cold**, and **warm**, after the same ranks first loaded a 2-layer
model through the same path, so code imported and caches filled on first use
(of FSDP2, DTensor, the distributed state-dict helpers) are in the baseline.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from bench_loading import proc_status_bytes, write_checkpoint
from torch.distributed.device_mesh import init_device_mesh
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM  # noqa: F401  (before the baseline)

from hybridflow.core.worker import free_ports
from hybridflow.workers import loading
from hybridflow.workers.fsdp import shard_model
from hybridflow.workers.models import build_char_tokenizer

MiB = 2**20


def resident() -> int:
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return proc_status_bytes("VmRSS")["VmRSS"]


def rank_main(rank: int, world: int, port: int, path: str, small: str, warm: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    if warm:
        loading.load_sharded_model(small, dtype=torch.float32, seed=None, mesh=mesh)  # dropped at once
    dist.barrier()
    base, marks = resident(), []

    def shard(model, mesh):
        marks.append(("meta skeleton", resident() - base))
        out = shard_model(model, mesh)
        marks.append(("sharded on meta", resident() - base))
        return out

    receive = loading.set_model_state_dict

    def set_state(model, state, options):
        marks.append(("to_empty", resident() - base))
        receive(model, state, options=options)
        marks.append(("state received", resident() - base))

    loading.set_model_state_dict = set_state
    model = loading.load_sharded_model(path, dtype=torch.float32, seed=None, mesh=mesh, shard=shard)
    loading.set_model_state_dict = receive
    marks.append(("returned", resident() - base))
    shard_bytes = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    if rank == 1:
        beyond = marks[-1][1] - shard_bytes
        print(
            f"| {'warm' if warm else 'cold'} | "
            + " | ".join(f"{v / MiB:.2f}" for _, v in marks)
            + f" | {shard_bytes / MiB:.2f} | {beyond / MiB:.2f} | {marks[-1][1] / (world * shard_bytes):.4f} |",
            flush=True,
        )
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    args = parser.parse_args()
    print("rank 1, MiB added since the baseline (after gc and malloc_trim), x: of the model's bytes\n")
    print(
        "| run | meta skeleton | sharded on meta | to_empty | state received | returned | shard | beyond the shard "
        "| x model |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    with tempfile.TemporaryDirectory() as path, tempfile.TemporaryDirectory() as small:
        write_checkpoint(path, torch.bfloat16)
        tiny = Qwen2Config(
            vocab_size=64,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
        AutoModelForCausalLM.from_config(tiny).save_pretrained(small)
        build_char_tokenizer().save_pretrained(small)
        for warm in (False, True):
            port = free_ports(1)[0]
            mp.start_processes(
                rank_main, args=(args.ranks, port, path, small, warm), nprocs=args.ranks, start_method="spawn"
            )


if __name__ == "__main__":
    main()

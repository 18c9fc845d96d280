"""Loading a checkpoint over 4 ranks: every rank reads it (today) vs one reader and meta-device ranks.

    python bench/bench_loading.py [--ranks 4] [--dtype float32] [--checkpoint-dtype bfloat16]

A ~100M-parameter Qwen2 (bench_reshard's shape, random weights from a seed)
is written with ``save_pretrained`` in ``--checkpoint-dtype`` (bf16 by
default, as HF checkpoints ship) into a temporary directory, then loaded in
``--dtype`` and sharded with FSDP2 over ``--ranks`` gloo ranks (spawned
processes) two ways, each in fresh processes:

* **today**: every rank ``load_model_and_tokenizer`` (``from_pretrained``),
  then ``shard_model``, as the workers' ``init_model`` do now;
* **one reader**: ``workers.loading.load_sharded_model`` (rank 0 reads and
  broadcasts; ranks 1.. build on meta and receive their shards).

Per rank, from ``/proc/self/status``: the resident set added by loading
(VmRSS after minus before, after ``gc.collect()``), the same after
``malloc_trim(0)`` (freed heap that glibc kept, handed back: what the rank
still holds), the peak added (VmHWM, reset to the current RSS just before
loading by writing 5 to ``/proc/self/clear_refs``, minus the RSS before), its
private (RssAnon) and file-backed (RssFile: the mapped checkpoint, one
page-cache copy shared by all ranks of a node) parts sampled every 2 ms, and
the seconds. Every rank of both ways ends with the same shards (checked).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import platform
import tempfile
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from bench_reshard import model_config
from torch.distributed.device_mesh import init_device_mesh
from transformers import AutoModelForCausalLM, Qwen2ForCausalLM  # noqa: F401  (model code imported before the baseline)

from hybridflow.core.worker import free_ports
from hybridflow.workers.fsdp import shard_model
from hybridflow.workers.loading import load_sharded_model
from hybridflow.workers.models import build_char_tokenizer, load_model_and_tokenizer, torch_dtype

MiB = 2**20
METHODS = ("today", "one reader")


def proc_status_bytes(*fields: str) -> dict[str, int]:
    """``/proc/self/status`` fields given in kB (VmRSS, VmHWM, RssAnon, RssFile), in bytes."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in fields:
                out[key] = int(value.split()[0]) * 1024
    return out


class PeakSampler:
    """Largest RssAnon (private) and RssFile (mapped files, shared between ranks) seen while running, every 2 ms.

    VmHWM gives the peak of their sum only; the split tells the page cache that
    every rank maps (one physical copy per node) from memory each rank owns.
    """

    def __init__(self) -> None:
        self.peak = {"RssAnon": 0, "RssFile": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.002):
            for key, value in proc_status_bytes(*self.peak).items():
                self.peak[key] = max(self.peak[key], value)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def write_checkpoint(directory: str, dtype: torch.dtype) -> None:
    """Save the bench model (seed 0) in ``dtype`` and the built-in tokenizer into ``directory``."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(model_config(), dtype=dtype)
    model.save_pretrained(directory)
    build_char_tokenizer().save_pretrained(directory)  # load_model_and_tokenizer reads one; its size is irrelevant


def load(method: str, path: str, dtype: torch.dtype, mesh) -> torch.nn.Module:
    if method == "today":
        return shard_model(load_model_and_tokenizer(path, dtype=dtype)[0], mesh)
    return load_sharded_model(path, dtype=dtype, seed=None, mesh=mesh)


def bench_rank(rank: int, world: int, port: int, method: str, path: str, dtype_name: str, out_dir: str) -> None:
    """Load once, measure, save the measurements and this rank's shards to ``out_dir/{rank}.pt``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    dtype = torch_dtype(dtype_name)
    gc.collect()
    dist.barrier()
    before = proc_status_bytes("VmRSS", "RssAnon", "RssFile")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS, so the peak below is this load's
    with PeakSampler() as sampler:
        start = time.perf_counter()
        model = load(method, path, dtype, mesh)
        seconds = time.perf_counter() - start
    gc.collect()
    after = proc_status_bytes("VmRSS", "VmHWM")
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed heap pages back: what is left is what the rank holds
    trimmed = proc_status_bytes("VmRSS")["VmRSS"]
    shards = {name: p.to_local().clone() for name, p in model.named_parameters()}
    torch.save(
        {
            "seconds": seconds,
            "added": after["VmRSS"] - before["VmRSS"],
            "peak": after["VmHWM"] - before["VmRSS"],
            "trimmed": trimmed - before["VmRSS"],
            "peak_anon": sampler.peak["RssAnon"] - before["RssAnon"],
            "peak_file": sampler.peak["RssFile"] - before["RssFile"],
            "shard_bytes": sum(t.numel() * t.element_size() for t in shards.values()),
            "shards": shards,
        },
        os.path.join(out_dir, f"{rank}.pt"),
    )
    dist.barrier()
    dist.destroy_process_group()


def run(method: str, path: str, ranks: int, dtype_name: str) -> list[dict]:
    """Each rank's measurements (fresh processes, so baselines and peaks are this load's only)."""
    port = free_ports(1)[0]
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(
            bench_rank, args=(ranks, port, method, path, dtype_name, out_dir), nprocs=ranks, start_method="spawn"
        )
        return [torch.load(os.path.join(out_dir, f"{r}.pt")) for r in range(ranks)]


def report(by_method: dict[str, list[dict]], model_bytes: int) -> None:
    """The per-rank table and the target line."""
    mib = lambda n: f"{n / MiB:.1f}"  # noqa: E731
    x = lambda n: f"{n / model_bytes:.3f}"  # noqa: E731
    print(
        "| method | rank | seconds | RSS added MiB | x model | after malloc_trim MiB | x model "
        "| peak added MiB | x model | peak private MiB | peak file-backed MiB | shard MiB |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for method, ranks in by_method.items():
        for rank, r in enumerate(ranks):
            who = f"{rank} (reads)" if method != "today" and rank == 0 else str(rank)
            print(
                f"| {method} | {who} | {r['seconds']:.2f} | {mib(r['added'])} | {x(r['added'])} | {mib(r['trimmed'])} "
                f"| {x(r['trimmed'])} | {mib(r['peak'])} | {x(r['peak'])} | {mib(r['peak_anon'])} "
                f"| {mib(r['peak_file'])} | {mib(r['shard_bytes'])} |"
            )
    today, ours = by_method["today"], by_method["one reader"]
    receivers = ours[1:]
    for key, label in (("added", "RSS added"), ("trimmed", "after malloc_trim"), ("peak", "peak added")):
        print(
            f"{label}: non-reading ranks worst {x(max(r[key] for r in receivers))} x model "
            f"(target <= 0.25 for RSS added); today's ranks worst {x(max(r[key] for r in today))}; node total "
            f"today {mib(sum(r[key] for r in today))} MiB, one reader {mib(sum(r[key] for r in ours))} MiB"
        )
    for method, ranks in by_method.items():  # an upper bound: the ranks' peaks need not coincide
        private, shared = sum(r["peak_anon"] for r in ranks), max(r["peak_file"] for r in ranks)
        print(
            f"node peak, {method}: private {mib(private)} MiB summed over ranks + file-backed {mib(shared)} MiB "
            f"counted once (one page-cache copy) = {mib(private + shared)} MiB"
        )
    print(
        f"seconds (max over ranks): today {max(r['seconds'] for r in today):.2f}, "
        f"one reader {max(r['seconds'] for r in ours):.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--dtype", default="float32", help="the dtype the ranks load the model in")
    parser.add_argument("--checkpoint-dtype", default="bfloat16", help="the dtype the checkpoint is saved in")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as path:
        write_checkpoint(path, torch_dtype(args.checkpoint_dtype))
        by_method = {method: run(method, path, args.ranks, args.dtype) for method in METHODS}
    first = by_method["today"]
    model_bytes = sum(r["shard_bytes"] for r in first)  # FSDP2 pads uneven dims; the bench model has none
    same = all(
        torch.equal(a["shards"][name], b["shards"][name]) for a, b in zip(*by_method.values()) for name in a["shards"]
    )
    print(
        f"model: {model_bytes / MiB:.1f} MiB of {args.dtype} parameters (checkpoint saved in {args.checkpoint_dtype}), "
        f"{args.ranks} gloo ranks; torch {torch.__version__}; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}"
    )
    print(f"both ways end with identical shards on every rank: {same}\n")
    report(by_method, model_bytes)


if __name__ == "__main__":
    main()

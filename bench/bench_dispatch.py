"""Cost of a worker-group call over the same Ray calls written by hand.

    python bench/bench_dispatch.py [--calls 200] [--big-repeats 7]

Two comparisons, each run side by side (alternating) on the same 4 ranks of a
local Ray instance:

1. per-call overhead: ``wg.echo(batch)`` (DP_COMPUTE_PROTO on a 4-rank group,
   a 32-row batch) vs chunking the batch, one ``actor.echo.remote(chunk)`` per
   rank, ``ray.get`` and ``DataProto.concat``, written by hand;
2. a 64 MiB batch through ``wg.echo(batch)`` (there and back) vs the same bytes
   as numpy arrays: ``ray.put`` of each rank's slice, the rank ``ray.get``s it
   and returns it, the driver ``ray.get``s and concatenates. The same calls
   written by hand with DataProto chunks are shown too: DataProto copies a
   worker's input out of Ray's read-only object store into writable tensors,
   which the raw numpy side never does.

Prints a Markdown table of medians and ratios.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
from collections.abc import Callable

import numpy as np
import ray
import torch

from hybridflow.core import DP_COMPUTE_PROTO, DataProto, RayWorkerGroup, ResourcePool, Worker, init_ray, register

RANKS = 4


class EchoWorker(Worker):
    """Returns its shard unchanged."""

    @register(dispatch=DP_COMPUTE_PROTO)
    def echo(self, data: DataProto) -> DataProto:
        return data


class HandEcho:
    """The hand-written side: a plain Ray actor."""

    def __init__(self) -> None:
        torch.set_num_threads(1)

    def echo(self, data: DataProto) -> DataProto:
        return data

    def echo_numpy(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return arrays


def small_batch() -> DataProto:
    return DataProto.from_dict(
        {"input_ids": torch.randint(0, 32000, (32, 128)), "attention_mask": torch.ones(32, 128, dtype=torch.int64)},
        {"uid": [f"u{i}" for i in range(32)]},
    )


def big_batch(mib: int = 64) -> DataProto:
    rows, cols = 2048, mib * 2**20 // (2048 * 8 * 2)  # two int64/float64 columns, mib MiB in all
    return DataProto.from_dict(
        {
            "input_ids": torch.randint(0, 32000, (rows, cols)),
            "old_log_probs": torch.randn(rows, cols, dtype=torch.float64),
        }
    )


def alternate(fns: list[Callable[[], object]], repeats: int, seed: int = 0) -> list[float]:
    """Median seconds of each function, interleaved in a shuffled order each round.

    Interleaving makes drift hit all alike; shuffling stops one side always
    paying for the clean-up (object frees) of the call run just before it.
    """
    rng = random.Random(seed)
    times: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    for _ in range(repeats):
        rng.shuffle(order)
        for i in order:
            start = time.perf_counter()
            fns[i]()
            times[i].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--big-repeats", type=int, default=7)
    args = parser.parse_args()

    torch.set_num_threads(1)  # the driver too: on 2 shared cores more threads only contend
    init_ray(num_cpus=4, log_to_driver=False)
    pool = ResourcePool([RANKS])
    wg = RayWorkerGroup(pool, EchoWorker)
    hand_pool = ResourcePool([RANKS])
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    hand = [
        ray.remote(HandEcho)
        .options(num_cpus=0.25, scheduling_strategy=PlacementGroupSchedulingStrategy(b.placement_group, b.bundle_index))
        .remote()
        for b in hand_pool.bundles()
    ]

    def hand_call(data: DataProto) -> DataProto:
        chunks = data.chunk(RANKS)
        return DataProto.concat(ray.get([h.echo.remote(c) for h, c in zip(hand, chunks)]))

    def raw_numpy(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        n = len(next(iter(arrays.values())))
        step = n // RANKS
        refs = [ray.put({k: v[i * step : (i + 1) * step] for k, v in arrays.items()}) for i in range(RANKS)]
        outs = ray.get([h.echo_numpy.remote(r) for h, r in zip(hand, refs)])
        return {k: np.concatenate([o[k] for o in outs]) for k in arrays}

    small = small_batch()
    assert torch.equal(wg.echo(small).batch["input_ids"], small.batch["input_ids"])
    assert torch.equal(hand_call(small).batch["input_ids"], small.batch["input_ids"])
    small_arrays = {k: v.numpy() for k, v in small.batch.items()}
    small_fns = [lambda: wg.echo(small), lambda: hand_call(small), lambda: raw_numpy(small_arrays)]
    alternate(small_fns, 20)  # warm-up
    t_group, t_hand, t_raw = alternate(small_fns, args.calls)

    big = big_batch()
    arrays = {k: v.numpy() for k, v in big.batch.items()}
    mib = sum(a.nbytes for a in arrays.values()) / 2**20
    back = wg.echo(big)
    assert all(torch.equal(back.batch[k], big.batch[k]) for k in big.batch)
    assert all(np.array_equal(raw_numpy(arrays)[k], arrays[k]) for k in arrays)
    t_big_group, t_big_hand, t_big_raw = alternate(
        [lambda: wg.echo(big), lambda: hand_call(big), lambda: raw_numpy(arrays)], args.big_repeats
    )

    print(
        f"Ray {ray.__version__}, torch {torch.__version__}, {platform.machine()}, {os.cpu_count()} cores, {RANKS} ranks"
    )
    print()
    print(
        "| measurement | hybridflow call (a) | by hand, DataProto (b) | by hand, raw numpy put/get (c) "
        "| a/b | a/c | target |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    r1 = t_group / t_hand
    print(
        f"| DP_COMPUTE_PROTO call, 32 rows, median of {args.calls} | {t_group * 1e3:.2f} ms | {t_hand * 1e3:.2f} ms "
        f"| {t_raw * 1e3:.2f} ms | {r1:.2f}x | {t_group / t_raw:.2f}x "
        f"| a/b <= 1.3x ({'met' if r1 <= 1.3 else 'missed'}) |"
    )
    r2 = t_big_group / t_big_raw
    print(
        f"| {mib:.0f} MiB batch there and back, median of {args.big_repeats} | {t_big_group * 1e3:.1f} ms "
        f"| {t_big_hand * 1e3:.1f} ms | {t_big_raw * 1e3:.1f} ms | {t_big_group / t_big_hand:.2f}x | {r2:.2f}x "
        f"| a/c <= 1.5x ({'met' if r2 <= 1.5 else 'missed'}) |"
    )

    wg.shutdown()
    for h in hand:
        ray.kill(h)
    pool.release()
    hand_pool.release()
    ray.shutdown()


if __name__ == "__main__":
    main()

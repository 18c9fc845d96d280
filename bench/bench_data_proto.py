"""DataProto operation timings on a veRL-sized batch.

    python bench/bench_data_proto.py [--rows 4096] [--repeats 7]

B rows of input_ids / attention_mask / position_ids (B, 2048) int64,
responses (B, 1024) int64, old_log_probs (B, 1024) float32 and a uid column.
Prints a Markdown table (median of ``--repeats`` runs). The pickle rows put
hybridflow's numpy-buffer pickling side by side with pickling the same dict of
torch tensors directly, in the same process.
"""

from __future__ import annotations

import argparse
import pickle
import platform
import statistics
import time

import torch

from hybridflow.core import DataProto


def build(rows: int) -> DataProto:
    gen = torch.Generator().manual_seed(0)
    seq, resp = 2048, 1024
    tensors = {
        "input_ids": torch.randint(0, 32000, (rows, seq), generator=gen),
        "attention_mask": torch.ones(rows, seq, dtype=torch.int64),
        "position_ids": torch.arange(seq).repeat(rows, 1),
        "responses": torch.randint(0, 32000, (rows, resp), generator=gen),
        "old_log_probs": torch.randn(rows, resp, generator=gen),
    }
    return DataProto.from_dict(tensors, {"uid": [f"uid-{i}" for i in range(rows)]})


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def pickle_round_trip(obj) -> None:
    pickle.loads(pickle.dumps(obj, protocol=5))


def pickle_out_of_band(obj) -> None:
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    pickle.loads(payload, buffers=buffers)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    data = build(args.rows)
    chunks = data.chunk(8)
    extra = DataProto.from_dict({"values": torch.randn(args.rows, 1024), "returns": torch.randn(args.rows, 1024)})
    small = data[:512]
    mb = sum(t.numel() * t.element_size() for t in data.batch.values()) / 2**20
    rows = [
        ("chunk(8)", median_time(lambda: data.chunk(8), args.repeats), None),
        ("concat of 8 chunks", median_time(lambda: DataProto.concat(chunks), args.repeats), 0.1),
        (
            "union of 2 new (B, 1024) float32 columns",
            median_time(lambda: data.select().union(extra), args.repeats),
            None,
        ),
        (
            "select of 3 keys",
            median_time(lambda: data.select(["input_ids", "responses", "old_log_probs"], ["uid"]), args.repeats),
            None,
        ),
        (
            "repeat(8, interleave=True), B=512",
            median_time(lambda: small.repeat(8, interleave=True), args.repeats),
            None,
        ),
        ("pickle dumps+loads (protocol 5, in-band)", median_time(lambda: pickle_round_trip(data), args.repeats), 0.3),
        (
            "pickle dumps+loads (protocol 5, out-of-band, as Ray does)",
            median_time(lambda: pickle_out_of_band(data), args.repeats),
            None,
        ),
    ]
    raw = {"batch": dict(data.batch), "uid": data.non_tensor_batch["uid"]}
    torch_pickle = median_time(lambda: pickle_round_trip(raw), args.repeats)

    print(
        f"B={args.rows}, {mb:.0f} MiB of tensors; torch {torch.__version__}, {torch.get_num_threads()} torch threads; "
        f"{platform.processor() or platform.machine()}, {torch.multiprocessing.cpu_count()} cores"
    )
    print()
    print("| operation | median s | target s |")
    print("|---|---:|---:|")
    for name, seconds, target in rows:
        verdict = "" if target is None else f"<= {target} ({'met' if seconds <= target else 'MISSED'})"
        print(f"| {name} | {seconds:.4f} | {verdict} |")
    ours = rows[5][1]
    print(
        f"| same tensors as a plain dict, pickled by torch (comparison) | {torch_pickle:.4f} | "
        f"DataProto is {torch_pickle / ours:.1f}x faster |"
    )


if __name__ == "__main__":
    main()

"""Continuous batching: the built-in engine refilling finished rows' slots vs decoding chunks, long-tail lengths.

    python bench/bench_continuous.py [--prompts 64] [--n 4] [--slots 32,64] [--max-new-tokens 128]
                                     [--repeats 3] [--threads 1]

One ``generate`` call of ``prompts x n`` rows (the ``max(...)=`` prompts of
``bench_rollout.py``, sampled at temperature 1) on ``builtin:small-qwen2`` with
random weights: its next-token distribution is close to uniform over the
32-token vocabulary, so EOS comes with probability ~1/32 at every step and
response lengths are geometric, mean ~30, a few reaching the 128-token cap: a
long tail. With ``S`` row slots (``rollout.max_num_seqs``, or what a KV-cache
budget leaves room for), the engine either decodes consecutive chunks of
``S / n`` prompts, each until its longest row ends (``refill=False``), or
refills a finished row's slot with the next waiting prompt (``refill=True``,
continuous batching). The unbounded engine (every row at once, finished rows
compacted away) runs too, as the reference.

Tokens/s counts generated tokens (up to and including EOS) over wall time;
each repeat runs every configuration once, in turn, with the same seed; the
table reports medians. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import logging
import platform
import statistics
import time

import torch
from bench_rollout import build_prompts

from hybridflow.core.keys import METRICS, RESPONSE_MASK
from hybridflow.workers.models import load_model_and_tokenizer
from hybridflow.workers.rollout import BuiltinEngine, EngineConfig, SamplingParams


def run(engine: BuiltinEngine, prompts, n: int, max_new_tokens: int, seed: int) -> dict[str, float]:
    """One generate call: generated tokens, seconds, slot utilization (when slots were refilled)."""
    start = time.perf_counter()
    out = engine.generate(prompts, n=n, seed=seed, sampling=SamplingParams(max_new_tokens=max_new_tokens))
    seconds = time.perf_counter() - start
    lengths = out.batch[RESPONSE_MASK].sum(-1).float()
    return {
        "tokens": float(lengths.sum()),
        "seconds": seconds,
        "max_len": float(lengths.max()),
        "mean_len": float(lengths.mean()),
        "util": out.meta_info[METRICS].get("rollout/slot_utilization", float("nan")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--slots", default="32,64", help="comma-separated row-slot counts (max_num_seqs)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model_and_tokenizer("builtin:small-qwen2", seed=0)
    prompts = build_prompts(tokenizer, args.prompts)
    configs = {"every row at once (no bound)": EngineConfig()}
    for slots in (int(s) for s in args.slots.split(",")):
        configs[f"{slots} slots, chunks (refill=false)"] = EngineConfig(max_num_seqs=slots, refill=False)
        configs[f"{slots} slots, refilled (refill=true)"] = EngineConfig(max_num_seqs=slots, refill=True)
    engines = {name: BuiltinEngine(model, tokenizer, config) for name, config in configs.items()}
    run(engines[next(iter(engines))], prompts, args.n, 8, seed=0)  # warm-up
    results: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
    for repeat in range(args.repeats):
        for name, engine in engines.items():
            results[name].append(run(engine, prompts, args.n, args.max_new_tokens, seed=repeat))
    rows = args.prompts * args.n
    print(
        f"\nCommand: `python bench/bench_continuous.py --prompts {args.prompts} --n {args.n} --slots {args.slots} "
        f"--max-new-tokens {args.max_new_tokens} --repeats {args.repeats} --threads {args.threads}`; "
        f"{platform.machine()}, torch {torch.__version__}, {args.threads} torch thread(s); "
        f"{rows} rows of builtin:small-qwen2 ({model.num_parameters() / 1e6:.1f}M parameters), medians of "
        f"{args.repeats} repeats.\n"
    )
    print("| engine | tokens/s | x chunks | s per call | mean / max response length | slot utilization |")
    print("|---|---:|---:|---:|---:|---:|")
    medians = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for name, runs in results.items()}
    for name, m in medians.items():
        rate = m["tokens"] / m["seconds"]
        chunks = name.replace("refilled (refill=true)", "chunks (refill=false)")
        ratio = rate / (medians[chunks]["tokens"] / medians[chunks]["seconds"]) if "slots" in name else float("nan")
        util = "" if m["util"] != m["util"] else f"{m['util']:.2f}"
        ratio_text = "" if ratio != ratio else f"{ratio:.2f}"
        print(
            f"| {name} | {rate:.0f} | {ratio_text} | {m['seconds']:.2f} | "
            f"{m['mean_len']:.1f} / {m['max_len']:.0f} | {util} |"
        )


if __name__ == "__main__":
    main()

"""Reward manager throughput: 1,000 math samples with 1 and 2 worker processes.

Run: ``.venv/bin/python bench/bench_reward.py [--samples 1000] [--batch 250] [--timeout 10]``.

The samples are a seeded mix of what a math RL run sees: correct answers in
another equivalent form (fractions, decimals, radicals, intervals, sets),
wrong answers, plain-text answers without a box, long chains of thought
ending in a box, empty or garbled responses, and about 1% pathological ones:
brackets nested far past the verifier's limit (refused unparsed), nesting
just inside it (slow to parse), huge factorials, and power towers that
sympy cannot finish (they hit the per-sample timeout and their worker is
replaced). The same samples without the pathological 1% run as a
comparison. Prints a markdown table: samples/s, worst batch latency, worst
and median sample latency, timeouts and errors, per mix and pool size.
"""

from __future__ import annotations

import argparse
import logging
import platform
import random
import statistics
import time

from hybridflow.rewards.manager import RewardManager

# (ground truth, equivalent answer, wrong answer)
PAIRS = [
    (r"\frac{1}{2}", "0.5", r"\frac{1}{3}"),
    (r"2\sqrt{2}", r"\sqrt{8}", r"\sqrt{2}"),
    ("[1,2)", "[1, 2)", "(1, 2)"),
    (r"\{1,2,3\}", r"\{3,2,1\}", r"\{1,2\}"),
    ("42", "42.0", "41"),
    (r"\frac{3}{4}", "0.75", "0.7"),
    (r"\pi", r"\pi", r"2\pi"),
    (r"(x+1)^2", r"x^2+2x+1", r"x^2+1"),
    (r"\frac{\sqrt{3}}{3}", r"\frac{1}{\sqrt{3}}", r"\sqrt{3}"),
    ("1024", "2^{10}", "2^{11}"),
    (r"(-\infty,3]", r"(-\infty, 3]", r"(-\infty, 3)"),
    ("-7", "-7", "7"),
]
FILLER = "We expand the expression and collect like terms, so that 3x + 2x = 5x and the constant is 7. "
PATHOLOGICAL = [
    (r"\boxed{" + "(" * 60 + "1" + ")" * 60 + "}", "1"),  # refused: nesting over the limit
    ("(" * 2000 + "1" + ")" * 2000, "1"),  # refused: plain text nested 2,000 deep
    (r"\boxed{" + "(" * 9 + "1" + ")" * 9 + "}", "1"),  # inside the limit: slow parse
    (r"\boxed{100000!}", "1"),  # sympy computes it: seconds
    (r"\boxed{9^{9^{9^{9}}}}", "1"),  # never finishes: timeout
]


def make_samples(n: int, seed: int = 0, pathological: bool = True) -> list[tuple[str, str]]:
    """``n`` (response, ground truth) pairs in the mix described in the module docstring."""
    rng = random.Random(seed)
    samples = []
    for i in range(n):
        gt, same, wrong = rng.choice(PAIRS)
        kind = rng.random()
        if i % 100 == 50 and pathological:  # 1%: pathological, cycling through the kinds
            samples.append(PATHOLOGICAL[(i // 100) % len(PATHOLOGICAL)])
        elif kind < 0.40:
            samples.append((f"Simplifying, the answer is $\\boxed{{{same}}}$.", gt))
        elif kind < 0.60:
            samples.append((f"Therefore the answer is $\\boxed{{{wrong}}}$.", gt))
        elif kind < 0.75:
            samples.append((f"After simplifying, the final answer is {rng.choice([same, wrong])}.", gt))
        elif kind < 0.92:
            samples.append((FILLER * rng.randint(10, 30) + f"Hence $\\boxed{{{rng.choice([same, wrong])}}}$.", gt))
        else:
            samples.append((rng.choice(["", "I am not sure.", "\\boxed{", "}}}{{{"]), gt))
    return samples


def run(num_workers: int, samples: list[tuple[str, str]], batch: int, timeout_s: float) -> dict[str, float]:
    start = time.monotonic()
    manager = RewardManager(route={"bench": "math"}, num_workers=num_workers, timeout_s=timeout_s)
    manager.score_texts(["bench"] * num_workers, [r"\boxed{1}"] * num_workers, ["1"] * num_workers)  # start workers
    startup = time.monotonic() - start
    batch_seconds, sample_seconds, timeouts, errors, correct = [], [], 0, 0, 0.0
    start = time.monotonic()
    for lo in range(0, len(samples), batch):
        part = samples[lo : lo + batch]
        t0 = time.monotonic()
        scores, _, outcomes = manager.score_texts(["bench"] * len(part), [r for r, _ in part], [g for _, g in part])
        batch_seconds.append(time.monotonic() - t0)
        sample_seconds += [o.seconds for o in outcomes]
        timeouts += sum(o.status == "timeout" for o in outcomes)
        errors += sum(o.status == "error" for o in outcomes)
        correct += sum(scores)
    total = time.monotonic() - start
    manager.close()
    return {
        "workers": num_workers,
        "startup_s": startup,
        "samples_per_s": len(samples) / total,
        "total_s": total,
        "worst_batch_s": max(batch_seconds),
        "worst_sample_s": max(sample_seconds),
        "median_sample_ms": 1000 * statistics.median(sample_seconds),
        "timeouts": timeouts,
        "errors": errors,
        "mean_score": correct / len(samples),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=250)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # the timeouts' warnings are expected here
    results = []
    for mix, pathological in (("with 1% pathological", True), ("without", False)):
        samples = make_samples(args.samples, pathological=pathological)
        results += [{"mix": mix, **run(w, samples, args.batch, args.timeout)} for w in args.workers]
    lines = [
        f"{args.samples} samples in batches of {args.batch}, timeout_s={args.timeout:g}; "
        f"{platform.machine()}, {platform.python_version()}",
        "",
        "| mix | workers | samples/s | total s | worst batch s | worst sample s | median sample ms | timeouts | errors "
        "| mean score | pool start s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['mix']} | {r['workers']} | {r['samples_per_s']:.1f} | {r['total_s']:.1f} | "
            f"{r['worst_batch_s']:.1f} | "
            f"{r['worst_sample_s']:.2f} | {r['median_sample_ms']:.1f} | {r['timeouts']} | {r['errors']} | "
            f"{r['mean_score']:.3f} | {r['startup_s']:.1f} |"
        )
    print("\n".join(lines))  # the benchmark's report is its stdout


if __name__ == "__main__":
    main()

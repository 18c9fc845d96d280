"""One training step of the default job, broken down by stage.

    python bench/bench_step.py [--steps 30] [--warmup 5] [--model builtin:tiny-qwen2] [--response-length 4]

Runs the real trainer (2 CPU ranks on a local Ray instance, GRPO, 16 prompts x
8 samples) for ``--steps`` steps and prints the mean seconds of each stage
over the steps after ``--warmup``, with its share of the whole step.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
from pathlib import Path

from omegaconf import OmegaConf

from hybridflow.configs.schema import PPOConfig
from hybridflow.trainer.main import build_and_fit

STAGES = ("gen", "old_log_prob", "ref", "reward", "values", "adv", "update")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--model", default="builtin:tiny-qwen2")
    parser.add_argument("--response-length", type=int, default=4)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        cfg = OmegaConf.structured(PPOConfig)
        for key, value in {
            "actor_rollout_ref.model.path": args.model,
            "actor_rollout_ref.rollout.response_length": args.response_length,
            "data.synthetic_dir": f"{tmp}/data",
            "trainer.total_training_steps": args.steps,
            "trainer.test_freq": 0,
            "trainer.logger": ["jsonl"],
        }.items():
            OmegaConf.update(cfg, key, value)
        build_and_fit(OmegaConf.to_object(cfg), Path(tmp) / "run")
        rows = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    measured = rows[args.warmup :]
    step_times = [sum(r[f"timing_s/{s}"] for s in STAGES if f"timing_s/{s}" in r) for r in measured]
    total = statistics.mean(step_times)
    print(f"{args.model}, response_length {args.response_length}, {len(measured)} steps after {args.warmup} warm-up; "
          f"{platform.machine()}, 2 ranks on a local Ray instance")
    print()
    print("| stage | mean s | share of step |")
    print("|---|---:|---:|")
    for stage in STAGES:
        key = f"timing_s/{stage}"
        if key in measured[0]:
            mean = statistics.mean(r[key] for r in measured)
            print(f"| {stage} | {mean:.4f} | {mean / total:.0%} |")
    print(f"| whole step | {total:.4f} | 100% |")
    tokens = statistics.mean(r["perf/tokens_per_s"] for r in measured)
    print(f"\nthroughput: {tokens:.0f} tokens/s (prompt + response, all ranks)")


if __name__ == "__main__":
    main()

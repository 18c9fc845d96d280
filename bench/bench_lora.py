"""LoRA against full fine-tuning: the same GRPO job on a ~100M-parameter model, one after the other in one run.

    python bench/bench_lora.py [--steps 4] [--warmup 1] [--model builtin:qwen2-100m-shape] [--lora-rank 16]
                               [--dtype float32|bfloat16]

Runs the real trainer (the default job's GRPO, 16 prompts x 8 samples, 2 CPU ranks, a local Ray instance) twice
on the same model and seed: full fine-tuning, then ``actor_rollout_ref.model.lora_rank`` adapters on every
linear layer. Prints, for each and as the ratio LoRA / full: the mean seconds of a whole step and of the update
after ``--warmup`` steps, the peak memory of the update (``memory/update/peak_gb``: the largest rank's resident
set on a CPU) and of the whole step, the parameters and the optimizer state each rank holds
(``actor/param_bytes_per_rank``, ``actor/optimizer_state_bytes_per_rank``). ``--dtype``: the compute dtype
(``actor_rollout_ref.model.dtype``); in bfloat16 full fine-tuning keeps fp32 masters of every weight, LoRA of its
adapters only (the frozen base is held in bf16).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile

from bench_step import STAGES, run


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--model", default="builtin:qwen2-100m-shape")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--response-length", type=int, default=4)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    return parser.parse_args()


def measure(args: argparse.Namespace, overrides: dict) -> dict[str, float]:
    job = argparse.Namespace(
        model=args.model,
        response_length=args.response_length,
        micro_batch=16,
        param_dtype=None,
        device="cpu",
        ranks=2,
        steps=args.steps,
    )
    with tempfile.TemporaryDirectory() as tmp:
        trained = [r for r in run(job, tmp, overrides) if "timing_s/update" in r]  # not a validation-only line
    measured = trained[args.warmup :]
    steps = [sum(r[f"timing_s/{s}"] for s in STAGES if f"timing_s/{s}" in r) for r in measured]
    peak = lambda key: max(r[key] for r in measured)  # noqa: E731
    return {
        "step s": statistics.mean(steps),
        "update s": statistics.mean(r["timing_s/update"] for r in measured),
        "update peak GiB": peak("memory/update/peak_gb"),
        "step peak GiB": max(
            v for r in measured for k, v in r.items() if k.startswith("memory/") and k.endswith("peak_gb")
        ),
        "parameter MiB per rank": peak("actor/param_bytes_per_rank") / 2**20,
        "optimizer MiB per rank": peak("actor/optimizer_state_bytes_per_rank") / 2**20,
    }


def main() -> None:
    args = parse()
    common = {"actor_rollout_ref.actor.optim.lr": 1e-5, "actor_rollout_ref.model.dtype": args.dtype}
    full = measure(args, common)
    lora = measure(
        args,
        {
            **common,
            "actor_rollout_ref.model.lora_rank": args.lora_rank,
            "actor_rollout_ref.model.lora_alpha": float(args.lora_rank),
        },
    )
    print(
        f"{args.model}, GRPO 16 prompts x 8, response_length {args.response_length}, {args.steps} steps "
        f"({args.warmup} warm-up), computing in {args.dtype}; {platform.machine()}, 2 CPU ranks; "
        f"LoRA rank {args.lora_rank} on all-linear"
    )
    print("\n| | full fine-tuning | LoRA | LoRA / full |")
    print("|---|---:|---:|---:|")
    for key in full:
        print(f"| {key} | {full[key]:.2f} | {lora[key]:.2f} | {lora[key] / full[key]:.2f}x |")


if __name__ == "__main__":
    main()

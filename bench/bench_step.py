"""One training step of the default job, broken down by stage, with memory and the update's MFU.

    python bench/bench_step.py [--steps 30] [--warmup 5] [--model builtin:tiny-qwen2] [--response-length 4]
        [--device cpu|cuda] [--ranks 2] [--param-dtype bfloat16] [--peak-tflops 989]

Runs the real trainer (GRPO, 16 prompts x 8 samples, a local Ray instance) for ``--steps`` steps and prints
the mean seconds of each stage over the steps after ``--warmup``, with its share of the whole step; the
generated tokens per second of the rollout; the peak memory of each stage (``memory/<stage>/peak_gb``, the
largest rank: CUDA allocated on a GPU, resident set on a CPU); and the update's model FLOPs utilization,
``6 x parameters x tokens trained / (update seconds x ranks x peak FLOP/s)`` (``--peak-tflops`` per device:
989 is an H200's dense bf16). ``bench/gpu_check.sh`` runs it with Qwen2.5-0.5B's shape on a GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
from pathlib import Path

import torch
from omegaconf import OmegaConf

from hybridflow.configs.schema import PPOConfig
from hybridflow.trainer.main import build_and_fit

STAGES = ("gen", "old_log_prob", "ref", "reward", "values", "adv", "update")


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--model", default="builtin:tiny-qwen2")
    parser.add_argument("--response-length", type=int, default=4)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--param-dtype", default=None, help="FSDP mixed precision compute dtype (e.g. bfloat16)")
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="one device's peak, for the MFU")
    parser.add_argument("--json", help="also write the summary here")
    return parser.parse_args()


def run(args: argparse.Namespace, tmp: str, overrides: dict | None = None) -> list[dict]:
    """The default job as ``args`` shape it (and ``overrides``, config keys to values); its metrics, one per step."""
    cfg = OmegaConf.structured(PPOConfig)
    for key, value in {
        "actor_rollout_ref.model.path": args.model,
        "actor_rollout_ref.rollout.response_length": args.response_length,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": args.micro_batch,
        "actor_rollout_ref.actor.fsdp_config.param_dtype": args.param_dtype,
        "data.synthetic_dir": f"{tmp}/data",
        "data.max_prompt_length": 64,
        "trainer.device": args.device,
        "trainer.n_gpus_per_node": args.ranks,
        "trainer.total_training_steps": args.steps,
        "trainer.test_freq": 0,
        "trainer.logger": ["jsonl"],
        **(overrides or {}),
    }.items():
        OmegaConf.update(cfg, key, value)
    build_and_fit(OmegaConf.to_object(cfg), Path(tmp) / "run")
    return [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    args = parse()
    with tempfile.TemporaryDirectory() as tmp:
        measured = run(args, tmp)[args.warmup :]
    mean = lambda key: statistics.mean(r[key] for r in measured)  # noqa: E731
    step_times = [sum(r[f"timing_s/{s}"] for s in STAGES if f"timing_s/{s}" in r) for r in measured]
    total = statistics.mean(step_times)
    print(
        f"{args.model}, response_length {args.response_length}, {len(measured)} steps after {args.warmup} warm-up; "
        f"{platform.machine()}, {args.ranks} {args.device} ranks on a local Ray instance, "
        f"param_dtype {args.param_dtype}"
    )
    print("\n| stage | mean s | share of step | peak memory GiB (largest rank) |")
    print("|---|---:|---:|---:|")
    for stage in STAGES:
        if f"timing_s/{stage}" in measured[0]:
            memory = measured[0].get(f"memory/{stage}/peak_gb")
            shown = f"{max(r[f'memory/{stage}/peak_gb'] for r in measured):.2f}" if memory is not None else "-"
            print(f"| {stage} | {mean(f'timing_s/{stage}'):.4f} | {mean(f'timing_s/{stage}') / total:.0%} | {shown} |")
    print(f"| whole step | {total:.4f} | 100% | |")
    generated = mean("response_length/mean") * 16 * 8 / mean("timing_s/gen")
    params = _parameters(args.model)
    trained = mean("perf/total_tokens")  # prompt + response tokens of the step, one epoch
    mfu = 6 * params * trained / (mean("timing_s/update") * args.ranks * args.peak_tflops * 1e12)
    print(f"\nrollout: {generated:.0f} generated tokens/s; all stages: {mean('perf/tokens_per_s'):.0f} tokens/s")
    print(
        f"update MFU: {mfu:.2%} (6 x {params / 1e6:.1f}M parameters x {trained:.0f} tokens per update, "
        f"{args.peak_tflops:g} TFLOP/s per device)"
    )
    print(
        "rollout vs training log-probs: largest gap "
        f"{max(r.get('rollout/log_prob_gap_max', 0.0) for r in measured):.2e}"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "step_s": total,
                    "generated_tokens_per_s": generated,
                    "mfu": mfu,
                    "gap_max": max(r.get("rollout/log_prob_gap_max", 0.0) for r in measured),
                    "memory": {k: v for k, v in measured[-1].items() if k.startswith("memory/")},
                }
            )
        )


def _parameters(path: str) -> int:
    from transformers import AutoModelForCausalLM

    from hybridflow.workers.models import load_model_config

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(load_model_config(path)).num_parameters()


if __name__ == "__main__":
    main()

"""Asynchronous RL on a long-tail workload: sync (colocated) vs one_step_off and async (split), one run.

    python bench/bench_async.py [--steps 8] [--warmup 2] [--modes sync2,sync1,one_step_off,async1,async2]
                                [--response-length 128] [--prompts 16] [--n 4] [--seed 0]

Every mode trains GRPO on the synthetic task with ``builtin:small-qwen2``
(random weights: near-uniform next tokens over its 32-token vocabulary, so
EOS comes with probability ~1/32 a step and response lengths are geometric,
mean ~30, a few reaching the cap: a heavy tail) on this machine's cores:

- ``sync2``: colocated on 2 ranks (``trainer.n_gpus_per_node=2``), the default layout;
- ``sync1``: colocated on 1 rank with 2 torch threads;
- ``one_step_off``: split, 1 training rank + 1 rollout rank;
- ``asyncK``: split 1 + 1, ``rollout_mode=async``, ``max_staleness=K``;

all with a token-level truncated importance-weight correction (off-policy
modes) and the same prompts, seeds and batch sizes. The learning rate is 1e-9 by
default (``--lr``; the config requires > 0): the policy stays put, so every
step does the same work in distribution in every mode (a trained policy would drift to other response lengths in each
mode, and the modes would time different workloads); that the modes learn
alike is checked apart, by ``hybridflow compare`` over seeds (docs/benchmarks.md). Time per trained sample
is the median step time (``timing_s/step``) over the steps after ``--warmup``,
divided by the rows of a step; the table shows each mode's ratio to the best
sync layout, the generation share of the sync step, idle times, staleness and
the weight sync's cost. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import ray
from omegaconf import OmegaConf

from hybridflow.configs.schema import PPOConfig
from hybridflow.trainer.config_checks import check_config
from hybridflow.trainer.main import build_and_fit

MODES = {
    "sync2": {"trainer.n_gpus_per_node": 2},
    "sync1": {"trainer.n_gpus_per_node": 1, "trainer.cpu_threads_per_rank": 2},
    "one_step_off": {
        "trainer.n_gpus_per_node": 1,
        "trainer.placement": "split",
        "trainer.rollout_mode": "one_step_off",
    },
    **{
        f"async{k}": {
            "trainer.n_gpus_per_node": 1,
            "trainer.placement": "split",
            "trainer.rollout_mode": "async",
            "trainer.max_staleness": k,
        }
        for k in (0, 1, 2, 3)
    },
}


def config_for(mode: str, args: argparse.Namespace, out: Path) -> PPOConfig:
    """The run of one mode (see the module docstring)."""
    cfg = OmegaConf.structured(PPOConfig)
    overrides = {
        "actor_rollout_ref.model.path": "builtin:small-qwen2",
        "data.synthetic_dir": str(out / "data"),
        "data.train_batch_size": args.prompts,
        "actor_rollout_ref.rollout.n": args.n,
        "actor_rollout_ref.rollout.response_length": args.response_length,
        "actor_rollout_ref.actor.ppo_mini_batch_size": args.prompts,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": args.prompts * args.n,
        "actor_rollout_ref.actor.optim.lr": args.lr,
        "algorithm.adv_estimator": "grpo",
        "trainer.total_training_steps": args.steps,
        "trainer.test_freq": 0,
        "trainer.seed": args.seed,
        "trainer.logger": ["jsonl"],
        **MODES[mode],
    }
    if mode.startswith(("async", "one_step")):
        overrides["algorithm.rollout_correction.rollout_is"] = "token"
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    config = OmegaConf.to_object(cfg)
    check_config(config)
    return config


def run_mode(mode: str, args: argparse.Namespace, out: Path) -> dict[str, float]:
    """Train one mode; medians of its steps after the warm-up."""
    run_dir = out / mode
    build_and_fit(config_for(mode, args, out), run_dir)
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][args.warmup :]
    med = lambda key: statistics.median(m.get(key, 0.0) for m in steps)  # noqa: E731
    rows = args.prompts * args.n
    return {
        "step_s": med("timing_s/step"),
        "per_sample_ms": 1000 * med("timing_s/step") / rows,
        "gen_s": med("timing_s/gen"),
        "update_s": med("timing_s/update"),
        "old_lp_s": med("timing_s/old_log_prob"),
        "reward_s": med("timing_s/reward"),
        "trainer_idle": med("timing_s/trainer_idle"),
        "rollout_idle": med("timing_s/rollout_idle"),
        "staleness_mean": med("async/staleness_mean"),
        "staleness_max": max(m.get("async/staleness_max", 0.0) for m in steps),
        "sync_s": med("weight_sync/seconds"),
        "tokens": med("response_length/mean") * rows,
        "ms_per_ktok": statistics.median(1e6 * m["timing_s/step"] / (m["response_length/mean"] * rows) for m in steps),
        "is_trunc": med("rollout_corr/rollout_is_ratio_fraction_high"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--modes", default="sync2,sync1,one_step_off,async1,async2")
    parser.add_argument("--response-length", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-9, help="tiny: the policy (and so the workload) stays put")
    args = parser.parse_args()
    modes = args.modes.split(",")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for mode in modes:
            results[mode] = run_mode(mode, args, Path(scratch))
            print(mode, json.dumps(results[mode]), file=sys.stderr, flush=True)
    best_sync = min((r["per_sample_ms"] for m, r in results.items() if m.startswith("sync")), default=float("nan"))
    print(
        f"\n{platform.processor() or platform.machine()}, {args.prompts} prompts x {args.n} samples, responses "
        f"<= {args.response_length} tokens, {args.steps} steps (medians of the last {args.steps - args.warmup})\n"
    )
    best_tok = min((r["ms_per_ktok"] for m, r in results.items() if m.startswith("sync")), default=float("nan"))
    print(
        "| mode | step s | ms / sample | vs best sync | ms / 1k tokens | vs best sync | gen s | update s "
        "| trainer idle s | rollout idle s "
        "| staleness mean / max | weight sync s | tokens / step | IS truncated | old log-prob s | reward s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for mode, r in results.items():
        print(
            f"| {mode} | {r['step_s']:.2f} | {r['per_sample_ms']:.1f} | {best_sync / r['per_sample_ms']:.2f}x "
            f"| {r['ms_per_ktok']:.0f} | {best_tok / r['ms_per_ktok']:.2f}x "
            f"| {r['gen_s']:.2f} | {r['update_s']:.2f} | {r['trainer_idle']:.2f} | {r['rollout_idle']:.2f} "
            f"| {r['staleness_mean']:.2f} / {r['staleness_max']:.0f} | {r['sync_s']:.3f} | {r['tokens']:.0f} "
            f"| {r['is_trunc']:.3f} | {r['old_lp_s']:.2f} | {r['reward_s']:.2f} |"
        )


if __name__ == "__main__":
    main()

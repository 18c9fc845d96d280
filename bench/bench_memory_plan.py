"""The memory plan against the memory measured: each stage's predicted peak per rank beside ``memory/<stage>/peak_gb``.

    python bench/bench_memory_plan.py [--configs tiny,full,...] [--steps 3] [--redo] [--out FILE]

Runs the real trainer (a local Ray instance, CPU ranks) for ``--steps`` steps per configuration and takes each
stage's largest measured peak over the steps (the resident set of the largest rank). Each configuration's result
is appended to ``--out`` as soon as it is measured; a rerun skips those already there (``--redo`` measures them
again). The plan (``trainer/memory_plan.py``) is made from the same config by the code as it is when the table is
printed, so a measurement stays valid as the plan changes. Prints the table ``docs/memory.md`` shows: predicted,
measured, and predicted / measured per stage.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from omegaconf import OmegaConf

from hybridflow.configs.schema import PPOConfig
from hybridflow.trainer.config_checks import check_config
from hybridflow.trainer.main import build_and_fit
from hybridflow.trainer.memory_plan import plan_memory

HUNDRED_M = {"actor_rollout_ref.model.path": "builtin:qwen2-100m-shape"}
CONFIGS: dict[str, dict] = {
    "tiny": {},
    "full": HUNDRED_M,
    "offload": {
        **HUNDRED_M,
        "actor_rollout_ref.actor.fsdp_config.param_offload": True,
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload": True,
    },
    "checkpointing": {**HUNDRED_M, "actor_rollout_ref.model.enable_gradient_checkpointing": True},
    "reduce-each": {**HUNDRED_M, "actor_rollout_ref.actor.fsdp_config.accumulate_unsharded_grads": False},
    "lora": {**HUNDRED_M, "actor_rollout_ref.model.lora_rank": 16, "actor_rollout_ref.model.lora_alpha": 16.0},
    "critic": {**HUNDRED_M, "algorithm.adv_estimator": "gae"},
    "split": {
        **HUNDRED_M,
        "trainer.placement": "split",
        "trainer.n_gpus_per_node": 1,
        "trainer.rollout_ranks": 1,
    },
    "bf16-kl": {
        **HUNDRED_M,
        "actor_rollout_ref.model.dtype": "bfloat16",
        "actor_rollout_ref.actor.use_kl_loss": True,
    },
}
"""Two model sizes (the default task's ~0.1M and a ~95M Qwen2 shape); offload, activation checkpointing, LoRA, a
critic, split placement, bf16 compute with a reference, each against the plain ~95M run."""
COMMON = {
    "data.train_batch_size": 16,
    "actor_rollout_ref.rollout.n": 8,
    "actor_rollout_ref.rollout.response_length": 16,
    "data.max_prompt_length": 24,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 16,
    "actor_rollout_ref.actor.optim.lr": 1e-5,
    "trainer.device": "cpu",
    "trainer.n_gpus_per_node": 2,
    "trainer.test_freq": 0,
    "trainer.logger": ["jsonl"],
}


def config_of(name: str, tmp: str, steps: int) -> PPOConfig:
    cfg = OmegaConf.structured(PPOConfig)
    for key, value in {
        **COMMON,
        "data.synthetic_dir": f"{tmp}/data",
        "trainer.total_training_steps": steps,
        **CONFIGS[name],
    }.items():
        OmegaConf.update(cfg, key, value)
    config = OmegaConf.to_object(cfg)
    check_config(config)
    return config


def measure(name: str, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        config = config_of(name, tmp, steps)
        build_and_fit(config, Path(tmp) / "run")
        lines = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    measured: dict[str, float] = {}
    for line in lines:
        for key, value in line.items():
            if key.startswith("memory/") and key.endswith("/peak_gb"):
                stage = key.split("/")[1]
                measured[stage] = max(measured.get(stage, 0.0), value)
    threshold = config.trainer.cpu_mmap_threshold_mb  # the measured resident set depends on it (docs/memory.md)
    return {
        "config": name,
        "overrides": CONFIGS[name],
        "steps": steps,
        "cpu_mmap_threshold_mb": threshold,
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),  # huge pages: set by a local Ray instance's start
        "measured_gb": measured,
    }


def planned(name: str) -> dict:
    """The plan of configuration ``name`` by the code as it is now (a measurement stays valid as the plan changes)."""
    with tempfile.TemporaryDirectory() as tmp:
        return plan_memory(config_of(name, tmp, 1)).as_json()


def table(results: list[dict]) -> str:
    out = [
        "| config | stage | ranks | predicted GiB | measured GiB | predicted / measured |",
        "|---|---|---|---:|---:|---:|",
    ]
    for result in results:
        for stage, plan in planned(result["config"])["stages"].items():
            measured = result["measured_gb"].get(stage)
            ratio = f"{plan['peak_gb'] / measured:.2f}" if measured else "-"
            shown = f"{measured:.3f}" if measured else "not measured"
            out.append(
                f"| {result['config']} | {stage} | {plan['ranks']} | {plan['peak_gb']:.3f} | {shown} | {ratio} |"
            )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--redo", action="store_true")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "memory_plan.jsonl"))
    args = parser.parse_args()
    out = Path(args.out)
    done = {}
    if out.is_file():
        done = {r["config"]: r for r in map(json.loads, out.read_text().splitlines()) if r["config"] in CONFIGS}
    for name in args.configs.split(","):
        if name in done and not args.redo:
            continue
        done[name] = measure(name, args.steps)
        with open(out, "a") as f:
            f.write(json.dumps(done[name]) + "\n")
        print(table([done[name]]), flush=True)
    print(table([done[n] for n in CONFIGS if n in done]))


if __name__ == "__main__":
    main()

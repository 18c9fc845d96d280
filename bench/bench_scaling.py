"""How the cost grows: hybridflow against TRL's ``GRPOTrainer`` over response length and model size, resumably.

Each point of the grid is one short measurement of ``bench/bench_vs_trl.py`` (both trainers side by side in
turns, the same task, prompts, samples and settings, no validation): a model, a response length and a seed,
a few warm-up steps left out of the means. A point's result is appended to ``--results`` (one JSON line) the
moment it finishes; a rerun skips the points already there (``--redo`` measures them again), so the grid runs
across as many sessions as it needs, in the background::

    nohup .venv-bench/bin/python bench/bench_scaling.py [--points small-qwen2:128:0,...] [--redo] &

``--list`` prints the grid and what is done; ``--report`` prints the Markdown table of what is there (for the
Scaling section of docs/benchmarks.md). Setup of ``.venv-bench``: bench/bench_vs_trl.py's docstring.

Equal work is measured, not assumed: the models have random weights, so the responses end at EOS at random
lengths, and each trainer's generated tokens per step are reported beside its time; the ratios are given per
step and per generated token (``ratio_per_token``: TRL's seconds per generated token over hybridflow's).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "scaling.jsonl"


@dataclass(frozen=True)
class Point:
    """One measurement: a built-in model, a response length, a seed, and how many steps (the first ``warmup``
    left out)."""

    model: str
    response_length: int
    seed: int
    steps: int
    warmup: int
    ignore_eos: bool = False
    hogs: int = 0
    """Processes that each keep a core busy through the point (the shared-machine point)."""

    @property
    def key(self) -> str:
        return (
            f"{self.model}:{self.response_length}:{self.seed}"
            + (":fixed" if self.ignore_eos else "")
            + (f":hog{self.hogs}" if self.hogs else "")
        )


def grid(ignore_eos: bool = False) -> list[Point]:
    """The issue's grid: responses up to 32, 128 and 512 tokens on the ~3M and ~25M models, the ~95M model at 128;
    3 seeds at 128 tokens, 1 elsewhere; and the ~3M model's 128-token point beside one CPU hog (a shared
    machine: keys end in ``:hog1``). Fewer timed steps where a step is long (the ~25M model's 512-token point
    took 918 s at 5 steps with 2 warm-up, hence 4 with 1).
    ``ignore_eos``: every response runs to its length (equal work by design; keys end in ``:fixed``)."""
    points = []
    for model, lengths in (("small-qwen2", (32, 128, 512)), ("qwen2-25m-shape", (32, 128, 512))):
        for length in lengths:
            seeds = (0, 1, 2) if length == 128 else (0,)
            long = length == 512 or model != "small-qwen2"
            steps, warmup = (4, 1) if length == 512 and model != "small-qwen2" else (5 if long else 8, 2)
            points += [Point(model, length, seed, steps, warmup, ignore_eos) for seed in seeds]
    points += [Point("qwen2-100m-shape", 128, seed, 4, 1, ignore_eos) for seed in (0, 1, 2)]
    points += [Point("small-qwen2", 128, seed, 6, 2, ignore_eos, hogs=1) for seed in (0, 1, 2)]
    return points


def done(path: Path) -> dict[str, dict]:
    """The results already in ``path``, by point key (the last line of a point wins)."""
    if not path.exists():
        return {}
    lines = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return {line["key"]: line for line in lines}


def measure(point: Point, python: str) -> dict:
    """Run bench_vs_trl.py for one point; its record (both trainers, ratios, the machine's load)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        command = [
            python,
            str(HERE / "bench_vs_trl.py"),
            f"--model=builtin:{point.model}",
            f"--response-length={point.response_length}",
            f"--seeds={point.seed}",
            f"--steps={point.steps}",
            f"--warmup={point.warmup}",
            "--no-val",
            f"--results-json={out}",
            *(["--ignore-eos"] if point.ignore_eos else []),
            f"--hogs={point.hogs}",
        ]
        start = time.time()
        subprocess.run(command, check=True)
        result = json.loads(out.read_text())
    run = result["runs"][0]
    hf, trl = run["hybridflow"], run["trl"]
    return {
        "key": point.key,
        **asdict(point),
        "params_m": round(result["params_m"], 1),
        "hybridflow": _trainer(hf),
        "trl": _trainer(trl),
        "ratio_per_step": trl["step_s"] / hf["step_s"],
        "ratio_per_token": hf["gen_tokens_per_s"] / trl["gen_tokens_per_s"],
        "load_before": result["load_before"],
        "load_after": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "wall_s": round(time.time() - start, 1),
        "versions": result["versions"],
        "commit": _commit(),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def _commit() -> str:
    """The checkout's commit, ``+`` when it has uncommitted changes: which code a record measured."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + ("+" if git("status", "--porcelain", "--untracked-files=no") else "")


def _trainer(result: dict) -> dict:
    keys = ("step_s", "step_s_stdev", "gen_tokens_per_step", "gen_tokens_per_s", "peak_rss_gb", "stages_s", "layout")
    return {key: result[key] for key in keys}


def report(records: list[dict]) -> str:
    """The Markdown grid: one row per model and length (means over its seeds)."""
    lines = [
        "| model | response length | seeds | hybridflow s/step | TRL s/step | tokens/step (hf, TRL) "
        "| hybridflow / TRL per step | per generated token | peak RSS GiB (hf, TRL) | hybridflow threads | commit |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    groups: dict[tuple[str, int, bool, int], list[dict]] = {}
    for record in records:
        fixed = record.get("ignore_eos", False)
        groups.setdefault((record["model"], record["response_length"], fixed, record.get("hogs", 0)), []).append(record)
    for (model, length, fixed, hogs), rows in sorted(
        groups.items(), key=lambda kv: (kv[0][2], kv[0][3], kv[1][0]["params_m"], kv[0][1])
    ):
        mean = lambda f: statistics.mean(f(r) for r in rows)  # noqa: E731
        lines.append(
            f"| {model} ({rows[0]['params_m']}M){f', {hogs} CPU hog' if hogs else ''} "
            f"| {'exactly' if fixed else 'up to'} {length} | {len(rows)} "
            f"| {mean(lambda r: r['hybridflow']['step_s']):.2f} | {mean(lambda r: r['trl']['step_s']):.2f} "
            f"| {mean(lambda r: r['hybridflow']['gen_tokens_per_step']):.0f}, "
            f"{mean(lambda r: r['trl']['gen_tokens_per_step']):.0f} "
            f"| {mean(lambda r: r['ratio_per_step']):.2f}x | {mean(lambda r: r['ratio_per_token']):.2f}x "
            f"| {mean(lambda r: r['hybridflow']['peak_rss_gb']):.1f}, {mean(lambda r: r['trl']['peak_rss_gb']):.1f} "
            f"| {', '.join(sorted({_threads(r) for r in rows}))} "
            f"| {', '.join(sorted({r.get('commit', 'before 5b48bb5') for r in rows}))} |"
        )
    at_128 = [r for r in records if r.get("ignore_eos") and not r.get("hogs") and r["response_length"] == 128]
    if at_128:
        by_model = {m: [r["ratio_per_step"] for r in at_128 if r["model"] == m] for m in {r["model"] for r in at_128}}
        parts = ", ".join(
            f"~{_params(at_128, m):.0f}M {statistics.mean(v):.2f}x ({len(v)} seeds)"
            for m, v in sorted(by_model.items(), key=lambda kv: _params(at_128, kv[0]))
        )
        mean = statistics.mean(r["ratio_per_step"] for r in at_128)
        lines += ["", f"scaling, 128 tokens: hybridflow / TRL {mean:.2f}x (equal work, mean over seeds: {parts})"]
    return "\n".join(lines)


def plot(records: list[dict], path: Path) -> None:
    """Seconds per step against response length on equal work (the ``:fixed`` points, no hogs): one line per model
    and trainer, the mean over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fixed = [r for r in records if r.get("ignore_eos") and not r.get("hogs")]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, model in enumerate(sorted({r["model"] for r in fixed}, key=lambda m: _params(fixed, m))):
        for trainer, style in (("hybridflow", "-o"), ("trl", "--s")):
            lengths = sorted({r["response_length"] for r in fixed if r["model"] == model})
            seconds = [
                statistics.mean(
                    r[trainer]["step_s"] for r in fixed if r["model"] == model and r["response_length"] == length
                )
                for length in lengths
            ]
            name = "hybridflow" if trainer == "hybridflow" else "TRL"
            ax.plot(lengths, seconds, style, color=f"C{i}", label=f"{name}, {model} ({_params(fixed, model)}M)")
    ax.set_xscale("log", base=2)
    lengths = sorted({r["response_length"] for r in fixed})
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.set_xlabel("response length (tokens, every response that long)")
    ax.set_ylabel("seconds per step (16 prompts x 8 samples)")
    ax.set_title("GRPO step on 2 CPU cores: hybridflow against TRL's GRPOTrainer")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _threads(record: dict) -> str:
    """hybridflow's torch threads a rank, from its layout line ("1 rank(s) x 2 torch thread(s) ...")."""
    return record["hybridflow"]["layout"].split(" x ")[1].split(" torch")[0]


def _params(records: list[dict], model: str) -> float:
    return next(r["params_m"] for r in records if r["model"] == model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", help="comma-separated model:length:seed keys (default: the whole grid)")
    parser.add_argument("--redo", action="store_true", help="measure points that are already in the results")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--list", action="store_true", help="print the grid and what is done, run nothing")
    parser.add_argument("--report", action="store_true", help="print the Markdown table of the results")
    parser.add_argument("--plot", type=Path, help="draw the equal-work grid here (docs/images/scaling.png)")
    parser.add_argument(
        "--ignore-eos", action="store_true", help="the grid with every response run to its length (equal work)"
    )
    args = parser.parse_args()
    points = grid(args.ignore_eos)
    if args.points:
        wanted = set(args.points.split(","))
        unknown = wanted - {p.key for p in points}
        if unknown:
            parser.error(f"not points of the grid: {', '.join(sorted(unknown))} (--list shows them)")
        points = [p for p in points if p.key in wanted]
    have = done(args.results)
    if args.report or args.plot:
        if args.report:
            print(report(list(have.values())))
        if args.plot:
            plot(list(have.values()), args.plot)
        return
    if args.list:
        for p in points:
            print(f"{p.key:28} {'done' if p.key in have else 'to do'}")
        return
    args.results.parent.mkdir(parents=True, exist_ok=True)
    for point in points:
        if point.key in have and not args.redo:
            continue
        print(f"[{time.strftime('%H:%M:%S')}] {point.key}: {point.steps} steps ({point.warmup} warm-up)", flush=True)
        record = measure(point, sys.executable)
        with args.results.open("a") as f:
            f.write(json.dumps(record) + "\n")
        print(
            f"[{time.strftime('%H:%M:%S')}] {point.key}: hybridflow / TRL {record['ratio_per_step']:.2f}x per step, "
            f"{record['ratio_per_token']:.2f}x per token ({record['wall_s']:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()

"""``hybridflow compare``: read runs' metrics, group them, draw one PNG and one table.

A run is a directory holding ``metrics.jsonl`` (and, when Hydra made it,
``.hydra/overrides.yaml``); a sweep directory is searched for runs. Runs are
grouped by their overrides with the seed left out, so the seeds of one
setting become one line (mean across seeds, shaded from min to max).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import yaml

SEED_KEYS = ("trainer.seed", "seed")
PLOTTED = (("score/mean", "training score"), ("val/accuracy", "validation accuracy"))


@dataclass
class Run:
    """One run's overrides (seed left out), seed and per-step metrics."""

    path: Path
    overrides: dict[str, str]
    seed: str
    steps: list[dict]
    label: str = ""

    def series(self, key: str) -> dict[int, float]:
        """step -> value of ``key`` at the steps that logged it."""
        return {m["step"]: m[key] for m in self.steps if isinstance(m.get(key), (int, float))}


def load_run(path: Path) -> Run:
    """Read ``metrics.jsonl`` and the Hydra overrides (if any) of one run directory."""
    steps = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    overrides_file = path / ".hydra" / "overrides.yaml"
    overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.exists() else []
    pairs = dict(o.lstrip("+~").split("=", 1) for o in overrides or [] if "=" in o)
    seed = next((pairs.pop(k) for k in SEED_KEYS if k in pairs), "0")
    return Run(path, pairs, seed, steps)


def find_runs(paths: list[str | Path]) -> list[Run]:
    """Every run under ``paths`` (run directories or sweep directories), in path order."""
    found = []
    for root in map(Path, paths):
        if not root.exists():
            raise FileNotFoundError(f"{root} does not exist")
        files = [root / "metrics.jsonl"] if (root / "metrics.jsonl").exists() else sorted(root.rglob("metrics.jsonl"))
        found += [load_run(f.parent) for f in files]
    if not found:
        raise FileNotFoundError(f"no metrics.jsonl under {', '.join(map(str, paths))}: nothing to compare")
    return found


def group_runs(runs: list[Run]) -> dict[str, list[Run]]:
    """Runs by label, labels sorted; a label shows only the overrides that differ between runs."""
    keys = {k for r in runs for k in r.overrides}
    varying = sorted(k for k in keys if len({r.overrides.get(k) for r in runs}) > 1)
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        run.label = ",".join(f"{k.rsplit('.', 1)[-1]}={run.overrides.get(k, '-')}" for k in varying) or "defaults"
        groups[run.label].append(run)
    return dict(sorted(groups.items()))


def _steps_to(run: Run, threshold: float) -> int | None:
    return next((step for step, acc in sorted(run.series("val/accuracy").items()) if acc >= threshold), None)


def _fmt(values: list[float], digits: int = 3) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def summary_table(groups: dict[str, list[Run]], threshold: float) -> str:
    """Markdown: final validation accuracy, steps to ``threshold``, train time and tokens/s per group."""
    lines = [
        f"| setting | seeds | final val accuracy | steps to val >= {threshold} | train time s | tokens/s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, runs in groups.items():
        final = [list(r.series("val/accuracy").values())[-1] for r in runs if r.series("val/accuracy")]
        reached = [s for s in (_steps_to(r, threshold) for r in runs) if s is not None]
        steps_cell = f"{_fmt(reached, 1)} ({len(reached)}/{len(runs)} reached)"
        times = [sum(v for m in r.steps for k, v in m.items() if k.startswith("timing_s/")) for r in runs]
        speed = [statistics.mean(r.series("perf/tokens_per_s").values()) for r in runs if r.series("perf/tokens_per_s")]
        lines.append(f"| {label} | {len(runs)} | {_fmt(final)} | {steps_cell} | {_fmt(times, 1)} | {_fmt(speed, 0)} |")
    return "\n".join(lines)


def plot(groups: dict[str, list[Run]], out: Path) -> None:
    """One PNG: training score and validation accuracy vs step, mean and min-max band per group."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PLOTTED), figsize=(6 * len(PLOTTED), 4.2))
    for ax, (key, title) in zip(axes, PLOTTED):
        for label, runs in groups.items():
            series = [r.series(key) for r in runs]
            steps = sorted(set.intersection(*(set(s) for s in series))) if series else []
            if not steps:
                continue
            values = [[s[step] for s in series] for step in steps]
            mean = [statistics.mean(v) for v in values]
            (line,) = ax.plot(steps, mean, label=f"{label} (n={len(runs)})")
            ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values], color=line.get_color(), alpha=0.2)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def compare(paths: list[str | Path], out_dir: str | Path, threshold: float = 0.8) -> tuple[Path, Path]:
    """Write ``compare.png`` and ``compare.md`` into ``out_dir``; returns their paths."""
    groups = group_runs(find_runs(paths))
    out_dir = Path(out_dir)
    png, table = out_dir / "compare.png", out_dir / "compare.md"
    plot(groups, png)
    table.write_text(summary_table(groups, threshold) + "\n")
    return png, table

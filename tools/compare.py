"""``hybridflow compare``: read runs' metrics, group them, draw one PNG and one table.

A run is a directory holding ``metrics.jsonl`` (and, when Hydra made it,
``.hydra/overrides.yaml`` and ``.hydra/config.yaml``); a sweep directory is
searched for runs. Runs are grouped by their overrides with the seed left out,
so the seeds of one setting become one line (mean across seeds, shaded from
min to max) and one row of the table (mean ± the half-width of a 95% Student-t
confidence interval over seeds).

The picture is meant to go into a paper as it is: the legend sits below the
axes, never over a curve; each setting has its own colour, line style and
marker (markers staggered along the curve), so two identical curves stay
visible without moving any point; metrics known to lie in [0, 1] (see
:func:`is_unit_interval`) get a fixed 0-1 axis.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

if TYPE_CHECKING:
    from matplotlib.figure import Figure

logger = logging.getLogger(__name__)

SEED_KEYS = ("trainer.seed", "seed")
PLOTTED = (("score/mean", "training score"), ("val/accuracy", "validation accuracy"))
X_LABELS = {"step": "training step", "samples": "training samples (responses)"}
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
MARKERS_PER_CURVE = 10


class CompareError(ValueError):
    """Runs that cannot be compared as asked (a bad ``--label``, ``--x samples`` without the sizes)."""


# Two-sided 95% Student t quantiles t_{0.975, df} for df = 1..30, to four decimals
# (scipy.stats.t.ppf(0.975, df); rounded to three they are the table of the
# NIST/SEMATECH e-Handbook of Statistical Methods, section 1.3.6.7.2, "Critical
# values of the Student's t distribution").
T_975 = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
)  # fmt: skip
Z_975 = 1.959963984540054


def t_quantile_975(df: int) -> float:
    """``t_{0.975, df}``, the Student t quantile of a two-sided 95% interval (no scipy needed).

    df 1..30 from :data:`T_975`; beyond, the Cornish-Fisher expansion of t around
    the normal quantile z (Abramowitz & Stegun, Handbook of Mathematical Functions,
    26.7.5), whose first four terms are within 3e-8 of the exact value for df > 30.
    """
    if df < 1:
        raise ValueError(f"a t interval needs at least 1 degree of freedom, got {df}")
    if df <= len(T_975):
        return T_975[df - 1]
    z = Z_975
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


def ci_half_width(values: list[float]) -> float | None:
    """Half-width of the 95% t interval of the mean: ``t_{0.975, n-1} * s / sqrt(n)``; None for n < 2."""
    if len(values) < 2:
        return None
    return t_quantile_975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def is_unit_interval(key: str) -> bool:
    """Whether ``key`` is known to lie in [0, 1], and so is drawn on a fixed 0-1 axis.

    Every ``*accuracy*`` metric hybridflow logs (``val/accuracy``, ``score/accuracy``)
    is a share of responses. ``score/mean`` is not: a verifier may give partial
    credit, and penalties (overlong responses, KL in the reward) can push it
    below 0, so it keeps an automatic axis.
    """
    return "accuracy" in key


@dataclass
class Run:
    """One run's overrides (seed left out), seed, per-step metrics and training rows per step."""

    path: Path
    overrides: dict[str, str]
    seed: str
    steps: list[dict]
    samples_per_step: int | None = None
    """``data.train_batch_size x actor_rollout_ref.rollout.n`` from ``.hydra/config.yaml``, if recorded."""
    label: str = ""

    def series(self, key: str) -> dict[int, float]:
        """step -> value of ``key`` at the steps that logged it."""
        return {m["step"]: m[key] for m in self.steps if isinstance(m.get(key), (int, float))}


def _samples_per_step(config_file: Path) -> int | None:
    # every step trains on exactly train_batch_size prompts x rollout.n responses
    # (the prompt loader drops the last partial batch; nothing filters rows)
    if not config_file.exists():
        return None
    config = yaml.safe_load(config_file.read_text()) or {}
    try:
        return int(config["data"]["train_batch_size"]) * int(config["actor_rollout_ref"]["rollout"]["n"])
    except (KeyError, TypeError, ValueError):
        return None


def load_run(path: Path) -> Run:
    """Read ``metrics.jsonl``, the Hydra overrides and the rows per step (if any) of one run directory."""
    steps = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    overrides_file = path / ".hydra" / "overrides.yaml"
    overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.exists() else []
    pairs = dict(o.lstrip("+~").split("=", 1) for o in overrides or [] if "=" in o)
    seed = next((pairs.pop(k) for k in SEED_KEYS if k in pairs), "0")
    return Run(path, pairs, seed, steps, _samples_per_step(path / ".hydra" / "config.yaml"))


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
    """Runs by setting, settings sorted; a setting shows only the overrides that differ between runs."""
    keys = {k for r in runs for k in r.overrides}
    varying = sorted(k for k in keys if len({r.overrides.get(k) for r in runs}) > 1)
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        run.label = ",".join(f"{k.rsplit('.', 1)[-1]}={run.overrides.get(k, '-')}" for k in varying) or "defaults"
        groups[run.label].append(run)
    return dict(sorted(groups.items()))


def _values_only(setting: str) -> str:
    return ",".join(part.split("=", 1)[-1] for part in setting.split(","))


def apply_labels(groups: dict[str, list[Run]], labels: list[str]) -> dict[str, list[Run]]:
    """Rename settings with ``SETTING=NAME`` specs; SETTING is the table's setting or only its values.

    ``adv_estimator=grpo=GRPO`` and ``grpo=GRPO`` both name the setting
    ``adv_estimator=grpo``. Settings keep their order; unnamed ones keep their setting.
    """
    names: dict[str, str] = {}
    for spec in labels:
        matches = {s for s in groups for alias in (s, _values_only(s)) if spec.startswith(alias + "=")}
        if len(matches) != 1:
            reason = "names no setting" if not matches else f"is ambiguous ({', '.join(sorted(matches))})"
            raise CompareError(f"--label {spec!r} {reason}; give SETTING=NAME with SETTING one of: {', '.join(groups)}")
        (setting,) = matches
        if setting in names:
            raise CompareError(f"--label names the setting {setting!r} twice")
        alias = setting if spec.startswith(setting + "=") else _values_only(setting)
        names[setting] = spec[len(alias) + 1 :]
    renamed = [names.get(s, s) for s in groups]
    if len(set(renamed)) < len(renamed):
        raise CompareError(f"--label gives two settings the same name: {renamed}")
    return dict(zip(renamed, groups.values()))


def _rows_per_step(name: str, runs: list[Run]) -> int:
    sizes = {r.samples_per_step for r in runs}
    if None in sizes:
        missing = ", ".join(str(r.path) for r in runs if r.samples_per_step is None)
        raise CompareError(
            "--x samples: the runs log no sample count, and these do not record data.train_batch_size and "
            f"actor_rollout_ref.rollout.n in .hydra/config.yaml: {missing}; plot against steps instead"
        )
    if len(sizes) > 1:
        raise CompareError(f"--x samples: the seeds of {name!r} train on different rows per step ({sorted(sizes)})")
    return sizes.pop()


def check_x_axis(groups: dict[str, list[Run]], x: str) -> None:
    """Fail before drawing anything when ``x`` cannot be drawn for these runs."""
    if x not in X_LABELS:
        raise CompareError(f"x axis {x!r}: choose one of {', '.join(X_LABELS)}")
    if x == "samples":
        for name, runs in groups.items():
            _rows_per_step(name, runs)


def seeds_label(name: str, runs: list[Run]) -> str:
    """``grpo (2 seeds)``: the legend entry of one setting."""
    return f"{name} ({len(runs)} seed{'' if len(runs) == 1 else 's'})"


def _plot_setting(ax, i: int, n_settings: int, runs: list[Run], key: str, scale: int):
    """Setting ``i``'s mean line and min-max band of ``key`` on ``ax``; (line, lows, highs), or None if not logged."""
    series = [r.series(key) for r in runs]
    steps = sorted(set.intersection(*(set(s) for s in series)))
    if not steps:
        return None
    xs = [step * scale for step in steps]
    values = [[s[step] for s in series] for step in steps]
    lows, highs = [min(v) for v in values], [max(v) for v in values]
    every = max(1, len(steps) // MARKERS_PER_CURVE)
    (line,) = ax.plot(
        xs, [statistics.mean(v) for v in values], color=f"C{i % 10}", linestyle=LINESTYLES[i % len(LINESTYLES)],
        marker=MARKERS[i % len(MARKERS)], markerfacecolor="none", markersize=max(4.0, 8.5 - 1.5 * i),
        linewidth=max(1.5, 2.6 - 0.6 * i), markevery=(i * every // n_settings, every), clip_on=False,
    )  # fmt: skip
    ax.fill_between(xs, lows, highs, color=line.get_color(), alpha=0.15, linewidth=0)
    return line, lows, highs


def draw(groups: dict[str, list[Run]], x: str = "step", title: str | None = None) -> Figure:
    """Training score and validation accuracy against ``x``: mean and min-max band per setting.

    One legend for both panels, below them (constrained layout keeps it off the axes).
    Settings drawn first get wider lines and larger open markers, and markers are
    staggered between settings, so a later setting with the same values lies
    inside an earlier one instead of hiding it.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    check_x_axis(groups, x)
    fig = Figure(figsize=(6 * len(PLOTTED), 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    handles = {}
    for ax, (key, panel_title) in zip(fig.subplots(1, len(PLOTTED)), PLOTTED):
        lows, highs = [], []
        for i, (name, runs) in enumerate(groups.items()):
            scale = _rows_per_step(name, runs) if x == "samples" else 1
            if drawn := _plot_setting(ax, i, len(groups), runs, key, scale):
                handles.setdefault(name, (drawn[0], seeds_label(name, runs)))
                lows, highs = lows + drawn[1], highs + drawn[2]
        if is_unit_interval(key) and lows and min(lows) >= 0 and max(highs) <= 1:
            ax.set_ylim(0, 1)
        elif is_unit_interval(key) and lows:
            logger.warning("%s has values outside [0, 1]: drawn on an automatic axis", key)
        ax.set(title=panel_title, xlabel=X_LABELS[x], ylabel=key)
        ax.grid(alpha=0.3)
    if handles:
        lines, texts = zip(*handles.values())
        # as many columns as fit across the figure (about 12 characters per inch at 10 pt, plus the handle)
        columns = max(1, min(len(lines), 4, int(fig.get_figwidth() * 12) // (max(map(len, texts)) + 6)))
        fig.legend(lines, texts, loc="outside lower center", ncol=columns, frameon=False)
    if title:
        fig.suptitle(title)
    return fig


def _steps_to(run: Run, threshold: float) -> int | None:
    return next((step for step, acc in sorted(run.series("val/accuracy").items()) if acc >= threshold), None)


def _fmt(values: list[float], digits: int = 3) -> str:
    """``mean ± 95% CI half-width``; ``mean ± n/a`` for one value; ``-`` for none."""
    if not values:
        return "-"
    half = ci_half_width(values)
    return f"{statistics.mean(values):.{digits}f} ± " + ("n/a" if half is None else f"{half:.{digits}f}")


def summary_table(groups: dict[str, list[Run]], threshold: float) -> str:
    """Markdown: final validation accuracy, steps to ``threshold``, train time and tokens/s per setting."""
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
    lines += [
        "",
        "Each cell is the mean over seeds ± the half-width of its 95% Student-t confidence interval",
        "(t quantile for seeds - 1 degrees of freedom); n/a with one seed. Steps to the threshold",
        "average only the seeds that reached it.",
    ]
    return "\n".join(lines)


def compare(
    paths: list[str | Path],
    out_dir: str | Path,
    threshold: float = 0.8,
    *,
    labels: Sequence[str] = (),
    x: str = "step",
    title: str | None = None,
    ignore: Sequence[str] = (),
) -> tuple[Path, Path]:
    """Write ``compare.png`` and ``compare.md`` into ``out_dir``; returns their paths.

    :param labels: ``SETTING=NAME`` specs (:func:`apply_labels`).
    :param x: ``step`` or ``samples`` (training responses so far).
    :param title: the figure's title (none by default).
    :param ignore: override keys left out of the grouping, as the seed is: a value that follows the seed
        (``reward_model.model.path`` of each seed's own reward model) keeps its runs one setting.
    """
    runs = find_runs(paths)
    for run in runs:
        for key in ignore:
            run.overrides.pop(key, None)
    groups = apply_labels(group_runs(runs), list(labels))
    check_x_axis(groups, x)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    png, table = out_dir / "compare.png", out_dir / "compare.md"
    draw(groups, x=x, title=title).savefig(png, dpi=150)
    table.write_text(summary_table(groups, threshold) + "\n")
    return png, table

"""``hybridflow compare`` on run directories laid out as Hydra writes them."""

import json
import subprocess
import sys

import pytest

from hybridflow.cli import main
from hybridflow.tools.compare import (
    CompareError,
    apply_labels,
    ci_half_width,
    compare,
    draw,
    find_runs,
    group_runs,
    summary_table,
    t_quantile_975,
)


def write_run(root, overrides, val, score=0.5, timing=1.0, rows=None):
    """A run directory: ``rows=(train_batch_size, rollout.n)`` also writes ``.hydra/config.yaml``."""
    root.mkdir(parents=True)
    (root / ".hydra").mkdir()
    (root / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if rows is not None:
        config = {"data": {"train_batch_size": rows[0]}, "actor_rollout_ref": {"rollout": {"n": rows[1]}}}
        (root / ".hydra" / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
    lines = []
    for step, acc in enumerate(val, start=1):
        lines.append(
            {"step": step, "score/mean": score, "val/accuracy": acc, "timing_s/gen": timing, "perf/tokens_per_s": 100.0}
        )
    (root / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))


@pytest.fixture
def sweep(tmp_path):
    write_run(tmp_path / "0", ["algorithm.adv_estimator=grpo", "trainer.seed=0"], [0.1, 0.9, 1.0])
    write_run(tmp_path / "1", ["algorithm.adv_estimator=grpo", "trainer.seed=1"], [0.2, 0.5, 0.8])
    write_run(tmp_path / "2", ["algorithm.adv_estimator=rloo", "trainer.seed=0"], [0.0, 0.3, 0.6], timing=2.0)
    return tmp_path


@pytest.fixture
def twins(tmp_path):
    """Two settings with identical curves and one different, rows per step recorded."""
    for i, est in enumerate(("grpo", "grpo_copy")):
        write_run(tmp_path / f"{i}", [f"algorithm.adv_estimator={est}", "trainer.seed=0"], [0.2, 0.6, 0.9], rows=(4, 2))
    write_run(tmp_path / "2", ["algorithm.adv_estimator=rloo", "trainer.seed=0"], [0.1, 0.3, 0.5], rows=(4, 2))
    return tmp_path


def _rows(table):
    return {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[2:] if line.startswith("|")}


def _lines(fig, panel):
    """The plotted lines of one panel (0: training score, 1: validation accuracy) by legend text."""
    ax = fig.axes[panel]
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    return dict(zip(texts, ax.get_lines()))


def test_runs_group_by_overrides_without_the_seed(sweep):
    groups = group_runs(find_runs([sweep]))
    assert {k: sorted(r.seed for r in v) for k, v in groups.items()} == {
        "adv_estimator=grpo": ["0", "1"],
        "adv_estimator=rloo": ["0"],
    }


def test_an_ignored_key_that_follows_the_seed_keeps_the_seeds_one_setting(tmp_path):
    for seed in (0, 1):  # each seed trained its own reward model
        write_run(
            tmp_path / f"g{seed}",
            ["experiment=rlhf", f"reward_model.model.path=/rm_s{seed}", f"trainer.seed={seed}"],
            [0.1, 0.5 + seed / 10],
        )
    write_run(tmp_path / "p0", ["experiment=rlhf_ppo", "reward_model.model.path=/rm_s0", "trainer.seed=0"], [0.2, 0.7])
    _, table = compare([tmp_path], tmp_path / "out", ignore=["reward_model.model.path"])
    assert set(_rows(table.read_text())) == {"experiment=rlhf", "experiment=rlhf_ppo"}
    assert "| 2 | 0.550" in _rows(table.read_text())["experiment=rlhf"]  # both seeds, final accuracies 0.5 and 0.6
    _, table = compare([tmp_path], tmp_path / "out")
    assert len(_rows(table.read_text())) == 3  # without it each seed's path is a setting of its own


def test_t_quantiles_match_the_tables():
    # textbook values of t_{0.975, df}; beyond df 30 the expansion, against scipy.stats.t.ppf(0.975, df)
    assert t_quantile_975(1) == pytest.approx(12.706, abs=5e-4)
    assert t_quantile_975(2) == pytest.approx(4.303, abs=5e-4)
    assert t_quantile_975(30) == pytest.approx(2.042, abs=5e-4)
    assert t_quantile_975(31) == pytest.approx(2.039513, abs=1e-6)
    assert t_quantile_975(60) == pytest.approx(2.000298, abs=1e-6)
    assert t_quantile_975(10_000) == pytest.approx(1.960201, abs=1e-6)
    with pytest.raises(ValueError):
        t_quantile_975(0)


def test_ci_half_width_by_hand():
    # mean 0.9, s = 0.1, t_{0.975,2} = 4.3027: 4.3027 * 0.1 / sqrt(3) = 0.24842
    assert ci_half_width([0.8, 0.9, 1.0]) == pytest.approx(0.24842, abs=1e-5)
    assert ci_half_width([0.7]) is None


def test_table_numbers(sweep):
    table = summary_table(group_runs(find_runs([sweep])), threshold=0.8)
    rows = _rows(table)
    # grpo: final 1.0 and 0.8 -> mean 0.9, s = 0.1414, t_{0.975,1} = 12.706: 12.706 * 0.1414 / sqrt(2) = 1.271;
    # reaches 0.8 at steps 2 and 3 -> 2.5, s = 0.7071 -> 12.706 * 0.5 = 6.4
    assert "| 2 | 0.900 ± 1.271 | 2.5 ± 6.4 (2/2 reached) | 3.0 ± 0.0 | 100 ± 0 |" in rows["adv_estimator=grpo"]
    assert "| 1 | 0.600 ± n/a | - (0/1 reached) | 6.0 ± n/a | 100 ± n/a |" in rows["adv_estimator=rloo"]
    assert "95% Student-t confidence interval" in table


def test_table_three_seeds_interval(tmp_path):
    for seed, final in enumerate((0.8, 0.9, 1.0)):
        write_run(tmp_path / f"{seed}", ["trainer.seed=" + str(seed)], [0.5, final])
    rows = _rows(summary_table(group_runs(find_runs([tmp_path])), threshold=0.8))
    assert "| 3 | 0.900 ± 0.248 |" in rows["defaults"]


@pytest.mark.parametrize("long_names", [False, True])
def test_legend_is_outside_every_axes_and_inside_the_figure(twins, long_names):
    groups = group_runs(find_runs([twins]))
    if long_names:
        groups = apply_labels(groups, [f"{s}={s} with a name as long as a sentence" for s in groups])
    fig = draw(groups)
    fig.canvas.draw()
    to_figure = fig.transFigure.inverted()
    legend = fig.legends[0].get_window_extent().transformed(to_figure)
    assert 0 <= legend.x0 and legend.x1 <= 1 and 0 <= legend.y0 and legend.y1 <= 1  # not cut off
    for ax in fig.axes:
        assert not legend.overlaps(ax.get_window_extent().transformed(to_figure))


def test_axes_are_labelled_and_accuracy_is_on_a_unit_axis(twins):
    fig = draw(group_runs(find_runs([twins])), title="GRPO vs RLOO")
    score, accuracy = fig.axes
    assert [ax.get_xlabel() for ax in fig.axes] == ["training step", "training step"]
    assert [ax.get_ylabel() for ax in fig.axes] == ["score/mean", "val/accuracy"]
    assert accuracy.get_ylim() == (0, 1)
    assert score.get_ylim() != (0, 1)  # score/mean is not known to lie in [0, 1]: an automatic axis
    assert fig.get_suptitle() == "GRPO vs RLOO"


def test_accuracy_outside_the_unit_interval_keeps_an_automatic_axis(tmp_path):
    write_run(tmp_path / "0", ["trainer.seed=0"], [0.5, 1.5])
    accuracy = draw(group_runs(find_runs([tmp_path]))).axes[1]
    assert accuracy.get_ylim()[1] > 1.5


def test_identical_curves_get_their_own_style_and_keep_their_values(twins):
    lines = _lines(draw(group_runs(find_runs([twins]))), panel=1)
    a, b = lines["adv_estimator=grpo (1 seed)"], lines["adv_estimator=grpo_copy (1 seed)"]
    assert a.get_linestyle() != b.get_linestyle() and a.get_marker() != b.get_marker()
    assert list(a.get_ydata()) == list(b.get_ydata()) == [0.2, 0.6, 0.9]  # no offset: the data stay true


def test_labels_name_settings_and_seeds_are_spelled_out(sweep, tmp_path):
    groups = apply_labels(group_runs(find_runs([sweep])), ["grpo=GRPO (ours)", "adv_estimator=rloo=RLOO"])
    assert list(groups) == ["GRPO (ours)", "RLOO"]
    assert [t.get_text() for t in draw(groups).legends[0].get_texts()] == ["GRPO (ours) (2 seeds)", "RLOO (1 seed)"]
    png, table = compare([sweep], tmp_path / "out", labels=["rloo=RLOO"])
    assert set(_rows(table.read_text())) == {"adv_estimator=grpo", "RLOO"}


def test_a_label_that_names_no_setting_lists_the_settings(sweep):
    groups = group_runs(find_runs([sweep]))
    with pytest.raises(CompareError, match="SETTING one of: adv_estimator=grpo, adv_estimator=rloo"):
        apply_labels(groups, ["ppo=PPO"])
    with pytest.raises(CompareError, match="same name"):
        apply_labels(groups, ["grpo=X", "rloo=X"])


def test_x_samples_is_step_times_rows_per_step(twins):
    fig = draw(group_runs(find_runs([twins])), x="samples")
    line = _lines(fig, panel=1)["adv_estimator=rloo (1 seed)"]
    assert list(line.get_xdata()) == [8, 16, 24]  # steps 1..3 x (4 prompts x 2 responses)
    assert fig.axes[1].get_xlabel() == "training samples (responses)"


def test_x_samples_without_the_sizes_is_refused(sweep, tmp_path, capsys):
    with pytest.raises(CompareError, match="--x samples: the runs log no sample count"):
        compare([sweep], tmp_path / "out", x="samples")
    assert not (tmp_path / "out" / "compare.png").exists()
    assert main(["compare", str(sweep), "--out", str(tmp_path / "cli"), "--x", "samples"]) == 2
    assert "data.train_batch_size" in capsys.readouterr().err


def test_compare_writes_png_and_table_and_cli_prints_it(sweep, tmp_path):
    png, table = compare([sweep], tmp_path / "out")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "hybridflow",
            "compare",
            str(sweep),
            "--out",
            str(tmp_path / "cli"),
            "--label",
            "rloo=RLOO",
            "--title",
            "t",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "| RLOO | 1 |" in out and (tmp_path / "cli" / "compare.png").exists()


def test_nothing_to_compare_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl under"):
        find_runs([tmp_path])

"""``hybridflow compare`` on run directories laid out as Hydra writes them."""

import json
import subprocess
import sys

import pytest

from hybridflow.trainer.compare import compare, find_runs, group_runs, summary_table


def write_run(root, overrides, val, score=0.5, timing=1.0):
    root.mkdir(parents=True)
    (root / ".hydra").mkdir()
    (root / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    lines = []
    for step, acc in enumerate(val, start=1):
        lines.append({"step": step, "score/mean": score, "val/accuracy": acc, "timing_s/gen": timing, "perf/tokens_per_s": 100.0})
    (root / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))


@pytest.fixture
def sweep(tmp_path):
    write_run(tmp_path / "0", ["algorithm.adv_estimator=grpo", "trainer.seed=0"], [0.1, 0.9, 1.0])
    write_run(tmp_path / "1", ["algorithm.adv_estimator=grpo", "trainer.seed=1"], [0.2, 0.5, 0.8])
    write_run(tmp_path / "2", ["algorithm.adv_estimator=rloo", "trainer.seed=0"], [0.0, 0.3, 0.6], timing=2.0)
    return tmp_path


def test_runs_group_by_overrides_without_the_seed(sweep):
    groups = group_runs(find_runs([sweep]))
    assert {k: sorted(r.seed for r in v) for k, v in groups.items()} == {
        "adv_estimator=grpo": ["0", "1"],
        "adv_estimator=rloo": ["0"],
    }


def test_table_numbers(sweep):
    table = summary_table(group_runs(find_runs([sweep])), threshold=0.8)
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[2:]}
    # grpo: final 1.0 and 0.8 -> mean 0.9, sample std 0.141; reaches 0.8 at steps 2 and 3 -> 2.5 ± 0.7
    assert "| 2 | 0.900 ± 0.141 | 2.5 ± 0.7 (2/2 reached) | 3.0 ± 0.0 | 100 ± 0 |" in rows["adv_estimator=grpo"]
    assert "| 1 | 0.600 | - (0/1 reached) | 6.0 | 100 |" in rows["adv_estimator=rloo"]


def test_compare_writes_png_and_table_and_cli_prints_it(sweep, tmp_path):
    png, table = compare([sweep], tmp_path / "out")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    out = subprocess.run([sys.executable, "-m", "hybridflow", "compare", str(sweep), "--out", str(tmp_path / "cli")],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert "adv_estimator=rloo" in out and (tmp_path / "cli" / "compare.png").exists()


def test_nothing_to_compare_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl under"):
        find_runs([tmp_path])

"""``python -m hybridflow.data.preprocess``: public dataset files to the training schema."""

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridflow.data.loading import load_rows
from hybridflow.data.preprocess import GSM8K_INSTRUCTION, MATH_INSTRUCTION, main

GSM8K_RECORDS = [
    {"question": "Natalia sold 48 clips in April and half as many in May. How many in total?",
     "answer": "In May she sold 48/2 = <<48/2=24>>24.\nIn total 48+24 = <<48+24=72>>72.\n#### 72"},
    {"question": "A shop sells 1,200 pens a day for 3 days. How many pens?", "answer": "1,200*3 = 3,600\n#### 3,600"},
]  # fmt: skip
MATH_RECORDS = [
    {"problem": "What is $1/2 + 1/4$?", "solution": "We get $\\frac{2}{4} + \\frac14 = \\boxed{\\frac{3}{4}}$.",
     "level": "Level 1", "type": "Algebra"},
    {"problem": "Solve $x^2 = 4$, $x>0$.", "solution": "So $x = \\boxed{2}$.", "answer": "2",
     "level": "Level 2", "type": "Algebra"},
]  # fmt: skip


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_gsm8k_jsonl(tmp_path):
    source = write_jsonl(tmp_path / "test.jsonl", GSM8K_RECORDS)
    paths = main(["gsm8k", "--input", source, "--output", str(tmp_path / "out")])
    assert list(paths) == ["test"]  # split from the file name
    rows = pq.read_table(paths["test"]).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["72", "3600"]
    assert rows[0]["data_source"] == "openai/gsm8k"
    assert rows[0]["prompt"] == [{"role": "user", "content": GSM8K_RECORDS[0]["question"] + " " + GSM8K_INSTRUCTION}]
    assert rows[1]["extra_info"]["index"] == 1 and rows[1]["extra_info"]["split"] == "test"
    loaded, report = load_rows(paths["test"])  # what it writes, the loader accepts
    assert report.rows == 2


def test_math_parquet_with_split_and_answer_column(tmp_path):
    source = tmp_path / "math.parquet"
    pq.write_table(pa.Table.from_pylist(MATH_RECORDS), source)
    paths = main(["math", "--input", str(source), "--output", str(tmp_path / "out"), "--split", "val"])
    rows = pq.read_table(paths["val"]).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["\\frac{3}{4}", "2"]
    assert rows[0]["data_source"] == "lighteval/MATH"
    assert rows[0]["prompt"][0]["content"].endswith(MATH_INSTRUCTION)
    assert rows[0]["extra_info"] == {"split": "val", "index": 0, "level": "Level 1", "type": "Algebra"}


def test_bad_records_name_file_and_row(tmp_path):
    bad = write_jsonl(tmp_path / "train.jsonl", [GSM8K_RECORDS[0], {"question": "q", "answer": "no marker"}])
    with pytest.raises(ValueError, match=r"train.jsonl, row 1: answer has no '####"):
        main(["gsm8k", "--input", bad, "--output", str(tmp_path / "out")])
    missing = write_jsonl(tmp_path / "m.jsonl", [{"problem": "p", "solution": "no box"}])
    with pytest.raises(ValueError, match=r"m.jsonl, row 0: no 'answer'"):
        main(["math", "--input", missing, "--output", str(tmp_path / "out")])
    (tmp_path / "broken.jsonl").write_text('{"question": "q"}\n{not json\n')
    with pytest.raises(ValueError, match=r"broken.jsonl, line 2"):
        main(["gsm8k", "--input", str(tmp_path / "broken.jsonl"), "--output", str(tmp_path / "out")])


def test_synthetic_subcommand_as_a_module(tmp_path):
    out = tmp_path / "syn"
    result = subprocess.run(
        [sys.executable, "-m", "hybridflow.data.preprocess", "synthetic", "--output", str(out),
         "--train-size", "50", "--val-size", "10", "--seed", "3"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    train, report = load_rows(str(out / "train.parquet"))
    val, _ = load_rows(str(out / "val.parquet"))
    assert (len(train), len(val)) == (50, 10)
    assert train[0]["data_source"] == "synthetic/arithmetic"


def test_default_output_is_home_data_outside_the_tree_and_data_gsm8k_reads_it(tmp_path, monkeypatch):
    """Without ``--output`` GSM8K goes to ``~/data/gsm8k`` (veRL's place), whatever the working directory (the
    repository root is the package: ``data/gsm8k`` there is inside it); ``data=gsm8k`` reads the same files."""
    from hydra import compose, initialize_config_dir

    from hybridflow.configs import CONFIG_DIR
    from hybridflow.configs.schema import register_configs

    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    source = write_jsonl(tmp_path / "test.jsonl", GSM8K_RECORDS)
    paths = main(["gsm8k", "--input", source])
    assert paths == {"test": str(home / "data" / "gsm8k" / "test.parquet")}
    assert list(work.iterdir()) == []
    register_configs()
    with initialize_config_dir(CONFIG_DIR, version_base=None):
        cfg = compose("ppo_trainer", overrides=["data=gsm8k"])
    assert list(cfg.data.val_files) == [paths["test"]]
    assert list(cfg.data.train_files) == [str(home / "data" / "gsm8k" / "train.parquet")]

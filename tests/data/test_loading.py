"""Loading training parquet files: every schema problem is an error naming the file (and row)."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridflow.core.keys import DATA_SOURCE, EXTRA_INFO, GROUND_TRUTH, RAW_PROMPT
from hybridflow.data.loading import DatasetError, load_rows, to_data_proto


def row(i, content="What is 2+2?", source="openai/gsm8k"):
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": content}],
        "reward_model": {"style": "rule", "ground_truth": str(i)},
        "extra_info": {"split": "train", "index": i},
    }


def write(path, rows, schema=None):
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return str(path)


class CharTokenizer:
    """One token per character; no chat template."""

    chat_template = None

    def encode(self, text, add_special_tokens=False):
        return list(range(len(text)))


def test_valid_file_into_a_data_proto(tmp_path):
    path = write(tmp_path / "a.parquet", [row(0), row(1, source="lighteval/MATH")])
    rows, report = load_rows(path)
    assert report.rows == 2 and report.dropped_overlong == {}
    data = to_data_proto(rows)
    assert list(data.non_tensor_batch[DATA_SOURCE]) == ["openai/gsm8k", "lighteval/MATH"]
    assert list(data.non_tensor_batch[GROUND_TRUTH]) == ["0", "1"]
    assert data.non_tensor_batch[EXTRA_INFO][1] == {"split": "train", "index": 1}
    assert data.non_tensor_batch[RAW_PROMPT][0] == [{"role": "user", "content": "What is 2+2?"}]


def test_plain_text_prompts_are_accepted(tmp_path):
    rows = [{"data_source": "d", "prompt": "2+2=", "reward_model": {"ground_truth": "4"}}]
    loaded, _ = load_rows(write(tmp_path / "t.parquet", rows))
    assert loaded[0]["prompt"] == "2+2="


def test_missing_file_and_empty_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        load_rows(str(tmp_path / "nope.parquet"))
    schema = pa.Table.from_pylist([row(0)]).schema
    empty = write(tmp_path / "empty.parquet", [], schema=schema)
    with pytest.raises(DatasetError, match=r"empty.parquet: the file has no rows"):
        load_rows(empty)
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(DatasetError, match="junk.parquet: not a readable parquet"):
        load_rows(str(tmp_path / "junk.parquet"))


def test_zero_bytes_and_a_directory_are_named_as_such(tmp_path):
    (tmp_path / "zero.parquet").write_bytes(b"")
    with pytest.raises(DatasetError, match=r"zero.parquet: the file is empty \(0 bytes\), not a parquet file"):
        load_rows(str(tmp_path / "zero.parquet"))
    (tmp_path / "dir.parquet").mkdir()
    with pytest.raises(FileNotFoundError, match=r"dir.parquet: a directory, not a file"):
        load_rows(str(tmp_path / "dir.parquet"))
    with pytest.raises(FileNotFoundError, match=r"nope.parquet: no such file"):
        load_rows(str(tmp_path / "nope.parquet"))


def test_missing_column(tmp_path):
    rows = [{k: v for k, v in row(0).items() if k != "reward_model"}]
    with pytest.raises(DatasetError, match=r"m.parquet: missing column\(s\) \['reward_model'\]"):
        load_rows(write(tmp_path / "m.parquet", rows))
    rows = [{k: v for k, v in row(0).items() if k != "prompt"}]
    with pytest.raises(
        DatasetError,
        match=r"p.parquet: missing column\(s\) \['prompt'\] \(required: data_source, "
        r"prompt, reward_model\); it has \['data_source', 'reward_model', 'extra_info'\]",
    ):
        load_rows(write(tmp_path / "p.parquet", rows))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"data_source": 3}, "data_source must be text"),
        ({"prompt": [1, 2]}, "prompt must be text or a list"),
        ({"reward_model": {"ground_truth": 4}}, "reward_model must be a struct with a text ground_truth"),
        ({"reward_model": "4"}, "reward_model must be a struct"),
        ({"extra_info": 5}, "extra_info must be a struct or a map"),
    ],
)
def test_wrong_types(tmp_path, change, message):
    path = write(tmp_path / "w.parquet", [{**row(0), **change}])
    with pytest.raises(DatasetError, match=f"w.parquet: .*{message}"):
        load_rows(path)


def test_null_values_name_the_row(tmp_path):
    bad = row(2)
    bad["reward_model"] = {"style": "rule", "ground_truth": None}
    path = write(tmp_path / "n.parquet", [row(0), row(1), bad])
    with pytest.raises(DatasetError, match=r"n.parquet, row 2: reward_model.ground_truth is null"):
        load_rows(path)


def test_overlong_prompts_error_or_filter(tmp_path):
    rows = [row(0, "x" * 5), row(1, "x" * 11), row(2, "x" * 10), row(3, "x" * 30)]
    path = write(tmp_path / "long.parquet", rows)
    with pytest.raises(DatasetError, match=r"long.parquet, row 1: prompt has 11 tokens > max_prompt_length 10"):
        load_rows(path, tokenizer=CharTokenizer(), max_prompt_length=10)
    kept, report = load_rows([path, path], tokenizer=CharTokenizer(), max_prompt_length=10, filter_overlong=True)
    assert [r["reward_model"]["ground_truth"] for r in kept] == ["0", "2", "0", "2"]
    assert report.rows == 4 and report.dropped_overlong == {path: 4}  # counted per file path

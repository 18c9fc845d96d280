import pytest

from hybridflow.trainer.checkpoint import (
    LATEST_FILE,
    latest_checkpoint,
    list_checkpoints,
    publish,
    staging_dir,
    step_of,
)


def save(root, step, keep=2):
    staged = staging_dir(root, step)
    staged.mkdir(parents=True)
    (staged / "model.pt").write_text(f"weights at {step}")
    return publish(root, step, keep)


def test_publish_keeps_the_newest_and_records_latest(tmp_path):
    for step in (2, 4, 6):
        save(tmp_path, step)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4, 6]
    assert (tmp_path / LATEST_FILE).read_text() == "6"
    assert (latest_checkpoint(tmp_path) / "model.pt").read_text() == "weights at 6"


def test_a_crash_mid_save_leaves_the_previous_checkpoint_latest(tmp_path):
    save(tmp_path, 2)
    staged = staging_dir(tmp_path, 4)  # the process dies while writing step 4
    staged.mkdir()
    (staged / "model.pt").write_text("half")
    assert step_of(latest_checkpoint(tmp_path)) == 2
    save(tmp_path, 6)  # the next save clears the stale staging dir
    assert not staged.exists()
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 6]


def test_keep_zero_keeps_all(tmp_path):
    for step in (1, 2, 3):
        save(tmp_path, step, keep=0)
    assert len(list_checkpoints(tmp_path)) == 3


def test_no_checkpoints_and_bad_path(tmp_path):
    assert latest_checkpoint(tmp_path / "missing") is None
    with pytest.raises(ValueError, match="not a checkpoint directory"):
        step_of(tmp_path)

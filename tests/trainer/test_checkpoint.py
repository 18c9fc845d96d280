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


def save_in_store(root, step, keep=2):
    """A save as the trainer makes it in an object store: the parts in place, the driver's state last."""
    from hybridflow.core.storage import child, write_text
    from hybridflow.trainer.checkpoint import DRIVER_STATE, prepare_staging

    staged = prepare_staging(root, step)
    write_text(child(staged, "model.pt"), f"weights at {step}")
    write_text(child(staged, DRIVER_STATE), "{}")
    return publish(root, step, keep)


def test_in_an_object_store_a_checkpoint_counts_once_its_driver_state_is_in(request):
    """fsspec's in-memory filesystem stands for a store by URL: no rename, so checkpoints are written in place."""
    from hybridflow.core.storage import child, filesystem, read_text, write_text

    root = f"memory://{request.node.name}/checkpoints"
    for step in (2, 4):
        assert save_in_store(root, step) == f"{root}/global_step_{step}"
    half = child(root, "global_step_6")  # a save interrupted before the driver's state
    write_text(child(half, "model.pt"), "half")
    assert [s for s, _ in list_checkpoints(root)] == [2, 4]
    assert read_text(child(root, LATEST_FILE)) == "4" and step_of(latest_checkpoint(root)) == 4
    save_in_store(root, 8)  # the next save removes the partial one and prunes to the newest two
    fs, path = filesystem(root)
    names = sorted(p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False))
    assert names == ["global_step_4", "global_step_8", LATEST_FILE]
    assert read_text(child(latest_checkpoint(root), "model.pt")) == "weights at 8"

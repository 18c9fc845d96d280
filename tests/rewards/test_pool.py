"""The scoring pool: order, hard timeouts, errors, dead workers, start failures, cleanup."""

import math
import operator
import os
import tempfile
import time

import pytest

from hybridflow.rewards.pool import ScoringPool, WorkerStartError, remove_stale_worker_folders

pytestmark = pytest.mark.timeout(60)


def test_results_in_order_with_timeouts_and_errors():
    with ScoringPool(num_workers=2, timeout_s=1.0) as pool:
        pool.run(math.sqrt, [(1.0,)])  # workers up
        start = time.monotonic()
        outcomes = pool.run(operator.truediv, [(1, 2), (1, 0), (9, 3)]) + pool.run(
            time.sleep, [(0.01,), (30,), (0.01,), (0.01,)]
        )
        elapsed = time.monotonic() - start
    assert [o.status for o in outcomes] == ["ok", "error", "ok", "ok", "timeout", "ok", "ok"]
    assert [o.value for o in outcomes[:3]] == [0.5, None, 3.0]
    assert outcomes[1].error.startswith("ZeroDivisionError")
    assert 1.0 <= outcomes[4].seconds < 2.0
    assert elapsed < 10.0
    assert pool.restarts == 1


def test_a_dead_worker_is_an_error_and_is_replaced():
    with ScoringPool(num_workers=1, timeout_s=20) as pool:
        outcomes = pool.run(os._exit, [(3,)]) + pool.run(math.sqrt, [(16.0,)])
    assert outcomes[0].status == "error" and "exit code 3" in outcomes[0].error
    assert outcomes[1].value == 4.0


def test_bad_preload_fails_loudly():
    with pytest.raises(WorkerStartError, match="no_such_module_xyz"):
        with ScoringPool(num_workers=1, preload=["no_such_module_xyz"]) as pool:
            pool.run(math.sqrt, [(1.0,)])


def test_arguments_are_checked():
    with pytest.raises(ValueError):
        ScoringPool(num_workers=0)
    with pytest.raises(ValueError):
        ScoringPool(timeout_s=0)


def test_stale_worker_folders_are_swept(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = tmp_path / "hybridflow-reward-worker-999999999-abc"  # no such process
    mine = tmp_path / f"hybridflow-reward-worker-{os.getpid()}-def"
    other = tmp_path / "unrelated-999999999"
    for folder in (dead, mine, other):
        folder.mkdir()
    remove_stale_worker_folders()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, other.name])


def test_an_unpicklable_task_is_an_error_not_a_crash():
    with ScoringPool(num_workers=1, timeout_s=20) as pool:
        outcomes = pool.run(operator.add, [(1, 2), (lambda: 0, 1), (3, 4)])
    assert [o.status for o in outcomes] == ["ok", "error", "ok"]
    assert [outcomes[0].value, outcomes[2].value] == [3, 7]
    assert "cannot send the task" in outcomes[1].error


def test_a_worker_that_died_while_idle_is_replaced_without_losing_a_task():
    with ScoringPool(num_workers=1, timeout_s=20) as pool:
        pool.run(math.sqrt, [(1.0,)])
        os.kill(pool._workers[0].proc.pid, 9)
        time.sleep(0.2)
        outcomes = pool.run(math.sqrt, [(25.0,)])
    assert outcomes[0].status == "ok" and outcomes[0].value == 5.0

"""A rollout engine from a package of its own: installed with pip, it passes the kit's contract in its own tests
and trains a GRPO job by its name (``examples/rollout-engine-plugin``, the built-in engine counting its loads).

The package is copied to a temporary directory and installed in editable mode, without the network, into a
virtualenv of the test's own that borrows the suite's packages (hybridflow included), so the suite's venv is not
touched and the test need not run alone. Its own tests run there, and ``hybridflow-train
actor_rollout_ref.rollout.name=traced_builtin`` trains 3 steps: the engine's load metrics in ``metrics.jsonl`` show
that every step's weights went through it.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import borrowed_venv

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rollout-engine-plugin"
DISTRIBUTION = "hybridflow-traced-engine"


@pytest.fixture
def engine_python(tmp_path):
    """The python of a venv where the example engine is installed (editable, from a copy)."""
    python, _ = borrowed_venv(tmp_path / "venv", with_hybridflow=True)
    source = tmp_path / EXAMPLE.name
    shutil.copytree(EXAMPLE, source)
    flags = ["--quiet", "--no-deps", "--no-build-isolation", "--no-index", "-e", str(source)]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", *flags], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return python, source


def run(python, *args, cwd=None, timeout=240):
    env = {k: v for k, v in os.environ.items() if k not in ("HYBRIDFLOW_DISABLE_PLUGIN_AUTOLOAD", "RAY_ADDRESS")}
    return subprocess.run([str(python), *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def test_an_installed_engine_keeps_the_contract_and_trains_grpo_by_name(engine_python, tmp_path):
    python, source = engine_python
    own = run(python, "-m", "pytest", "-v", "-p", "no:cacheprovider", cwd=source)
    assert own.returncode == 0, own.stdout + own.stderr
    assert "test_the_engine_keeps_the_rollout_engine_contract PASSED" in own.stdout, own.stdout

    listing = run(python, "-m", "hybridflow", "plugins").stdout
    assert "traced_builtin" in listing and DISTRIBUTION in listing, listing
    assert DISTRIBUTION not in run(sys.executable, "-m", "hybridflow", "plugins").stdout  # the suite's venv: untouched

    run_dir = tmp_path / "run"
    trained = run(
        python, "-m", "hybridflow.trainer.main", "actor_rollout_ref.rollout.name=traced_builtin",
        "algorithm.adv_estimator=grpo", "trainer.total_training_steps=3", "trainer.test_freq=0",
        "trainer.n_gpus_per_node=1", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.rollout.n=4",
        f"hydra.run.dir={run_dir}", f"data.synthetic_dir={tmp_path}/data",
        cwd=tmp_path,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "actor/pg_loss" in m]
    # one load at start, then one after each update: the engine held every version the steps trained
    assert [m["rollout/traced_loads"] for m in steps] == [2.0, 3.0, 4.0], steps
    assert [m["rollout/traced_calls"] for m in steps] == [1.0, 2.0, 3.0]  # one generation per step (no validation)
    assert all(m["reshard/seconds"] > 0 for m in steps)  # the built-in engine inside did the loading

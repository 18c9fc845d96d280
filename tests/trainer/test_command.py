"""``hybridflow-train`` as a user runs it, in a subprocess: Ctrl-C, a redirected log, another Ray cluster."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TRAIN = [sys.executable, "-m", "hybridflow.trainer.main"]
SMALL = [
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.rollout.n=4",
    "trainer.test_freq=0",
    "trainer.n_gpus_per_node=1",  # one rank: each costs the suite a process start
]


def clean_env():
    return {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "WANDB_API_KEY", "WANDB_MODE")}


def interruptible():
    """Run the child with Ctrl-C's default action: a shell starts background jobs (``make test &``, CI runners)
    with SIGINT ignored, the child would inherit that, and Python then installs no KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for_steps(metrics: Path, steps: int, proc: subprocess.Popen, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= steps:
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early with {proc.returncode}")
        time.sleep(0.5)
    raise AssertionError(f"no {steps} steps in {timeout_s} s")


def test_ctrl_c_stops_with_the_step_and_the_checkpoint_and_a_log_gets_plain_progress_lines(tmp_path):
    run = tmp_path / "run"
    log = (tmp_path / "log.txt").open("w")
    args = [
        *SMALL,
        "trainer.total_training_steps=500",
        "trainer.save_freq=2",
        f"hydra.run.dir={run}",
        f"data.synthetic_dir={tmp_path}/data",
    ]
    proc = subprocess.Popen(
        [*TRAIN, *args], cwd=tmp_path, env=clean_env(), stdout=log, stderr=subprocess.STDOUT, preexec_fn=interruptible
    )
    try:
        wait_for_steps(run / "metrics.jsonl", 3, proc)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = (tmp_path / "log.txt").read_text()
    assert code == 130, text[-3000:]
    assert "interrupted at step " in text and "last checkpoint: " in text and "global_step_" in text, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    # redirected: no progress bar redraws (plain lines come every 50th of 500 steps: none yet)
    assert "\r" not in text and "it/s" not in text and "step/s" not in text
    assert text.count("training: step ") == 0


@pytest.mark.skipif(
    shutil.which("ray") is None and not (Path(sys.executable).parent / "ray").exists(), reason="needs the ray command"
)
def test_a_run_without_an_address_starts_its_own_ray_beside_another_cluster(tmp_path):
    """Another user's ``ray start --head`` on the machine: the run must not join it."""
    ray_cmd = str(Path(sys.executable).parent / "ray")
    port = 26379 + os.getpid() % 1000  # above the worker port range (10002-19999)
    env = clean_env()  # as another user would start it: Ray's defaults
    head = subprocess.run(
        [
            ray_cmd,
            "start",
            "--head",
            f"--port={port}",
            "--num-cpus=1",
            "--include-dashboard=false",
            "--disable-usage-stats",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert head.returncode == 0, head.stderr[-2000:]
    try:
        out = subprocess.run(
            [
                *TRAIN,
                *SMALL,
                "trainer.total_training_steps=1",
                f"hydra.run.dir={tmp_path}/run",
                f"data.synthetic_dir={tmp_path}/data",
            ],
            cwd=tmp_path,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        _stop_cluster(port)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "train score (last step)" in out.stdout
    assert f":{port}" not in out.stdout + out.stderr  # it never talked to the other cluster


def _stop_cluster(port: int) -> None:
    """Kill the processes of the cluster on ``port`` only (``ray stop`` would stop every cluster here)."""
    marks = (f":{port}", f"--port={port}", f"--gcs_server_port={port}")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if any(m in cmdline for m in marks) and int(pid) != os.getpid():
                os.kill(int(pid), signal.SIGKILL)
        except (OSError, ValueError):
            pass

"""A ``rollout.mode=server`` run, as a user starts it: its log holds no line per HTTP request unless asked.

Every agent turn is a request to the policy server; aiohttp logged each one at INFO, and a 4-step run's log
was 2,081 such lines in 2,108. With ``rollout.name=vllm`` the server is ``vllm serve``, whose uvicorn wrote
the same lines to ``vllm_server.log`` (checked in ``tests/trainer/test_vllm_e2e.py``'s server run).
``rollout.server.access_log`` turns them back on: the server's own test counts them (``test_server.py``), and
the command line it gives ``vllm serve`` is checked here.
"""

import os
import re
import subprocess
import sys

import pytest
from omegaconf import OmegaConf
from support import read_metrics

from hybridflow.configs.schema import PPOConfig

pytestmark = pytest.mark.slow

TRAIN = [
    sys.executable,
    "-m",
    "hybridflow.trainer.main",
    "experiment=tool_use",
    "actor_rollout_ref.rollout.mode=server",
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.rollout.n=4",
    "trainer.test_freq=0",
    "trainer.n_gpus_per_node=1",  # one rank: each costs the suite a process start
]
ACCESS_LINE = re.compile(r'"POST /v1/(?:chat/)?completions HTTP/1\.1" 200')


def run_logs(tmp_path, *overrides):
    """stdout and stderr of one run, then every log file of its run directory."""
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "WANDB_API_KEY", "WANDB_MODE")}
    out = subprocess.run(
        [*TRAIN, *overrides, f"hydra.run.dir={run}", f"data.synthetic_dir={tmp_path}/data"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    logs = sorted(run.glob("**/*.log"))
    assert run / "main.log" in logs, logs
    return text + "".join(path.read_text() for path in logs), read_metrics(run)


def test_a_server_mode_run_logs_no_request_lines_by_default(tmp_path):
    text, steps = run_logs(tmp_path, "trainer.total_training_steps=2")
    assert len(steps) == 2 and "policy server: http://" in text  # two steps, the loops the server's clients
    assert not ACCESS_LINE.search(text) and "aiohttp.access" not in text, ACCESS_LINE.findall(text)[:3]


@pytest.mark.parametrize("access_log", [False, True])
def test_vllm_serve_gets_disable_uvicorn_access_log_unless_access_log(tmp_path, access_log):
    pytest.importorskip("vllm")
    from hybridflow.workers.rollout.vllm_server import VLLMServer

    cfg = OmegaConf.structured(PPOConfig)
    for key, value in {
        "actor_rollout_ref.rollout.name": "vllm",
        "actor_rollout_ref.rollout.mode": "server",
        "actor_rollout_ref.model.path": "builtin:tiny-qwen2-h32",
        "trainer.device": "cpu",
        "actor_rollout_ref.rollout.server.access_log": access_log,
    }.items():
        OmegaConf.update(cfg, key, value)
    config = OmegaConf.to_object(cfg)
    command = VLLMServer(config, tmp_path / "vllm_server.log").command("127.0.0.1", 8000)
    assert ("--disable-uvicorn-access-log" in command) is not access_log

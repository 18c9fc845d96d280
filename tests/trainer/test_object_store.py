"""Checkpoints in an S3-compatible object store: ``trainer.default_local_dir=s3://bucket/...``.

The store is a real S3 API over HTTP: moto's server on a loopback port, reached by s3fs as any S3 endpoint is
(``FSSPEC_S3_ENDPOINT_URL`` and the AWS credential variables), not a mock of the client. The run and its ranks live
in a process of their own, whose local Ray instance the endpoint's environment reaches (on a cluster it is set on
every node before ``ray start``: docs/cluster.md).
"""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file
from support import read_metrics

pytestmark = pytest.mark.slow

RUNS = """
import json, pathlib, sys
from moto.server import ThreadedMotoServer
host, port = {endpoint!r}.rsplit(":", 1)
server = ThreadedMotoServer(ip_address=host, port=int(port), verbose=False)
server.start()
import s3fs
sys.path.insert(0, {tests!r})
from support import small_config
from hybridflow.trainer.main import build_and_fit

tmp = pathlib.Path({tmp!r})
store = s3fs.S3FileSystem()
store.mkdir("checkpoints")
common = {{"trainer.save_hf_on_end": True, "trainer.logger": ["jsonl"]}}
in_store = {{**common, "trainer.default_local_dir": "s3://checkpoints/run", "trainer.save_freq": 1}}
build_and_fit(small_config(tmp, **common, **{{"trainer.total_training_steps": 4}}), tmp / "straight")
build_and_fit(small_config(tmp, **in_store, **{{"trainer.total_training_steps": 2}}), tmp / "stored")
after_two = sorted(p.rsplit("/", 1)[-1] for p in store.ls("checkpoints/run"))
resumed = build_and_fit(small_config(tmp, **in_store, **{{"trainer.total_training_steps": 4}}), tmp / "stored")
print("RESULT", json.dumps({{"after_two": after_two, "resumed_at": resumed.resumed_at, "steps": resumed.steps,
    "latest": store.cat_file("checkpoints/run/latest_checkpointed_iteration.txt").decode(),
    "actor": sorted(p.rsplit("/", 1)[-1] for p in store.ls("checkpoints/run/global_step_4/actor"))}}))
server.stop()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_run_resumed_from_an_s3_checkpoint_ends_as_the_uninterrupted_run(tmp_path):
    endpoint = f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "WANDB_API_KEY", "WANDB_MODE")}
    env.update(
        AWS_ACCESS_KEY_ID="hybridflow-test",
        AWS_SECRET_ACCESS_KEY="hybridflow-test",
        AWS_DEFAULT_REGION="us-east-1",
        FSSPEC_S3_ENDPOINT_URL=f"http://{endpoint}",
    )
    script = RUNS.format(endpoint=endpoint, tests=str(Path(__file__).parents[1]), tmp=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    result = json.loads(out.stdout.split("RESULT", 1)[1].splitlines()[0])
    assert result["after_two"] == ["global_step_1", "global_step_2", "latest_checkpointed_iteration.txt"]
    assert result["resumed_at"] == 2 and result["steps"] == 4 and result["latest"] == "4"
    assert "extra_rank0.pt" in result["actor"] and "huggingface" in result["actor"]  # every part, in the store
    assert not (tmp_path / "stored" / "checkpoints").exists()  # nothing of it on the local disk
    assert [m["step"] for m in read_metrics(tmp_path / "stored")] == [1, 2, 3, 4]
    straight = load_file(tmp_path / "straight" / "hf_model" / "model.safetensors")
    resumed = load_file(tmp_path / "stored" / "hf_model" / "model.safetensors")
    assert straight.keys() == resumed.keys()
    assert all(straight[name].equal(resumed[name]) for name in straight), "the resumed weights differ"

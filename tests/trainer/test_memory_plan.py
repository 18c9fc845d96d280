"""The memory plan (``trainer/memory_plan.py``): the model's shape read on the meta device, each part of a stage
against a hand computation, and a run that will not fit refused before Ray starts (issue 50)."""

import json
import os
import subprocess
import sys
import time

import pytest
from omegaconf import OmegaConf

from hybridflow.configs.schema import PPOConfig
from hybridflow.trainer.memory_plan import CPU_RUNTIME_GB, CUDA_CONTEXT_GB, GIB, ModelShape, plan_memory
from hybridflow.workers.models import load_model_and_tokenizer, load_model_config

HYBRIDFLOW = [str(os.path.join(os.path.dirname(sys.executable), "hybridflow"))]
TRAIN = [sys.executable, "-m", "hybridflow.trainer.main"]


def config(**overrides):
    cfg = OmegaConf.structured(PPOConfig)
    for key, value in {"trainer.device": "cpu", "trainer.memory_limit_gb": 10.0, **overrides}.items():
        OmegaConf.update(cfg, key, value)
    return OmegaConf.to_object(cfg)


def test_the_shape_on_the_meta_device_is_the_built_model_s():
    model, _ = load_model_and_tokenizer("builtin:tiny-qwen2")
    shape = ModelShape.of(load_model_config("builtin:tiny-qwen2"))
    assert shape.params == sum(p.numel() for p in model.parameters())
    assert (shape.hidden, shape.layers, shape.heads, shape.kv_heads, shape.head_dim) == (64, 2, 4, 2, 16)
    assert shape.layer_params == sum(p.numel() for p in model.model.layers[0].parameters())


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"]])
def test_lora_parameters_are_what_peft_trains(targets):
    from peft import LoraConfig, get_peft_model

    model, _ = load_model_and_tokenizer("builtin:tiny-qwen2")
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    trained = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    shape = ModelShape.of(load_model_config("builtin:tiny-qwen2"))
    assert shape.lora_params(4, targets) == trained
    adapted = sum(m.base_layer.weight.numel() for m in peft_model.modules() if hasattr(m, "lora_A"))
    assert shape.adapted_params(targets) == adapted  # what the merged view copies


def test_each_part_of_the_default_job_by_hand():
    """The default job on 2 CPU ranks: tiny-qwen2 (hidden 64, 2 layers, 2 KV heads of 16, MLP 256, 32 tokens),
    fp32, 16 prompts x 8 samples, prompts up to 32 tokens, responses up to 8; no old-log-prob pass (fp32 built-in
    engine), no reference, no critic."""
    shape = ModelShape.of(load_model_config("builtin:tiny-qwen2"))
    p = shape.params
    plan = plan_memory(config())
    assert set(plan.stages) == {"gen", "update"}
    gen, update = plan.stages["gen"].parts, plan.stages["update"].parts
    assert gen["runtime"] == CPU_RUNTIME_GB * GIB
    assert gen["actor weights"] == p * 4 / 2  # fp32, sharded over 2 ranks
    assert gen["actor optimizer"] == 2 * p * 4 / 2  # AdamW's two moments
    assert gen["rollout weights"] == p * 4  # the colocated engine's whole copy (rollout tp 1)
    rows, seq = 16 * 8 // 2, 32 + 8  # a rank's rows, prompt + response positions
    assert gen["KV cache"] == rows * seq * 2 * 2 * 2 * 16 * 4  # layers x (k, v) x KV heads x head dim x fp32
    mini_rows = 8 * 8 // 2  # ppo_mini_batch_size x n over the 2 ranks: 32 rows, in micro-batches of 16
    # two micro-batches to a step: their fp32 sum is kept whole on each rank until the second's backward
    # reduce-scatters it layer by layer; one of the 2 layers' gradients in flight beside it
    assert update["actor gradients"] == p * 4 * (1 + 1 / 2)
    tokens, response = 16 * seq, 16 * 8
    saved = tokens * 2 * (11 * 64 + 4 * 256) * 4  # every layer's saved activations, fp32
    assert mini_rows == 32
    assert update["activations"] == saved + 2 * tokens * 64 * 4 + 3 * response * 32 * 4
    assert plan.fits and plan.limit_gb == 10.0


def test_offload_keeps_state_off_a_gpu_outside_its_stages_and_changes_nothing_on_a_cpu():
    offload = {
        "actor_rollout_ref.actor.fsdp_config.param_offload": True,
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload": True,
    }
    gpu = plan_memory(config(**{"trainer.device": "cuda", **offload}))
    assert gpu.stages["gen"].parts["actor weights"] == 0 and gpu.stages["gen"].parts["actor optimizer"] == 0
    assert gpu.stages["update"].parts["actor weights"] > 0 and gpu.stages["update"].parts["actor optimizer"] > 0
    assert gpu.stages["gen"].parts["runtime"] == CUDA_CONTEXT_GB * GIB
    cpu, plain = plan_memory(config(**offload)), plan_memory(config())
    # host memory is the device: a stage's state is back, its host copy freed, before its activations exist
    assert {s: p.peak_gb for s, p in cpu.stages.items()} == {s: p.peak_gb for s, p in plain.stages.items()}


def test_checkpointing_keeps_each_layer_s_input_and_one_layer():
    plain = plan_memory(config()).stages["update"].parts["activations"]
    kept = plan_memory(config(**{"actor_rollout_ref.model.enable_gradient_checkpointing": True}))
    tokens = 16 * 40
    per_layer = tokens * (11 * 64 + 4 * 256) * 4
    assert plain - kept.stages["update"].parts["activations"] == per_layer - tokens * 64 * 4 * 2


def test_split_placement_generates_on_the_rollout_rank_only():
    plan = plan_memory(config(**{"trainer.placement": "split", "trainer.n_gpus_per_node": 1}))
    assert plan.stages["gen"].ranks == "rollout"
    assert "rollout weights" not in plan.stages["update"].parts  # the training rank holds no rollout copy
    params = ModelShape.of(load_model_config("builtin:tiny-qwen2")).params
    assert plan.stages["update"].parts["actor weights"] == params * 4  # one training rank: the whole model


def test_plan_prints_a_7b_shaped_gpu_job_as_json_within_15_s():
    start = time.monotonic()
    out = subprocess.run(
        [
            *HYBRIDFLOW,
            "plan",
            "--json",
            "actor_rollout_ref.model.path=builtin:qwen2.5-7b-shape",
            "trainer.device=cuda",
            "trainer.n_gpus_per_node=8",
            "trainer.memory_limit_gb=80",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - start < 15
    plan = json.loads(out.stdout)
    assert set(plan) == {"stages", "limit_gb", "fits", "device"} and plan["limit_gb"] == 80
    assert set(plan["stages"]) == {"gen", "update"} and plan["device"] == "cuda"
    weights = plan["stages"]["update"]["parts_gb"]["actor weights"]
    assert weights == pytest.approx(7_615_616_512 * 4 / 8 / GIB, abs=1e-4)  # Qwen2.5-7B's parameters, fp32 / 8
    assert out.returncode == (0 if plan["fits"] else 1)


def test_a_run_that_cannot_fit_is_refused_before_ray_naming_the_stage_and_the_keys(tmp_path):
    """A 7B-shaped policy on this CPU machine: refused in seconds, exit 2, before any Ray instance."""
    start = time.monotonic()
    out = subprocess.run(
        [*TRAIN, "actor_rollout_ref.model.path=builtin:qwen2.5-7b-shape", f"hydra.run.dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
    )
    assert out.returncode == 2, out.stderr[-2000:]
    assert time.monotonic() - start < 20
    assert "memory plan: the run will not fit" in out.stderr and "Traceback" not in out.stderr
    assert "update (training rank) needs" in out.stderr
    assert "actor_rollout_ref.model.lora_rank=16" in out.stderr  # a key that lowers it, with its effect
    assert "Started a local Ray instance" not in out.stdout + out.stderr


def test_an_override_hydra_cannot_apply_is_a_message_and_exit_2():
    out = subprocess.run([*HYBRIDFLOW, "plan", "model=local"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "hybridflow plan: invalid config" in out.stderr and "model@actor_rollout_ref.model" in out.stderr


def test_a_built_in_reward_model_is_planned_as_a_frozen_sharded_model():
    plan = plan_memory(config(**{"reward_model.enable": True, "reward_model.model.path": "builtin:tiny-llama"}))
    params = ModelShape.of(load_model_config("builtin:tiny-llama")).params  # another model than the policy
    assert plan.stages["rm"].parts["reward model weights"] == params * 4 / 2  # fp32, sharded over 2 ranks
    assert "reward model optimizer" not in plan.stages["rm"].parts

"""A practitioner's path: a local HF checkpoint and GSM8K-format data through ``experiment=gsm8k_grpo`` on CPU.

The checkpoint is a small Qwen2 with random weights and a BPE tokenizer with a chat template, written with
``save_pretrained`` (tests/support.py); the data is GSM8K-shaped parquet. The documented command, with the
paths, a step limit and shorter responses, runs three steps; without the model path it stops before Ray.
"""

import json
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp
from support import gsm8k_parquet, local_qwen2_checkpoint, mixed_precision_rank
from torch.distributed.checkpoint import FileSystemReader
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridflow.core.worker import free_ports
from hybridflow.tools.export import export_checkpoint

pytestmark = pytest.mark.slow


def command(tmp_path, *extra):
    return [
        sys.executable,
        "-m",
        "hybridflow.trainer.main",
        "experiment=gsm8k_grpo",
        "trainer=cpu",
        "trainer.n_gpus_per_node=1",  # one rank: each costs the suite a process start
        *extra,
        f"data.train_files=[{tmp_path / 'train.parquet'}]",
        f"data.val_files=[{tmp_path / 'val.parquet'}]",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]


def test_gsm8k_experiment_trains_a_local_checkpoint_on_cpu(tmp_path):
    model_dir = local_qwen2_checkpoint(tmp_path / "qwen2-small")
    # the gsm8k verifier scores a random model 0 everywhere (zero advantages, and at the first step a zero KL:
    # no gradient at all); a dense reward, the share of digits in a response, gives the first update one
    dense = tmp_path / "digit_share.py"
    dense.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
        "    return sum(c.isdigit() for c in solution_str) / max(len(solution_str), 1)\n"
    )
    gsm8k_parquet(tmp_path / "train.parquet", rows=64)
    gsm8k_parquet(tmp_path / "val.parquet", rows=8)
    # 2 steps of responses capped at 32 tokens to keep the suite fast (the random model rarely stops early); with
    # the experiment's own 512 the same command ran 3 steps in 293 s on the 2-core machine, under load
    out = subprocess.run(
        command(
            tmp_path,
            f"actor_rollout_ref.model.path={model_dir}",
            "trainer.total_training_steps=2",
            "actor_rollout_ref.rollout.response_length=32",
            "trainer.save_freq=1",
            f"reward.custom_reward_function.path={dense}",
        ),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [m for m in steps if "score/mean" in m]
    assert [m["step"] for m in train] == [1, 2]
    # the chat template was applied: every step trains on all 64 prompts, so the mean prompt length is the
    # mean length of the templated prompts
    import pyarrow.parquet as pq

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = pq.read_table(tmp_path / "train.parquet").column("prompt").to_pylist()
    templated = [
        len(
            tokenizer.encode(
                tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False), add_special_tokens=False
            )
        )
        for p in prompts
    ]
    raw = [len(tokenizer.encode(p[0]["content"], add_special_tokens=False)) for p in prompts]
    assert all(m["prompt_length/mean"] == pytest.approx(sum(templated) / 64) for m in train)
    assert sum(templated) > sum(raw)
    # scored by the gsm8k verifier (routed by data_source openai/gsm8k), without errors, in training and validation
    assert all(m["reward/errors"] == 0 and m["reward/timeouts"] == 0 for m in train)
    assert "val/openai/gsm8k/score" in steps[0] and "val/openai/gsm8k/score" in steps[-1]
    assert train[-1]["response_length/max"] <= 32 and all(m["actor/kl_loss"] >= 0 for m in train)
    # mixed precision by default (model.dtype=bfloat16 computes in bf16 over fp32 master weights): after one
    # step at the recipe's lr (1e-6, warming up from 0: its first update is 1e-7) nearly every weight moved,
    # which bf16 weights could not (half a bf16 step at 0.02 is 6e-5), and the optimizer's state is fp32
    checkpoint = tmp_path / "run" / "checkpoints" / "global_step_1"
    stored = FileSystemReader(str(checkpoint / "actor")).read_metadata().state_dict_metadata
    moments = {
        k: m.properties.dtype
        for k, m in stored.items()
        if k.startswith("optim.state.") and k.endswith(("exp_avg", "exp_avg_sq"))
    }
    weights = {k: m.properties.dtype for k, m in stored.items() if k.startswith("model.")}
    held = next(iter(weights.values()))
    # the start as the run held it (rounded to its weights' dtype), against the weights after one step
    start = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    trained = AutoModelForCausalLM.from_pretrained(
        export_checkpoint(checkpoint, tmp_path / "step1"), dtype=torch.float32
    )
    trained = trained.state_dict()
    moved = sum(int((trained[k] != start[k].to(held).float()).sum()) for k in start)
    assert moved / sum(t.numel() for t in start.values()) >= 0.99
    assert moments and set(moments.values()) == {torch.float32}
    assert weights and set(weights.values()) == {torch.float32}


def test_gsm8k_experiment_computes_in_bf16_over_fp32_master_weights(tmp_path):
    """The experiment's actor, built by the worker's own sharding from its composed config on one gloo rank:
    fp32 parameters (the optimizer's), a bf16 forward."""
    model_dir = local_qwen2_checkpoint(tmp_path / "qwen2-small")
    mp.start_processes(
        mixed_precision_rank, args=(str(model_dir), str(tmp_path), free_ports(1)[0]), nprocs=1, start_method="spawn"
    )
    seen = json.loads((tmp_path / "dtypes.json").read_text())
    assert seen == {"parameters": ["torch.float32"], "logits": "torch.bfloat16", "optimizer_state": ["torch.float32"]}


def test_without_the_model_path_the_command_stops_before_ray_naming_the_key(tmp_path):
    gsm8k_parquet(tmp_path / "train.parquet", rows=4)
    gsm8k_parquet(tmp_path / "val.parquet", rows=4)
    out = subprocess.run(command(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert "actor_rollout_ref.model.path=null: no model given" in text and "Traceback" not in text
    assert "ray" not in text.lower()

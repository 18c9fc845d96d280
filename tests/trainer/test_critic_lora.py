"""LoRA in the critic (``critic.lora_rank``): a GAE run on 2 ranks whose checkpoint shows what trained.

The critic's backbone is the policy's, copied at start; with adapters it stays so bit for bit, while the adapters
and the fresh value head (``score``) train, and only they sit in the critic's optimizer.
"""

import json

import pytest
import torch

from hybridflow.data.synthetic import generate_synthetic
from hybridflow.trainer.checkpoint import list_checkpoints
from hybridflow.trainer.main import build_and_fit
from hybridflow.workers import lora
from hybridflow.workers.checkpointing import read_model_state
from hybridflow.workers.critic.worker import build_value_model
from tests.trainer.test_resume import config

pytestmark = pytest.mark.slow


# computing in bf16, the frozen backbone is held in bf16 (no fp32 master copy), the adapters and the head in fp32
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_critic_lora_trains_its_adapters_and_head_and_leaves_the_backbone(ray_session, tmp_path, dtype):
    files = generate_synthetic(str(tmp_path / "data"), train_size=12, val_size=8, seed=0)
    cfg = config(files, 2, "disable", "gae")
    cfg.critic.lora_rank, cfg.critic.lora_alpha, cfg.critic.optim.lr = 4, 8.0, 1e-2
    cfg.actor_rollout_ref.model.dtype = str(dtype).removeprefix("torch.")
    summary = build_and_fit(cfg, tmp_path / "run")
    assert summary.steps == 2
    ((_, checkpoint),) = list_checkpoints(tmp_path / "run" / "checkpoints")
    state = read_model_state(checkpoint, "critic")
    start = build_value_model(cfg.actor_rollout_ref.model.path, torch.float32, cfg.trainer.seed).state_dict()
    adapters = {k: v for k, v in state.items() if lora.is_adapter_parameter(k)}
    assert len(adapters) == 2 * 7 * 2  # A and B of 7 linear layers in each of 2 decoder layers; none in the head
    for name, tensor in state.items():
        if lora.is_adapter_parameter(name):
            continue
        if name.startswith("score."):
            assert tensor.dtype == torch.float32 and not torch.equal(tensor, start[name]), f"{name} did not train"
        else:
            assert torch.equal(tensor, start[lora.model_name(name)].to(dtype)), f"{name} changed"
    assert all(v.dtype == torch.float32 and v.abs().max() > 0 for k, v in adapters.items() if ".lora_B." in k)
    # AdamW: two fp32 moments per trained element and one fp32 step count per parameter on each of the 2 ranks
    trained = {**adapters, **{k: v for k, v in state.items() if k.startswith("score.")}}
    total = 2 * 4 * sum(v.numel() for v in trained.values()) + 4 * len(trained) * 2
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["critic/optimizer_state_bytes_per_rank"] for m in logged if "critic/vf_loss" in m] == [total / 2] * 2
    backbone = sum(v.numel() for k, v in state.items() if k not in trained and k != "lm_head.weight")
    held = dtype.itemsize * backbone + 4 * sum(v.numel() for v in trained.values())
    assert [m["critic/param_bytes_per_rank"] for m in logged if "critic/vf_loss" in m] == [held / 2] * 2

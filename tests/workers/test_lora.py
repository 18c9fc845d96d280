"""LoRA on the real actor worker group (2 gloo ranks, FSDP2): what trains, what the reference and the rollout see,
and what an export writes.

One update with large advantages and a large learning rate, then: the checkpoint's base weights are the loaded
model's bit for bit and only the adapters moved; the optimizer holds the adapters' state alone; the reference
(adapters off) gives the untrained model's log-probs; the rollout's greedy tokens (merged weights, resharded in
memory) equal those of the trained peft model in this process, and of both exports loaded back with
``from_pretrained`` / ``PeftModel.from_pretrained``.
"""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf
from peft import PeftModel
from transformers import AutoModelForCausalLM

from hybridflow.configs.schema import PPOConfig
from hybridflow.core import ColocatedWorkerGroup, DataProto, ResourcePool, RoleSpec
from hybridflow.core.keys import (
    ADVANTAGES,
    ATTENTION_MASK,
    INPUT_IDS,
    METRICS,
    OLD_LOG_PROBS,
    REF_LOG_PROBS,
    RESPONSE_MASK,
    RESPONSES,
    ROLLOUT_LOG_PROBS,
)
from hybridflow.core.parallel_dims import ParallelDims
from hybridflow.core.rollout_batch import left_pad
from hybridflow.tools.export import export_checkpoint
from hybridflow.trainer.checkpoint import DRIVER_STATE
from hybridflow.trainer.launch import group_options
from hybridflow.workers import lora
from hybridflow.workers.actor.worker import ActorRolloutWorker
from hybridflow.workers.checkpointing import read_model_state
from hybridflow.workers.models import load_model_and_tokenizer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

RANK, ALPHA, STEPS = 4, 8.0, 6
PROMPTS = ["max(1,2)=", "7+8=", "max(3,8,1,5)=", "(12+4)*3="]


def config(**overrides) -> PPOConfig:
    cfg = OmegaConf.structured(PPOConfig)
    for key, value in {
        "data.train_batch_size": 4,
        "actor_rollout_ref.model.lora_rank": RANK,
        "actor_rollout_ref.model.lora_alpha": ALPHA,
        "actor_rollout_ref.actor.optim.lr": 0.01,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 4,
        "actor_rollout_ref.actor.use_kl_loss": True,
        "actor_rollout_ref.rollout.n": 1,
        "actor_rollout_ref.rollout.response_length": STEPS,
        "trainer.n_gpus_per_node": 2,
        **overrides,
    }.items():
        OmegaConf.update(cfg, key, value)
    return OmegaConf.to_object(cfg)


def greedy(model, prompts: DataProto, pad: int) -> list[list[int]]:
    """HF ``generate``'s greedy tokens for each left-padded prompt, cut at EOS (as the rollout's response mask)."""
    ids = prompts.batch[INPUT_IDS]
    out = model.generate(
        ids,
        attention_mask=prompts.batch[ATTENTION_MASK],
        do_sample=False,
        max_new_tokens=STEPS,
        pad_token_id=pad,
        eos_token_id=model.generation_config.eos_token_id,
    )
    rows = []
    for row in out[:, ids.shape[1] :].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t == model.generation_config.eos_token_id), len(row))
        rows.append(row[:cut])
    return rows


def columns(out: DataProto) -> DataProto:
    """A worker's answer without the metrics it reports in ``meta_info``."""
    out.meta_info.pop(METRICS, None)
    return out


def rollout_tokens(out: DataProto) -> list[list[int]]:
    return [r[: int(m.sum())].tolist() for r, m in zip(out.batch[RESPONSES], out.batch[RESPONSE_MASK])]


@pytest.fixture(scope="module")
def trained(ray_session, tmp_path_factory):
    """The group after one update: what it reported, and a checkpoint of it."""
    cfg = config()
    dims = ParallelDims.from_config(cfg, use_critic=False)
    base, tokenizer = load_model_and_tokenizer(cfg.actor_rollout_ref.model.path, seed=cfg.trainer.seed)
    ids, mask, _ = left_pad(
        [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS], tokenizer.pad_token_id
    )
    prompts = DataProto.from_dict({INPUT_IDS: ids, ATTENTION_MASK: mask}, meta_info={"n": 1, "greedy": True, "seed": 0})
    checkpoint = tmp_path_factory.mktemp("lora") / "global_step_1"
    kwargs = {"config": cfg, "dims": dims, "loss_agg_mode": "token-mean"}
    roles = {"actor": RoleSpec(ActorRolloutWorker, kwargs=kwargs)}
    pool = ResourcePool([2])
    try:
        with ColocatedWorkerGroup(pool, roles, group_options(cfg)) as group:
            actor = group["actor"]
            actor.init_model()
            batch = actor.generate_sequences(prompts)
            before = rollout_tokens(batch)
            batch.meta_info.pop(METRICS, None)  # the driver takes them out of each answer
            batch.union(columns(actor.compute_log_prob(batch)))
            batch.union(columns(actor.compute_ref_log_prob(batch)))
            untrained = batch.batch[OLD_LOG_PROBS].clone()
            sign = torch.tensor([1.0, -1.0, 1.0, -1.0])[:, None]  # push two rows up, two down
            batch.batch[ADVANTAGES] = 5.0 * sign * batch.batch[RESPONSE_MASK].float()
            batch.meta_info["global_step"] = 1
            metrics = actor.update_actor(batch)
            after = columns(actor.generate_sequences(prompts))
            after_train = actor.compute_log_prob(after).batch[OLD_LOG_PROBS]  # the training layout's, adapters on
            ref_after = actor.compute_ref_log_prob(batch).batch[REF_LOG_PROBS]
            policy_after = actor.compute_log_prob(batch).batch[OLD_LOG_PROBS]
            checkpoint.mkdir(parents=True)
            actor.save_checkpoint(str(checkpoint))
            (checkpoint / DRIVER_STATE).write_text("{}")  # the driver's part, which export only looks for
    finally:
        pool.release()
    return {
        "cfg": cfg,
        "base": base,
        "tokenizer": tokenizer,
        "prompts": prompts,
        "batch": batch,
        "before": before,
        "after": rollout_tokens(after),
        "after_batch": after,
        "after_train": after_train,
        "untrained": untrained,
        "ref_after": ref_after,
        "policy_after": policy_after,
        "metrics": metrics,
        "checkpoint": checkpoint,
    }


def test_only_the_adapters_train_and_the_optimizer_holds_them_alone(trained):
    state = read_model_state(trained["checkpoint"], "actor")
    base = trained["base"].state_dict()
    adapters = {k: v for k, v in state.items() if lora.is_adapter_parameter(k)}
    assert len(adapters) == 2 * 7 * 2  # A and B of 7 linear layers in each of 2 decoder layers
    for name, tensor in state.items():
        if not lora.is_adapter_parameter(name):
            assert torch.equal(tensor, base[lora.model_name(name)]), f"{name} changed"
    moved = [k for k, v in adapters.items() if ".lora_B." in k and v.abs().max() > 0]
    assert len(moved) == 14  # B starts at zero; every one moved
    # AdamW: two fp32 moments per adapter element, split over 2 ranks, and a step count per adapter shard
    elements = sum(v.numel() for v in adapters.values())
    expected = (2 * 4 * elements + 4 * len(adapters) * 2) / 2
    assert [m["actor/optimizer_state_bytes_per_rank"] for m in trained["metrics"]] == [expected, expected]


def test_the_reference_is_the_model_with_its_adapters_off(trained):
    batch = trained["batch"]
    mask = batch.batch[RESPONSE_MASK].bool()
    # before the update B = 0: policy, reference and the untrained model agree
    assert torch.allclose(batch.batch[REF_LOG_PROBS][mask], trained["untrained"][mask], atol=1e-6)
    # after it the reference has not moved, the policy has
    assert torch.allclose(trained["ref_after"][mask], trained["untrained"][mask], atol=1e-6)
    assert (trained["policy_after"][mask] - trained["untrained"][mask]).abs().max() > 1e-2
    # in the direction of the advantages: rows pushed up became likelier, rows pushed down less likely
    change = ((trained["policy_after"] - trained["untrained"]) * mask).sum(-1)
    assert change[0] > 0 and change[2] > 0 and change[1] < 0 and change[3] < 0, change
    # and it is the base model's own log-probs, computed here by hand
    model = trained["base"].eval()
    ids, attn = batch.batch[INPUT_IDS], batch.batch[ATTENTION_MASK]
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=positions).logits.float()
    width = batch.batch[RESPONSES].shape[1]
    log_probs = torch.log_softmax(logits[:, -width - 1 : -1], -1).gather(-1, ids[:, -width:, None])[..., 0]
    assert torch.allclose(trained["ref_after"][mask], log_probs[mask], atol=1e-5)


def test_the_rollout_generates_with_the_merged_weights_as_the_peft_model_and_both_exports_do(trained, tmp_path):
    prompts, pad = trained["prompts"], trained["tokenizer"].pad_token_id
    assert trained["after"] != trained["before"]  # the update changed what the rollout generates
    mask = trained["after_batch"].batch[RESPONSE_MASK].bool()  # the rollout's log-probs are the trained model's
    assert torch.allclose(
        trained["after_batch"].batch[ROLLOUT_LOG_PROBS][mask], trained["after_train"][mask], atol=1e-5
    )
    state = read_model_state(trained["checkpoint"], "actor")
    # the trained peft model, in this process: a fresh base, the adapters put in, the checkpoint's values loaded
    fresh, _ = load_model_and_tokenizer(trained["cfg"].actor_rollout_ref.model.path, seed=0)
    peft_model = lora.add_adapters(fresh, lora.lora_config(trained["cfg"].actor_rollout_ref.model))
    peft_model.load_state_dict(state)
    assert greedy(peft_model.eval(), prompts, pad) == trained["after"]

    merged_dir = export_checkpoint(trained["checkpoint"], tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    assert not any("lora" in name for name, _ in merged.named_parameters())
    assert greedy(merged, prompts, pad) == trained["after"]

    adapter_dir = export_checkpoint(trained["checkpoint"], tmp_path / "adapter", adapter=True)
    base, _ = load_model_and_tokenizer(trained["cfg"].actor_rollout_ref.model.path, seed=0)
    loaded = PeftModel.from_pretrained(base, adapter_dir).eval()
    assert greedy(loaded, prompts, pad) == trained["after"]
    assert lora.adapter_scaling(json.loads((adapter_dir / lora.ADAPTER_CONFIG).read_text())) == ALPHA / RANK


def test_a_run_started_from_an_exported_adapter_generates_as_the_trained_one(trained, ray_session, tmp_path):
    adapter_dir = export_checkpoint(trained["checkpoint"], tmp_path / "adapter", adapter=True)
    cfg = config(**{"actor_rollout_ref.model.lora_adapter_path": str(adapter_dir)})
    dims = ParallelDims.from_config(cfg, use_critic=False)
    kwargs = {"config": cfg, "dims": dims, "loss_agg_mode": "token-mean"}
    roles = {"actor": RoleSpec(ActorRolloutWorker, kwargs=kwargs)}
    pool = ResourcePool([2])
    try:
        with ColocatedWorkerGroup(pool, roles, group_options(cfg)) as group:
            group["actor"].init_model()
            assert rollout_tokens(group["actor"].generate_sequences(trained["prompts"])) == trained["after"]
    finally:
        pool.release()


# AdamW's first step moves every parameter by lr * g / (|g| + eps) (its moments are g and g^2 then), so the trained B,
# which started at zero, is that entry by entry, g clipped as the update clips it. g computed here by hand: the
# token-mean policy-gradient loss of the same batch on a plain peft model with the group's A (A itself does not move in
# a first step: its gradient is s * B^T G = 0 while B = 0). The KL term adds nothing at a first step (the policy is the
# reference, k3's gradient 0).
def test_the_first_update_of_b_is_minus_lr_times_the_sign_of_the_hand_computed_gradient(trained):
    state, cfg, batch = read_model_state(trained["checkpoint"], "actor"), trained["cfg"], trained["batch"]
    fresh, _ = load_model_and_tokenizer(cfg.actor_rollout_ref.model.path, seed=cfg.trainer.seed)
    model = lora.add_adapters(fresh, lora.lora_config(cfg.actor_rollout_ref.model))
    model.load_state_dict({k: torch.zeros_like(v) if ".lora_B." in k else v for k, v in state.items()})
    ids, attn = batch.batch[INPUT_IDS], batch.batch[ATTENTION_MASK]
    width = batch.batch[RESPONSES].shape[1]
    logits = model(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).logits
    log_probs = torch.log_softmax(logits[:, -width - 1 : -1].float(), -1).gather(-1, ids[:, -width:, None])[..., 0]
    mask = batch.batch[RESPONSE_MASK].float()
    (-(batch.batch[ADVANTAGES] * log_probs * mask).sum() / mask.sum()).backward()
    optim = cfg.actor_rollout_ref.actor.optim
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads.values()]))
    clip = min(1.0, optim.grad_clip / (float(norm) + 1e-6))  # torch's clip_grad_norm_ coefficient
    checked = 0
    for name, grad in grads.items():
        if ".lora_B." in name:
            g = grad * clip
            torch.testing.assert_close(state[name], -optim.lr * g / (g.abs() + 1e-8), rtol=1e-3, atol=1e-7)
            checked += int((g.abs() > 1e-6).sum())
    assert checked > 5000  # of the 14 B matrices' 6,144 entries, most moved by the full lr


# Computing in bf16 (model.dtype), an fp32 master copy of frozen weights would only cost memory: the base is held in
# bf16 as read, the adapters in fp32, which FSDP2's mixed precision casts to bf16 for each forward.
def test_computing_in_bf16_the_frozen_base_is_held_in_bf16_and_the_adapters_in_fp32(ray_session, tmp_path):
    cfg = config(**{"actor_rollout_ref.model.dtype": "bfloat16"})
    dims = ParallelDims.from_config(cfg, use_critic=False)
    base, tokenizer = load_model_and_tokenizer(cfg.actor_rollout_ref.model.path, seed=cfg.trainer.seed)
    base_elements = sum(p.numel() for p in base.parameters())  # the tied embedding once
    ids, mask, _ = left_pad(
        [tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS], tokenizer.pad_token_id
    )
    prompts = DataProto.from_dict({INPUT_IDS: ids, ATTENTION_MASK: mask}, meta_info={"n": 1, "greedy": True, "seed": 0})
    kwargs = {"config": cfg, "dims": dims, "loss_agg_mode": "token-mean"}
    pool = ResourcePool([2])
    try:
        with ColocatedWorkerGroup(
            pool, {"actor": RoleSpec(ActorRolloutWorker, kwargs=kwargs)}, group_options(cfg)
        ) as group:
            actor = group["actor"]
            actor.init_model()
            batch = columns(actor.generate_sequences(prompts))
            batch.union(columns(actor.compute_log_prob(batch)))
            batch.union(columns(actor.compute_ref_log_prob(batch)))
            batch.batch[ADVANTAGES] = 5.0 * torch.tensor([1.0, -1.0, 1.0, -1.0])[:, None] * batch.batch[RESPONSE_MASK]
            batch.meta_info["global_step"] = 1
            metrics = actor.update_actor(batch)
            actor.save_checkpoint(str(tmp_path))
    finally:
        pool.release()
    state = read_model_state(tmp_path, "actor")
    base = {name: tensor.to(torch.bfloat16) for name, tensor in base.state_dict().items()}
    adapters = {k: v for k, v in state.items() if lora.is_adapter_parameter(k)}
    assert {v.dtype for v in adapters.values()} == {torch.float32}
    assert any(v.abs().max() > 0 for k, v in adapters.items() if ".lora_B." in k)  # the update moved B
    frozen = {k: v for k, v in state.items() if not lora.is_adapter_parameter(k)}
    for name, tensor in frozen.items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, base[lora.model_name(name)]), name
    # per rank: half of the bf16 base and of the fp32 adapters; the optimizer: fp32 moments of the adapters alone
    held = (2 * base_elements + 4 * sum(v.numel() for v in adapters.values())) / 2
    assert [m["actor/param_bytes_per_rank"] for m in metrics] == [held, held]
    elements = sum(v.numel() for v in adapters.values())
    assert [m["actor/optimizer_state_bytes_per_rank"] for m in metrics] == [(8 * elements + 8 * len(adapters)) / 2] * 2

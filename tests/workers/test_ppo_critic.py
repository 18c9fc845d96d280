import copy

import pytest
import torch
from support import rollout_batch
from transformers import Qwen2Config, Qwen2ForTokenClassification

from hybridflow.configs.schema import CriticConfig
from hybridflow.losses.value import clipped_value_loss
from hybridflow.workers.critic.ppo_critic import PPOCritic


def tiny_critic(seed=0):
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=24,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        num_labels=1,
        classifier_dropout=0.0,
    )
    return Qwen2ForTokenClassification(config).float()


def test_clipped_value_loss_hand_computed():
    values = torch.tensor([[1.0, 0.0, 5.0]])
    old = torch.tensor([[0.0, 0.0, 0.0]])
    returns = torch.tensor([[1.0, 2.0, 0.0]])
    losses, metrics = clipped_value_loss(values, old, returns, torch.ones(1, 3), cliprange=0.5)
    # token 0: unclipped 0, clipped (0.5-1)^2=.25 -> .125 ; token 1: both 4 -> 2 ; token 2: unclipped 25,
    # clipped .25 -> 12.5
    assert losses.tolist()[0] == pytest.approx([0.125, 2.0, 12.5])
    assert metrics["critic/vf_clipfrac"] == pytest.approx(1 / 3)
    # with the last token masked out: the clipped share is of the two valid tokens (token 0 of them)
    _, metrics = clipped_value_loss(values, old, returns, torch.tensor([[1.0, 1.0, 0.0]]), cliprange=0.5)
    assert metrics["critic/vf_clipfrac"] == pytest.approx(1 / 2)


def make_critic(model, micro):
    return PPOCritic(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        CriticConfig(ppo_micro_batch_size_per_gpu=micro),
        rows_per_mini_batch=8,
    )


def test_values_zero_outside_mask_and_micro_batch_independent():
    data, model = rollout_batch(), tiny_critic()
    a = make_critic(model, 3).compute_values(data).batch["values"]
    b = make_critic(model, 8).compute_values(data).batch["values"]
    assert torch.allclose(a, b, atol=1e-6)
    assert (a[data.batch["response_mask"] == 0] == 0).all()


def test_update_moves_values_towards_returns_and_is_micro_batch_independent():
    data, base = rollout_batch(), tiny_critic()
    data.union(make_critic(base, 8).compute_values(data))
    data.batch["returns"] = torch.ones_like(data.batch["values"]) * data.batch["response_mask"]
    models = []
    for micro in (8, 2):
        model = copy.deepcopy(base)
        critic = make_critic(model, micro)
        for _ in range(3):
            metrics = critic.update_critic(data)
        models.append(model)
    for p1, p2 in zip(models[0].parameters(), models[1].parameters()):
        assert torch.allclose(p1, p2, atol=1e-5)
    mask = data.batch["response_mask"].bool()
    before = (data.batch["values"][mask] - 1).square().mean()
    after_values = make_critic(models[0], 8).compute_values(data).batch["values"]
    assert (after_values[mask] - 1).square().mean() < before
    assert {"critic/vf_loss", "critic/vf_clipfrac", "critic/grad_norm"} <= set(metrics)

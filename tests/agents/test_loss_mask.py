"""The loss mask of multi-turn trajectories: observation tokens carry no gradient, no advantage, no length."""

import pytest
import torch
from support import rollout_batch, tiny_model

from hybridflow.configs.schema import ActorConfig
from hybridflow.core import DataProto
from hybridflow.estimators.gae import gae_advantage
from hybridflow.estimators.grpo import grpo_advantage
from hybridflow.estimators.reinforce_plus_plus import reinforce_plus_plus_advantage
from hybridflow.trainer.metrics import compute_data_metrics
from hybridflow.workers.actor.ppo_actor import PPOActor

# response positions 2 and 3 of every row are a tool observation: in the sequence, not in the loss
HOLE = (2, 3)


def trajectory_batch(rows=4, prompt=4, response=6):
    """Rows whose responses are policy, policy, observation, observation, policy, policy (all real tokens)."""
    batch = rollout_batch(rows=rows, prompt=prompt, response=response, seed=3)
    real = torch.ones(rows, response, dtype=torch.long)
    batch.batch["attention_mask"] = torch.cat([batch.batch["attention_mask"][:, :prompt], real], dim=1)
    batch.batch["position_ids"] = (batch.batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    responses = torch.randint(3, 24, (rows, response), generator=torch.Generator().manual_seed(1))
    batch.batch["responses"] = responses
    batch.batch["input_ids"] = torch.cat([batch.batch["prompts"], responses], dim=1)
    mask = real.clone()
    mask[:, list(HOLE)] = 0
    batch.batch["response_mask"] = mask
    return batch


def logit_gradients(batch: DataProto) -> torch.Tensor:
    """d loss / d logits (B, P+T, V) of one actor update (pg + entropy + KL terms) on the padded path."""
    model = tiny_model(seed=0)
    rows, response = batch.batch["responses"].shape
    gen = torch.Generator().manual_seed(2)
    batch.batch["old_log_probs"] = -torch.rand(rows, response, generator=gen) - 2.0
    batch.batch["ref_log_probs"] = -torch.rand(rows, response, generator=gen) - 2.0
    batch.batch["advantages"] = torch.randn(rows, response, generator=gen)
    config = ActorConfig(ppo_micro_batch_size_per_gpu=rows, entropy_coeff=0.01, use_kl_loss=True, shuffle=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    actor = PPOActor(
        model, optimizer, config, loss_agg_mode="token-mean", rows_per_mini_batch=rows, use_remove_padding=False
    )
    grads = []

    def keep_gradient(_module, _inputs, logits):
        if logits.requires_grad:  # the update's forward (not a no-grad pass)
            logits.register_hook(grads.append)

    model.lm_head.register_forward_hook(keep_gradient)
    actor.update_policy(batch, temperature=1.0)
    assert len(grads) == 1
    return grads[0]


def test_observation_logits_get_exactly_zero_gradient():
    batch = trajectory_batch()
    prompt = batch.batch["prompts"].shape[1]
    grads = logit_gradients(batch)
    # the logits at sequence position p predict token p + 1: response token j is predicted at prompt + j - 1
    predicting = lambda j: prompt + j - 1  # noqa: E731
    for j in HOLE:
        assert torch.equal(grads[:, predicting(j)], torch.zeros_like(grads[:, predicting(j)])), f"observation token {j}"
    for j in (0, 1, 4, 5):
        assert grads[:, predicting(j)].abs().sum(-1).min() > 0, f"policy token {j} got no gradient"


def test_the_same_tokens_get_gradient_once_they_are_in_the_loss_mask():
    """The check above can fail: with the hole filled the observation positions do get gradient."""
    batch = trajectory_batch()
    batch.batch["response_mask"] = torch.ones_like(batch.batch["response_mask"])
    prompt = batch.batch["prompts"].shape[1]
    grads = logit_gradients(batch)
    for j in HOLE:
        assert grads[:, prompt + j - 1].abs().sum() > 0


# one row: policy, policy, observation, observation, policy, policy; the score on the last policy token
MASK = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 1.0]])
REWARDS = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 1.0]])
VALID = MASK[0].bool()


def test_gae_skips_observation_tokens_without_discounting_across_them():
    values = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6]])
    gamma, lam = 0.9, 0.8
    # by hand, over the policy tokens 5, 4, 1, 0 only (V_next of token 1 is V_4: the observation is skipped)
    a5 = 1.0 - 0.6
    a4 = (0.9 * 0.6 - 0.5) + gamma * lam * a5
    a1 = (0.9 * 0.5 - 0.2) + gamma * lam * a4
    a0 = (0.9 * 0.2 - 0.1) + gamma * lam * a1
    expected_returns = torch.tensor([a0 + 0.1, a1 + 0.2, a4 + 0.5, a5 + 0.6])
    _, returns = gae_advantage(REWARDS, MASK, values, gamma=gamma, lam=lam)
    torch.testing.assert_close(returns[0, VALID], expected_returns, rtol=0, atol=1e-6)


def test_reinforce_plus_plus_returns_skip_observation_tokens():
    _, returns = reinforce_plus_plus_advantage(REWARDS, MASK, gamma=0.9)
    # G_5 = 1, G_4 = 0.9, then the observation is skipped: G_1 = 0.81, G_0 = 0.729; zero on the observation
    torch.testing.assert_close(returns[0], torch.tensor([0.729, 0.81, 0.0, 0.0, 0.9, 1.0]), rtol=0, atol=1e-6)


def test_grpo_advantage_is_zero_on_observation_tokens():
    mask = MASK.repeat(2, 1)
    rewards = torch.zeros(2, 6)
    rewards[0, 5] = 1.0  # the group's two trajectories score 1 and 0
    advantages, _ = grpo_advantage(rewards, mask, torch.tensor([0, 0]))
    # mean 0.5, std (unbiased) sqrt(0.5): +-0.7071 on policy tokens, 0 on the observation
    expected = torch.tensor([0.70710677, -0.70710677])[:, None] * mask
    torch.testing.assert_close(advantages, expected, rtol=0, atol=1e-5)


def test_lengths_count_policy_tokens_and_prompts_their_own():
    batch = trajectory_batch(rows=2)
    batch.batch["token_level_scores"] = torch.zeros(2, 6)
    metrics = compute_data_metrics(batch)
    assert metrics["response_length/mean"] == pytest.approx(4.0)  # 6 real tokens, 2 of them the observation
    prompt_tokens = batch.batch["attention_mask"][:, :4].sum(-1).float().mean().item()
    assert metrics["prompt_length/mean"] == pytest.approx(prompt_tokens)

"""PPOActor on one process: log-probs, update invariance, skipped steps."""

import copy
import math

import pytest
import torch
from support import rollout_batch, tiny_model

from hybridflow.configs.schema import ActorConfig
from hybridflow.losses import LOSS_AGG_MODES
from hybridflow.workers.actor.ppo_actor import PPOActor
from hybridflow.workers.log_probs import entropy_from_logits, log_probs_from_logits, response_log_probs


def make_actor(model, micro, mode="token-mean", rows_per_mini=8, **cfg):
    config = ActorConfig(ppo_micro_batch_size_per_gpu=micro, **cfg)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    return PPOActor(model, optimizer, config, loss_agg_mode=mode, rows_per_mini_batch=rows_per_mini)


def test_log_probs_match_manual_softmax():
    logits = torch.randn(2, 3, 5)
    labels = torch.tensor([[0, 4, 2], [1, 1, 3]])
    manual = torch.log(torch.softmax(logits, -1)).gather(-1, labels[..., None])[..., 0]
    assert torch.allclose(log_probs_from_logits(logits, labels), manual, atol=1e-6)
    p = torch.softmax(logits, -1)
    assert torch.allclose(entropy_from_logits(logits), -(p * p.log()).sum(-1), atol=1e-6)


def test_response_log_probs_equal_a_per_row_unpadded_forward():
    model, data = tiny_model(), rollout_batch()
    batched = response_log_probs(model, data, temperature=0.7).log_probs
    for i in range(len(data)):
        keep = data.batch["attention_mask"][i].bool()
        ids = data.batch["input_ids"][i][keep][None]
        n_resp = int(data.batch["response_mask"][i].sum())
        logits = model(input_ids=ids).logits[0, -n_resp - 1 : -1] / 0.7
        expected = log_probs_from_logits(logits, ids[0, -n_resp:])
        assert torch.allclose(batched[i, :n_resp], expected, atol=1e-5)


def test_compute_log_prob_is_micro_batch_independent():
    model, data = tiny_model(), rollout_batch()
    a = make_actor(model, micro=3).compute_log_prob(data, temperature=1.0).batch["old_log_probs"]
    b = make_actor(model, micro=8).compute_log_prob(data, temperature=1.0).batch["old_log_probs"]
    assert torch.allclose(a, b, atol=1e-6)


# token-mean-local is TRL's bnpo: a mean of per-micro-batch means, split-dependent by definition
@pytest.mark.parametrize("mode", [m for m in LOSS_AGG_MODES if m != "token-mean-local"])
def test_update_is_the_same_for_1_and_4_micro_batches(mode):
    data = rollout_batch()
    base = tiny_model()
    data.union(make_actor(base, micro=8).compute_log_prob(data, temperature=1.0))
    models = []
    for micro in (8, 2):
        model = copy.deepcopy(base)
        make_actor(model, micro=micro, mode=mode, entropy_coeff=0.01).update_policy(data, temperature=1.0)
        models.append(model)
    changed = False
    for (name, p1), p2, p0 in zip(models[0].named_parameters(), models[1].parameters(), base.parameters()):
        assert torch.allclose(p1, p2, atol=1e-6), name
        changed |= not torch.equal(p1, p0)
    assert changed


def test_first_step_with_zero_advantage_changes_nothing_and_ratio_is_one():
    data = rollout_batch()
    data.batch["advantages"].zero_()
    model = tiny_model()
    before = copy.deepcopy(model)
    actor = make_actor(model, micro=4)
    data.union(actor.compute_log_prob(data, temperature=1.0))
    metrics = actor.update_policy(data, temperature=1.0)
    assert metrics["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == 0.0
    for p, q in zip(model.parameters(), before.parameters()):
        assert torch.equal(p, q)


def test_non_finite_gradient_skips_the_step():
    data = rollout_batch()
    model = tiny_model()
    actor = make_actor(model, micro=8)
    data.union(actor.compute_log_prob(data, temperature=1.0))
    data.batch["advantages"][0, 0] = float("nan")
    before = copy.deepcopy(model)
    metrics = actor.update_policy(data, temperature=1.0)
    assert metrics["actor/skipped_steps"] == 1.0 and math.isnan(metrics["actor/grad_norm"])
    for p, q in zip(model.parameters(), before.parameters()):
        assert torch.equal(p, q)


def test_kl_loss_is_the_estimator_value_and_pulls_the_policy_towards_the_reference():
    """Zero advantages leave the KL term alone: its value is hand-computable and its step must close the gap."""
    data = rollout_batch()
    model = tiny_model()
    actor = make_actor(model, micro=8, use_kl_loss=True, kl_loss_coef=1.0, kl_loss_type="k2")
    data.union(actor.compute_log_prob(data, temperature=1.0))
    data.batch["advantages"].zero_()
    old, mask = data.batch["old_log_probs"].clone(), data.batch["response_mask"].float()
    shift = 0.1 + 0.4 * torch.rand(old.shape, generator=torch.Generator().manual_seed(0))
    ref = old - shift  # the reference finds every sampled token less likely than the policy does
    data.batch["ref_log_probs"] = ref
    metrics = actor.update_policy(data, temperature=1.0)
    # k2 = (log pi - log pi_ref)^2 / 2, token mean; before the step log pi = old, so d = shift
    assert metrics["actor/kl_loss"] == pytest.approx(float((0.5 * shift**2 * mask).sum() / mask.sum()), rel=1e-4)
    after = actor.compute_log_prob(data, temperature=1.0).batch["old_log_probs"]
    gap = lambda lp: float(((lp - ref) ** 2 * mask).sum())  # noqa: E731
    assert gap(after) < 0.9 * gap(old)  # the step moved the policy towards the reference, not away


def test_unknown_policy_loss_option_is_an_error():
    with pytest.raises(ValueError, match=r"policy_loss_options has \['clip'\]; policy loss 'vanilla' takes"):
        make_actor(tiny_model(), micro=8, policy_loss_options={"clip": 0.1})


def test_rows_not_a_multiple_of_the_mini_batch():
    data = rollout_batch(rows=6)
    actor = make_actor(tiny_model(), micro=8, rows_per_mini=4)
    with pytest.raises(ValueError, match="6 rows, not a multiple of its 4"):
        actor.update_policy(data, temperature=1.0)


def test_rollout_is_weights_reach_the_loss():
    """Weights of 2 on every token move the weights as doubled advantages do (the first step's ratio is 1)."""
    data = rollout_batch()
    base = tiny_model()
    data.union(make_actor(base, micro=8).compute_log_prob(data, temperature=1.0))
    weighted, doubled = copy.deepcopy(base), copy.deepcopy(base)
    with_weights = data.select()
    with_weights.batch["rollout_is_weights"] = torch.full_like(data.batch["advantages"], 2.0)
    make_actor(weighted, micro=8).update_policy(with_weights, temperature=1.0)
    twice = data.select()
    twice.batch["advantages"] = data.batch["advantages"] * 2
    make_actor(doubled, micro=8).update_policy(twice, temperature=1.0)
    moved = False
    for p, q, p0 in zip(weighted.parameters(), doubled.parameters(), base.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
        moved |= not torch.equal(p, p0)
    assert moved


def test_compute_log_prob_returns_sum_pi_squared_when_asked():
    model, data = tiny_model(), rollout_batch()
    out = make_actor(model, micro=3).compute_log_prob(data, temperature=0.7, with_sum_pi_squared=True)
    logits = (
        model(
            input_ids=data.batch["input_ids"],
            attention_mask=data.batch["attention_mask"],
            position_ids=data.batch["position_ids"],
        ).logits[:, -6:-1]
        / 0.7
    )
    expected = (torch.softmax(logits.float(), -1) ** 2).sum(-1)
    real = data.batch["response_mask"].bool()  # the packed pass leaves the pads zero
    assert torch.allclose(out.batch["sum_pi_squared"][real], expected[real], atol=1e-5)
    assert "sum_pi_squared" not in make_actor(model, micro=3).compute_log_prob(data, temperature=0.7).batch

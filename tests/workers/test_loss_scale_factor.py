"""The actor's and the critic's aggregation against numbers worked out by hand, under several micro-batch layouts.

``seq-mean-token-sum-norm`` (Dr.GRPO) divides the token sums by (sequences x ``loss_scale_factor``), a constant
of the run: the mini-batch's loss and gradient must be the same whether its 8 rows go through in micro-batches
of 1, 2 or 4 rows, in token-budget micro-batches, packed or padded, or padded to a wider batch. The factor is
32 and the batch 30 tokens wide, so dividing by the padded width shows. The critic's value loss aggregates
with ``critic.loss_agg_mode``; the rollout correction's bypass mode computes the actor's policy term against
the rollout's log-probs.

At the first optimizer step the policy still is the one ``old_log_probs`` came from, so the PPO ratio is 1 and
the vanilla token loss is -A; the critic's new values are its old ones, so its token loss is 0.5 (V - R)^2 =
0.5 delta^2 for returns R = V + delta. The gradient is checked against autograd of the same objective written
out here, on one padded forward of the whole batch: with SGD at lr 1 the update is minus the gradient.
"""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from micro_batch_support import RESPONSE_LENS, ragged_batch, tiny_critic
from omegaconf import OmegaConf
from support import tiny_model

from hybridflow.configs.roles import resolve_loss_scale_factor
from hybridflow.configs.schema import ActorConfig, CriticConfig, OptimConfig, PPOConfig, RolloutCorrectionConfig
from hybridflow.core import DataProto
from hybridflow.trainer.config_checks import config_problems
from hybridflow.workers.actor.ppo_actor import PPOActor
from hybridflow.workers.critic.ppo_critic import PPOCritic, response_values
from hybridflow.workers.log_probs import response_log_probs

FACTOR = 32  # the batch is max(RESPONSE_LENS) = 30 tokens wide
ROWS = len(RESPONSE_LENS)
NO_CLIP = OptimConfig(grad_clip=1e9)
KL_COEF = 0.5
D = 0.1  # log pi - log pi_ref at every valid token

# name: (micro-batch rows, token budget or None, packed)
LAYOUTS = {
    "1 row padded": (1, None, False),
    "2 rows packed": (2, None, True),
    "4 rows padded": (4, None, False),
    "dynamic packed": (2, 60, True),
    "dynamic padded": (2, 60, False),
}


def widen(data: DataProto, extra: int) -> DataProto:
    """The same rows with ``extra`` more masked response columns: a batch padded to a longer response."""
    width = data.batch["responses"].shape[1]
    out = {}
    for key, value in data.batch.items():
        out[key] = F.pad(value, (0, extra)) if value.dim() == 2 and key != "prompts" else value
    out["position_ids"] = (out["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    assert out["responses"].shape[1] == width + extra
    return DataProto.from_dict(out)


def make_actor(model, layout, *, mode="seq-mean-token-sum-norm", factor=FACTOR, correction=None, **cfg):
    rows, budget, packed = layout
    config = ActorConfig(
        ppo_micro_batch_size_per_gpu=rows,
        use_dynamic_bsz=budget is not None,
        ppo_max_token_len_per_gpu=budget or 16384,
        optim=NO_CLIP,
        **cfg,
    )
    return PPOActor(
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        config,
        loss_agg_mode=mode,
        rows_per_mini_batch=ROWS,
        use_remove_padding=packed,
        loss_scale_factor=factor,
        rollout_correction=correction,
    )


def policy_batch(base):
    data = ragged_batch()
    data.union(make_actor(base, LAYOUTS["4 rows padded"]).compute_log_prob(data, temperature=1.0))
    data.batch["ref_log_probs"] = data.batch["old_log_probs"] - D * data.batch["response_mask"]
    return data


def update(base, data, actor_of):
    model = copy.deepcopy(base)
    metrics = actor_of(model).update_policy(data, temperature=1.0)
    return metrics, [p.detach() - p0.detach() for p, p0 in zip(model.parameters(), base.parameters())]


def autograd_step(base, data, objective):
    """Minus the gradient of ``objective(log_probs)`` on one padded forward of the whole batch (SGD at lr 1)."""
    model = copy.deepcopy(base)
    log_probs = response_log_probs(model, data, temperature=1.0).log_probs
    grads = torch.autograd.grad(objective(log_probs), list(model.parameters()))
    return [-g for g in grads]


def assert_same_step(got, expected):
    for a, b in zip(got, expected):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-7), (a - b).abs().max()


def per_row_advantage(data):
    return data.batch["advantages"][:, 0].tolist()


@pytest.fixture(scope="module")
def policy():
    base = tiny_model()
    return base, policy_batch(base)


def test_dr_grpo_loss_is_the_token_sums_over_sequences_times_the_constant_in_every_layout(policy):
    base, data = policy
    adv = per_row_advantage(data)
    tokens = sum(RESPONSE_LENS)
    pg = sum(n * -a for n, a in zip(RESPONSE_LENS, adv)) / (ROWS * FACTOR)  # the ratio is 1: token loss -A
    kl = tokens * (math.exp(-D) - 1 + D) / (ROWS * FACTOR)  # low_var_kl+: k3's value

    mask, advantages = data.batch["response_mask"].float(), data.batch["advantages"]

    def objective(lp):  # PPO at ratio 1 and the KL term, whose gradient is k2's: d/dlp (lp - ref)^2 / 2
        ratio = torch.exp(lp - lp.detach())
        k2 = 0.5 * (lp - data.batch["ref_log_probs"]).square()
        return ((-advantages * ratio + KL_COEF * k2) * mask).sum() / (ROWS * FACTOR)

    expected = autograd_step(base, data, objective)
    runs = {
        name: update(
            base,
            data,
            lambda m, layout=layout: make_actor(
                m, layout, use_kl_loss=True, kl_loss_coef=KL_COEF, kl_loss_type="low_var_kl+"
            ),
        )
        for name, layout in LAYOUTS.items()
    }
    wide = widen(data, 10)
    runs["4 rows packed, 10 more pad columns"] = update(
        base,
        wide,
        lambda m: make_actor(m, (4, None, True), use_kl_loss=True, kl_loss_coef=KL_COEF, kl_loss_type="low_var_kl+"),
    )
    for name, (metrics, step) in runs.items():
        assert metrics["actor/pg_loss"] == pytest.approx(pg, abs=1e-6), name
        assert metrics["actor/kl_loss"] == pytest.approx(kl, abs=1e-6), name
        assert metrics["actor/grad_norm"] == pytest.approx(
            float(torch.cat([g.flatten() for g in expected]).norm()), rel=1e-4
        ), name
        assert_same_step(step, expected)


def test_without_a_constant_the_padded_width_leaks_in(policy):
    """The old behaviour, still agg_loss's fallback: a wider padding gives another loss. This is what the
    constant fixes (and why the test above pads 10 more columns)."""
    base, data = policy
    narrow, _ = update(base, data, lambda m: make_actor(m, (4, None, True), factor=None))
    wide, _ = update(base, widen(data, 10), lambda m: make_actor(m, (4, None, True), factor=None))
    assert narrow["actor/pg_loss"] == pytest.approx(wide["actor/pg_loss"] * 40 / 30, rel=1e-5)


def test_the_constant_is_the_response_length_unless_set():
    config = PPOConfig()
    config.actor_rollout_ref.rollout.response_length = 48
    assert resolve_loss_scale_factor(config) == 48
    config.actor_rollout_ref.actor.loss_scale_factor = 100
    assert resolve_loss_scale_factor(config) == 100
    assert ActorConfig(loss_scale_factor=0).problems() == ["loss_scale_factor=0 must be > 0 or null"]


# the critic: returns R = V_old + delta, delta = -0.3, 0, 0.3, -0.3, ... along each response
def deltas(width):
    return [0.3 * ((t % 3) - 1) for t in range(width)]


def value_batch(base):
    data = ragged_batch()
    values = make_critic(base, "token-mean", (4, None, False)).compute_values(data).batch["values"]
    delta = torch.tensor(deltas(values.shape[1]))[None, :] * data.batch["response_mask"]
    data.batch["values"], data.batch["returns"] = values, values + delta
    return data


def make_critic(model, mode, layout):
    rows, budget, packed = layout
    config = CriticConfig(
        loss_agg_mode=mode,
        ppo_micro_batch_size_per_gpu=rows,
        use_dynamic_bsz=budget is not None,
        ppo_max_token_len_per_gpu=budget or 16384,
        optim=NO_CLIP,
    )
    return PPOCritic(
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        config,
        rows_per_mini_batch=ROWS,
        use_remove_padding=packed,
        loss_scale_factor=FACTOR,
    )


def hand_value_loss(mode):
    """The value loss of each mode from the per-token 0.5 delta^2, summed by hand."""
    sums = [sum(0.5 * d * d for d in deltas(n)) for n in RESPONSE_LENS]  # each row's valid tokens: its first n
    return {
        "token-mean": sum(sums) / sum(RESPONSE_LENS),
        "seq-mean-token-sum": sum(sums) / ROWS,
        "seq-mean-token-mean": sum(s / n for s, n in zip(sums, RESPONSE_LENS)) / ROWS,
        "seq-mean-token-sum-norm": sum(sums) / (ROWS * FACTOR),
    }[mode]


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_critic_value_loss_aggregates_with_its_mode_in_every_layout(mode):
    base = tiny_critic()
    data = value_batch(base)
    mask = data.batch["response_mask"].float()
    tokens = mask.sum(-1)

    def objective():
        model = copy.deepcopy(base)
        v = response_values(model, data)
        token = 0.5 * (v - data.batch["returns"]).square() * mask
        total = {
            "token-mean": token.sum() / mask.sum(),
            "seq-mean-token-sum": token.sum() / ROWS,
            "seq-mean-token-mean": (token.sum(-1) / tokens).sum() / ROWS,
            "seq-mean-token-sum-norm": token.sum() / (ROWS * FACTOR),
        }[mode]
        return [-g for g in torch.autograd.grad(total, list(model.parameters()))]

    expected = objective()
    for layout in ((1, None, False), (4, None, True), (2, 60, True)):
        model = copy.deepcopy(base)
        metrics = make_critic(model, mode, layout).update_critic(data)
        assert metrics["critic/vf_loss"] == pytest.approx(hand_value_loss(mode), rel=1e-5), layout
        assert_same_step([p.detach() - p0.detach() for p, p0 in zip(model.parameters(), base.parameters())], expected)


def test_the_critic_modes_give_different_numbers_here():
    """So the test above tells the modes apart (a critic stuck on the token mean fails three of its four)."""
    values = [
        hand_value_loss(m)
        for m in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
    ]
    assert len({round(v, 9) for v in values}) == 4


# bypass mode in the actor: rollout log-probs r = old - delta, so at the first step pi_current / pi_rollout = e^delta
BYPASS_DELTAS = [0.225, -0.075, 0.075, -0.225]  # along each response, repeating
C = 1.1


def bypass_batch(data):
    data = DataProto.from_dict(dict(data.batch))
    width = data.batch["responses"].shape[1]
    delta = torch.tensor([BYPASS_DELTAS[t % 4] for t in range(width)])[None, :] * data.batch["response_mask"]
    data.batch["rollout_log_probs"] = data.batch["old_log_probs"] - delta
    return data


def test_bypass_reinforce_in_the_actor_is_minus_a_log_pi_times_the_truncated_ratio(policy):
    base, data = policy
    data = bypass_batch(data)
    correction = RolloutCorrectionConfig(
        bypass_mode=True, loss_type="reinforce", rollout_is="token", rollout_is_threshold=C
    )
    adv, old = per_row_advantage(data), data.batch["old_log_probs"]
    weights = [min(math.exp(BYPASS_DELTAS[t % 4]), C) for t in range(30)]
    tokens = sum(RESPONSE_LENS)
    pg = sum(-adv[i] * float(old[i, t]) * weights[t] for i, n in enumerate(RESPONSE_LENS) for t in range(n)) / tokens
    mask, advantages = data.batch["response_mask"].float(), data.batch["advantages"]
    w = torch.tensor(weights)[None, :]
    expected = autograd_step(base, data, lambda lp: (-advantages * lp * w * mask).sum() / tokens)
    for layout in (LAYOUTS["2 rows packed"], LAYOUTS["dynamic padded"]):
        metrics, step = update(base, data, lambda m: make_actor(m, layout, mode="token-mean", correction=correction))
        assert metrics["actor/pg_loss"] == pytest.approx(pg, abs=1e-6)
        assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(
            sum(weights[t] for n in RESPONSE_LENS for t in range(n)) / tokens, abs=1e-6
        )
        assert metrics["rollout_corr/rollout_is_max"] == pytest.approx(C)
        assert_same_step(step, expected)


def test_bypass_ppo_clip_in_the_actor_clips_the_ratio_to_the_rollout(policy):
    base, data = policy
    data = bypass_batch(data)
    adv = per_row_advantage(data)
    tokens = sum(RESPONSE_LENS)

    def token_loss(a, r):  # PPO clip 0.2 and dual clip 3, by cases
        if a >= 0:
            return -a * min(r, 1.2)
        return min(-a * max(r, 0.8), -3 * a)

    pg = (
        sum(token_loss(adv[i], math.exp(BYPASS_DELTAS[t % 4])) for i, n in enumerate(RESPONSE_LENS) for t in range(n))
        / tokens
    )
    correction = RolloutCorrectionConfig(bypass_mode=True)
    metrics, _ = update(
        base, data, lambda m: make_actor(m, LAYOUTS["2 rows packed"], mode="token-mean", correction=correction)
    )
    assert metrics["actor/pg_loss"] == pytest.approx(pg, abs=1e-6)
    # the decoupled loss with the same batch divides by old_log_probs: ratio 1, another number
    decoupled, _ = update(base, data, lambda m: make_actor(m, LAYOUTS["2 rows packed"], mode="token-mean"))
    assert decoupled["actor/pg_loss"] == pytest.approx(
        sum(n * -a for n, a in zip(RESPONSE_LENS, adv)) / tokens, abs=1e-6
    )


@pytest.mark.parametrize("loss_type", ["ppo_clip", "reinforce"])
def test_bypass_mask_mode_drops_tokens_from_the_policy_term_but_not_from_the_counts(policy, loss_type):
    """Bounds [1/1.1, 1.1]: e^0.225 and e^-0.225 fall outside, e^0.075 and e^-0.075 stay. The dropped tokens leave
    the numerator (the PPO clip has no weight that could zero them: only the mask does); the token mean still
    divides by all the mini-batch's tokens, as veRL's global counts do."""
    base, data = policy
    data = bypass_batch(data)
    correction = RolloutCorrectionConfig(
        bypass_mode=True, loss_type=loss_type, rollout_is="token", rollout_is_mode="mask", rollout_is_threshold=C
    )
    adv, old = per_row_advantage(data), data.batch["old_log_probs"]
    kept = [abs(BYPASS_DELTAS[t % 4]) < 0.1 for t in range(30)]
    tokens = sum(RESPONSE_LENS)
    ratio = [math.exp(BYPASS_DELTAS[t % 4]) for t in range(30)]  # within the PPO clip where kept: -A r
    token = (
        (lambda i, t: -adv[i] * ratio[t])
        if loss_type == "ppo_clip"
        else (lambda i, t: -adv[i] * float(old[i, t]) * ratio[t])
    )
    pg = sum(token(i, t) for i, n in enumerate(RESPONSE_LENS) for t in range(n) if kept[t]) / tokens
    metrics, _ = update(
        base, data, lambda m: make_actor(m, LAYOUTS["dynamic packed"], mode="token-mean", correction=correction)
    )
    assert metrics["actor/pg_loss"] == pytest.approx(pg, abs=1e-6)
    dropped = sum(1 for n in RESPONSE_LENS for t in range(n) if not kept[t])
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(dropped / tokens, abs=1e-6)


def test_the_config_check_takes_the_critic_modes_and_no_other():
    def problems(mode):
        conf = OmegaConf.structured(PPOConfig)
        OmegaConf.update(conf, "critic.loss_agg_mode", mode)
        return config_problems(conf)

    assert problems("seq-mean-token-sum-norm") == []
    assert problems("mean") == [
        "critic.loss_agg_mode='mean'; allowed: token-mean, token-sum, token-mean-local, "
        "seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm"
    ]

"""Token-budget micro-batches (``use_dynamic_bsz``): balanced parts within the budget, results in row order,
and updates equal to fixed-row micro-batches, on one process and on 2 gloo ranks under FSDP2."""

import copy
import random
import time

import pytest
import torch
import torch.multiprocessing as mp
from micro_batch_support import dynamic_update_rank, ragged_batch, tiny_critic
from support import tiny_model

from hybridflow.configs.schema import ActorConfig, ActorRolloutRefConfig, CriticConfig, RolloutConfig
from hybridflow.core.worker import free_ports
from hybridflow.workers.actor.ppo_actor import PPOActor
from hybridflow.workers.critic.ppo_critic import PPOCritic
from hybridflow.workers.log_probs import response_log_probs
from hybridflow.workers.micro_batches import (
    MicroBatching,
    balanced_parts,
    log_prob_token_budget,
    parts_needed,
    restore_order,
)
from hybridflow.workers.models import load_model_and_tokenizer

# real tokens per row: prompt + response
LENGTHS = [p + r for p, r in zip([1, 7, 20, 3, 12, 2, 5, 16], [30, 1, 4, 17, 2, 9, 30, 1])]  # 31 8 24 20 14 11 35 17


def test_balanced_parts_deal_the_longest_row_to_the_lightest_part():
    # 9 -> A, 7 -> B, 6 -> B (13), 5 -> A (14), 2 -> B (15), 1 -> A (15)
    assert balanced_parts([9, 7, 6, 5, 2, 1], 2) == [[0, 3, 5], [1, 2, 4]]
    assert balanced_parts([0, 0, 0], 3) == [[0], [1], [2]]  # no part is left empty, even by rows of no tokens
    with pytest.raises(ValueError, match="non-empty parts"):
        balanced_parts([1, 2], 3)


def test_parts_needed_is_the_fewest_parts_within_the_budget():
    assert parts_needed([9, 7, 6, 5, 2, 1], 15) == 2
    assert parts_needed([9, 7, 6, 5, 2, 1], 14) == 3
    assert parts_needed([20, 3, 3], 6) == 2  # the row over the budget alone, the others together
    assert parts_needed([20, 30], 6) == 2
    assert parts_needed([5], 100) == 1


def test_parts_hold_every_row_once_and_stay_within_the_budget():
    rng = random.Random(0)
    for _ in range(200):
        lengths = [
            rng.choice([1, 2, 3, 50, 60]) if rng.random() < 0.3 else rng.randint(1, 40)
            for _ in range(rng.randint(1, 30))
        ]
        budget = rng.randint(10, 120)
        k = parts_needed(lengths, budget)
        parts = balanced_parts(lengths, k)
        assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
        assert len(parts) == k and all(parts)
        assert all(len(p) == 1 or sum(lengths[i] for i in p) <= budget for p in parts)
        # fewest: k - 1 balanced parts would break the budget (or k is forced by rows over it)
        over = sum(n > budget for n in lengths)
        if k > max(1, over):
            fewer = balanced_parts(lengths, k - 1)
            assert any(len(p) > 1 and sum(lengths[i] for i in p) > budget for p in fewer)


def test_split_then_restore_order_is_the_identity():
    data = ragged_batch()
    data.batch["row"] = torch.arange(len(data))
    assert data.batch["attention_mask"].sum(-1).tolist() == LENGTHS
    micro_batches, order = MicroBatching(rows=3, max_tokens=45).split(data)
    # 160 tokens: 4 parts; 35, 31, 24, 20 open them, then 17 -> 20 (37), 14 -> 24 (38), 11 -> 31 (42), 8 -> 35 (43)
    assert [int(m.batch["attention_mask"].sum()) for m in micro_batches] == [43, 42, 38, 37]
    assert order.tolist() != list(range(len(data)))  # the parts really reorder the rows
    rows = torch.cat([m.batch["row"] for m in micro_batches])
    assert restore_order(rows, order).tolist() == list(range(len(data)))
    fixed, none = MicroBatching(rows=3).split(data)
    assert [len(m) for m in fixed] == [3, 3, 2] and none is None


def test_log_prob_budget_defaults_to_the_actors():
    arr = ActorRolloutRefConfig(actor=ActorConfig(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=100))
    assert log_prob_token_budget(arr) == 100
    arr.rollout = RolloutConfig(log_prob_max_token_len_per_gpu=300)
    assert log_prob_token_budget(arr) == 300
    arr.rollout.log_prob_use_dynamic_bsz = False
    assert log_prob_token_budget(arr) is None
    assert log_prob_token_budget(ActorRolloutRefConfig(rollout=RolloutConfig(log_prob_use_dynamic_bsz=True))) == 16384


def test_budgets_below_one_are_refused():
    assert ActorConfig(ppo_max_token_len_per_gpu=0).problems() == ["ppo_max_token_len_per_gpu=0 must be >= 1"]
    assert RolloutConfig(log_prob_max_token_len_per_gpu=0).problems() == [
        "log_prob_max_token_len_per_gpu=0 must be >= 1 or null"
    ]
    assert CriticConfig(ppo_max_token_len_per_gpu=0, forward_max_token_len_per_gpu=-5).problems() == [
        "ppo_max_token_len_per_gpu=0 must be >= 1",
        "forward_max_token_len_per_gpu=-5 must be >= 1 or null",
    ]


def make_actor(model, *, dynamic, mode="token-mean", remove_padding=True, **cfg):
    config = ActorConfig(
        ppo_micro_batch_size_per_gpu=2,
        use_dynamic_bsz=dynamic,
        ppo_max_token_len_per_gpu=60,
        entropy_coeff=0.01,
        use_kl_loss=True,
        kl_loss_coef=0.5,
        **cfg,
    )
    return PPOActor(
        model,
        torch.optim.SGD(model.parameters(), lr=0.5),
        config,
        loss_agg_mode=mode,
        rows_per_mini_batch=8,
        use_remove_padding=remove_padding,
    )


@pytest.mark.parametrize("remove_padding", [True, False])
def test_dynamic_log_probs_come_back_in_row_order(remove_padding):
    data, model = ragged_batch(), tiny_model()
    fixed = make_actor(model, dynamic=False, remove_padding=remove_padding)
    dynamic = make_actor(model, dynamic=True, remove_padding=remove_padding)
    a = fixed.compute_log_prob(data, temperature=1.0, with_entropy=True, with_sum_pi_squared=True)
    b = dynamic.compute_log_prob(data, temperature=1.0, with_entropy=True, with_sum_pi_squared=True)
    real = data.batch["response_mask"].bool()
    for key in ("old_log_probs", "entropy", "sum_pi_squared"):
        assert torch.allclose(a.batch[key][real], b.batch[key][real], atol=1e-6), key


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_dynamic_update_equals_the_fixed_micro_batch_update(mode):
    data, base = ragged_batch(), tiny_model()
    data.union(make_actor(base, dynamic=False).compute_log_prob(data, temperature=1.0))
    data.batch["ref_log_probs"] = data.batch["old_log_probs"] - 0.1 * data.batch["response_mask"]
    models, metrics = [], []
    for dynamic in (False, True):
        model = copy.deepcopy(base)
        actor = make_actor(model, dynamic=dynamic, mode=mode)
        sizes = [len(m) for m in actor.update_batching.split(data)[0]]
        assert sizes == ([2, 2, 2, 2] if not dynamic else [2, 3, 3])  # 160 tokens in 3 parts of 49, 56 and 55
        metrics.append(actor.update_policy(data, temperature=1.0))
        models.append(model)
    for key in (
        "actor/pg_loss",
        "actor/entropy",
        "actor/kl_loss",
        "actor/pg_clipfrac",
        "actor/ppo_kl",
        "actor/surrogate_gain",
        "actor/grad_norm",
        "actor/param_norm",
    ):
        assert metrics[1][key] == pytest.approx(metrics[0][key], abs=1e-5), key
    for (name, a), b, p0 in zip(models[0].named_parameters(), models[1].parameters(), base.parameters()):
        assert torch.allclose(a, b, atol=1e-5), name
        assert not torch.equal(a, p0), name


def test_dynamic_critic_values_and_update_equal_the_fixed_ones():
    data, base = ragged_batch(), tiny_critic()

    def make(model, dynamic):
        config = CriticConfig(
            ppo_micro_batch_size_per_gpu=2,
            use_dynamic_bsz=dynamic,
            ppo_max_token_len_per_gpu=60,
            forward_max_token_len_per_gpu=90,
        )
        return PPOCritic(model, torch.optim.SGD(model.parameters(), lr=0.1), config, rows_per_mini_batch=8)

    assert [len(m) for m in make(base, True).forward_batching.split(data)[0]] == [4, 4]  # 80 + 80 tokens
    assert [len(m) for m in make(base, True).update_batching.split(data)[0]] == [2, 3, 3]
    values = make(base, False).compute_values(data).batch["values"]
    assert torch.allclose(make(base, True).compute_values(data).batch["values"], values, atol=1e-6)
    data.batch["values"] = values
    real = data.batch["response_mask"].bool()
    data.batch["returns"] = torch.linspace(-1, 1, real.numel()).view(real.shape) * real
    models, metrics = [], []
    for dynamic in (False, True):
        model = copy.deepcopy(base)
        metrics.append(make(model, dynamic).update_critic(data))
        models.append(model)
    for key in ("critic/vf_loss", "critic/vpred_mean", "critic/vf_clipfrac", "critic/grad_norm"):
        assert metrics[1][key] == pytest.approx(metrics[0][key], abs=1e-5), key
    for (name, a), b in zip(models[0].named_parameters(), models[1].parameters()):
        assert torch.allclose(a, b, atol=1e-5), name


def run_ranks(fn, world, *args, timeout_s=150):
    """``fn(rank, world, *args)`` on ``world`` spawned processes; fails (instead of hanging) past ``timeout_s``,
    as mismatched collectives would."""
    context = mp.start_processes(fn, args=(world, *args), nprocs=world, start_method="spawn", join=False)
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"ranks still running after {timeout_s}s: mismatched collectives?")


@pytest.mark.slow
def test_dp2_fsdp_dynamic_packed_update_and_log_probs_equal_one_padded_process(tmp_path):
    """Rank 0's rows are long and rank 1's short: alone they need 3 and 1 micro-batches, together both run 3."""
    data = ragged_batch([20, 16, 12, 7, 5, 3, 2, 1], [30, 17, 30, 9, 4, 2, 1, 1], seed=3)
    budget = 50  # rank 0: 50 | 42 | 33 + 16 tokens; rank 1: 9 + 5 + 3 + 2
    lengths = data.batch["attention_mask"].sum(-1).tolist()
    assert (parts_needed(lengths[:4], budget), parts_needed(lengths[4:], budget)) == (3, 1)
    base = tiny_model()
    single = copy.deepcopy(base)
    config = ActorConfig(ppo_micro_batch_size_per_gpu=8, entropy_coeff=0.01)
    reference = PPOActor(
        single,
        torch.optim.SGD(single.parameters(), lr=0.5),
        config,
        loss_agg_mode="token-mean",
        rows_per_mini_batch=8,
        use_remove_padding=False,
    )
    data.union(reference.compute_log_prob(data, temperature=1.0))
    expected = reference.update_policy(data, temperature=1.0)
    policy, _ = load_model_and_tokenizer("builtin:tiny-qwen2", dtype=torch.float32, seed=0)
    with torch.no_grad():
        ref_log_probs = response_log_probs(policy, data, temperature=0.8).log_probs
    torch.save({"data": data, "budget": budget}, tmp_path / "setup.pt")

    run_ranks(dynamic_update_rank, 2, free_ports(1)[0], str(tmp_path))
    reports = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    real = data.batch["response_mask"].bool()
    for rank, report in enumerate(reports):
        assert report["micro_batches"] == 3
        rows = slice(4 * rank, 4 * rank + 4)
        assert torch.allclose(
            report["old_log_probs"][real[rows]], data.batch["old_log_probs"][rows][real[rows]], atol=1e-5
        )
        assert torch.allclose(report["ref_log_probs"][real[rows]], ref_log_probs[rows][real[rows]], atol=1e-5)
        for key in ("actor/grad_norm", "actor/param_norm"):
            assert report["metrics"][key] == pytest.approx(expected[key], rel=1e-5), key
    before = dict(base.named_parameters())
    for name, param in single.named_parameters():
        assert torch.allclose(reports[0]["params"][name], param, atol=1e-5), name
        assert not torch.equal(param, before[name]), name

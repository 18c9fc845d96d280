import math

import pytest
import torch

from hybridflow.losses import LOSS_AGG_MODES, agg_loss, kl_penalty
from hybridflow.plugins import get_policy_loss
from hybridflow.workers.train_step import global_counts

# two sequences: lengths 2 and 1 (T = 3)
L = torch.tensor([[1.0, 3.0, 100.0], [4.0, 100.0, 100.0]])
M = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token-mean", (1 + 3 + 4) / 3),
        ("token-sum", 1 + 3 + 4),
        ("token-mean-local", (1 + 3 + 4) / 3),
        ("seq-mean-token-sum", ((1 + 3) + 4) / 2),
        ("seq-mean-token-mean", ((1 + 3) / 2 + 4 / 1) / 2),
        ("seq-mean-token-sum-norm", ((1 + 3) + 4) / (2 * 3)),
    ],
)
def test_agg_modes_hand_computed(mode, expected):
    assert agg_loss(L, M, mode).item() == pytest.approx(expected)


SPLIT_INVARIANT = [m for m in LOSS_AGG_MODES if m != "token-mean-local"]  # TRL's bnpo depends on the split by design


@pytest.mark.parametrize("mode", SPLIT_INVARIANT)
def test_micro_batch_shares_add_up_to_the_global_value(mode):
    gen = torch.Generator().manual_seed(0)
    losses = torch.randn(8, 5, generator=gen)
    mask = (torch.arange(5) < torch.randint(1, 6, (8,), generator=gen)[:, None]).float()
    whole = agg_loss(losses, mask, mode)
    counts = {"num_tokens": mask.sum().item(), "num_seqs": 8.0, "norm_len": 5.0}
    parts = sum(agg_loss(losses[i : i + 2], mask[i : i + 2], mode, **counts) for i in range(0, 8, 2))
    assert parts.item() == pytest.approx(whole.item(), rel=1e-6)


def twelve_rows_one_fully_masked(seed=0):
    gen = torch.Generator().manual_seed(seed)
    losses = torch.randn(12, 4, generator=gen, dtype=torch.float64)
    mask = (torch.arange(4) < torch.randint(1, 5, (12,), generator=gen)[:, None]).double()
    mask[5] = 0  # e.g. a response dropped by rollout correction
    return losses, mask


def verl_seq_mean(losses, mask, mode, norm_len=None):
    """veRL 0.9's seq-mean-* modes, one row at a time: only rows with a valid token are sequences."""
    rows = [(row, m) for row, m in zip(losses.tolist(), mask.tolist()) if sum(m) > 0]
    if mode == "seq-mean-token-mean":
        per_seq = [sum(a * b for a, b in zip(row, m)) / sum(m) for row, m in rows]
    else:
        per_seq = [sum(a * b for a, b in zip(row, m)) / (norm_len or 1) for row, m in rows]
    return sum(per_seq) / len(rows)


@pytest.mark.parametrize("mode", ["seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_seq_mean_modes_ignore_fully_masked_rows_as_verl_does(mode):
    losses, mask = twelve_rows_one_fully_masked()
    norm_len = 4.0 if mode.endswith("norm") else None
    expected = verl_seq_mean(losses, mask, mode, norm_len)
    assert agg_loss(losses, mask, mode).item() == pytest.approx(expected)
    # dividing by all 12 rows (the old behaviour) would be off by 12/11
    all_rows = agg_loss(losses, mask, mode, num_seqs=12.0).item()
    assert all_rows == pytest.approx(expected * 11 / 12)
    _, num_seqs = global_counts(mask, None)
    assert num_seqs == 11.0
    parts = sum(agg_loss(losses[i : i + 3], mask[i : i + 3], mode, num_seqs=num_seqs) for i in range(0, 12, 3))
    assert parts.item() == pytest.approx(expected)


def test_global_counts_count_tokens_and_nonempty_sequences():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert global_counts(mask, None) == (3.0, 2.0)


def trl_micro_batches(seed=1, processes=2, steps=2, rows=3):
    gen = torch.Generator().manual_seed(seed)
    losses = torch.randn(processes, steps, rows, 5, generator=gen, dtype=torch.float64)
    mask = (torch.arange(5) < torch.randint(1, 6, (processes, steps, rows), generator=gen)[..., None]).double()
    return losses, mask


def test_trl_dapo_is_our_token_mean():
    # TRL dapo: each (process, step) micro-batch's loss is sum(m L) / (N_global / P); DDP averages the P processes
    losses, mask = trl_micro_batches()
    P, K = losses.shape[:2]
    n_global = mask.sum().item()
    trl = sum((losses[p, k] * mask[p, k]).sum() / (n_global / P) for p in range(P) for k in range(K)) / P
    ours = sum(
        agg_loss(losses[p, k], mask[p, k], "token-mean", num_tokens=n_global) for p in range(P) for k in range(K)
    )
    assert ours.item() == pytest.approx(trl.item())


def test_trl_bnpo_is_our_token_mean_local():
    # TRL bnpo: each micro-batch's own token mean, / K accumulation steps, averaged over P processes
    losses, mask = trl_micro_batches()
    P, K = losses.shape[:2]
    trl = sum((losses[p, k] * mask[p, k]).sum() / mask[p, k].sum() / K for p in range(P) for k in range(K)) / P
    _, num_seqs = global_counts(mask.reshape(-1, 5), None)
    ours = sum(
        agg_loss(losses[p, k], mask[p, k], "token-mean-local", num_seqs=num_seqs) for p in range(P) for k in range(K)
    )
    assert ours.item() == pytest.approx(trl.item())
    whole = agg_loss(losses.reshape(-1, 5), mask.reshape(-1, 5), "token-mean-local")
    assert whole.item() != pytest.approx(trl.item())  # unlike every other mode, it depends on the split


def test_agg_errors():
    with pytest.raises(ValueError, match="unknown loss_agg_mode 'mean'; allowed: token-mean"):
        agg_loss(L, M, "mean")
    with pytest.raises(ValueError, match="must be equal"):
        agg_loss(L, M[:, :2], "token-mean")


def test_kl_penalties_hand_computed():
    lp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    d = [0.5, -1.0]
    assert kl_penalty(lp, ref, "k1").tolist() == pytest.approx(d)
    assert kl_penalty(lp, ref, "abs").tolist() == pytest.approx([0.5, 1.0])
    assert kl_penalty(lp, ref, "mse").tolist() == pytest.approx([0.125, 0.5])
    assert kl_penalty(lp, ref, "low_var_kl").tolist() == pytest.approx([math.exp(-x) - 1 + x for x in d])
    assert torch.equal(kl_penalty(lp, ref, "k3"), kl_penalty(lp, ref, "low_var_kl"))
    with pytest.raises(ValueError, match="unknown kl penalty 'k4'"):
        kl_penalty(lp, ref, "k4")


@pytest.mark.parametrize("kind,base", [("k1+", "k1"), ("k2+", "k2"), ("k3+", "k3")])
def test_plus_estimators_have_the_base_value_and_the_k2_gradient(kind, base):
    ref = torch.tensor([-1.5, -1.0, -0.2], dtype=torch.float64)
    lp = torch.tensor([-1.0, -2.0, -0.2], dtype=torch.float64, requires_grad=True)
    value = kl_penalty(lp, ref, kind)
    assert torch.allclose(value, kl_penalty(lp, ref, base))
    (grad,) = torch.autograd.grad(value.sum(), lp)
    # d (d^2 / 2) / d log pi = d = log pi - log pi_ref: 0.5, -1.0, 0.0
    assert grad.tolist() == pytest.approx([0.5, -1.0, 0.0])
    if kind == "k3+":  # k3's own gradient, 1 - exp(-d), differs: the straight-through really swaps it
        (own,) = torch.autograd.grad(kl_penalty(lp, ref, "k3").sum(), lp)
        assert own.tolist() == pytest.approx([1 - math.exp(-0.5), 1 - math.exp(1.0), 0.0])


def test_k3_is_clamped():
    assert kl_penalty(torch.tensor([50.0]), torch.tensor([0.0]), "k3").item() == 10.0


def test_ppo_clip_cases_hand_computed():
    fn = get_policy_loss("vanilla").fn
    old = torch.zeros(1, 4)
    ratios = torch.tensor([[1.1, 1.5, 0.5, 10.0]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    losses, metrics = fn(old, ratios.log(), adv, torch.ones(1, 4))
    # in range: -A r ; A>0 above 1.2: -1.2 ; A<0 below 0.8: max(0.5, 0.8) = 0.8 ; A<0 huge: dual clip at 3
    assert losses.tolist()[0] == pytest.approx([-1.1, -1.2, 0.8, 3.0])
    assert metrics["pg_clipfrac"] == pytest.approx(2 / 4)  # tokens 2 and 3 clipped; token 4 is the dual clip
    assert metrics["pg_clipfrac_lower"] == pytest.approx(1 / 4)
    assert metrics["ppo_kl"] == pytest.approx(-sum(math.log(r) for r in [1.1, 1.5, 0.5, 10.0]) / 4)


def test_ppo_gradient_inside_and_outside_the_clip():
    fn = get_policy_loss("vanilla").fn
    log_probs = torch.tensor([[math.log(1.1), math.log(1.5)]], requires_grad=True)
    losses, _ = fn(torch.zeros(1, 2), log_probs, torch.tensor([[2.0, 2.0]]), torch.ones(1, 2))
    losses.sum().backward()
    # d(-A r)/d log r = -A r inside the range; zero once clipped
    assert log_probs.grad.tolist()[0] == pytest.approx([-2.2, 0.0])


def test_ppo_rejects_bad_dual_clip():
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1.0"):
        get_policy_loss("vanilla").fn(
            torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), clip_ratio_c=0.5
        )
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1.0"):  # 1 itself would clip everything
        get_policy_loss("vanilla").fn(
            torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), clip_ratio_c=1.0
        )


def test_gspo_sequence_ratio_and_gradient():
    fn = get_policy_loss("gspo").fn
    old = torch.zeros(2, 3)
    new = torch.tensor([[0.2, -0.1, 5.0], [0.0, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    losses, _ = fn(old, new, adv, mask, clip_ratio_low=0.5, clip_ratio_high=0.5)
    s0 = math.exp((0.2 - 0.1) / 2)  # geometric mean over the 2 valid tokens; the masked 5.0 is ignored
    assert losses[0, :2].tolist() == pytest.approx([-s0, -s0])
    assert losses[1].tolist() == pytest.approx([1.0, 1.0, 1.0])
    (losses * mask).sum().backward()
    assert new.grad[0, :2].tolist() == pytest.approx([-s0, -s0])  # token-level gradient scaled by s_i


def test_builtin_losses_are_plugins_from_hybridflow():
    from hybridflow.plugins.manager import POLICY_LOSSES, get_plugin_manager

    registry = get_plugin_manager().registry(POLICY_LOSSES)
    assert {"vanilla", "gspo"} <= set(registry.names())
    assert registry.by_name["vanilla"][0].source.distribution == "hybridflow"


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_one_valid_token_is_its_own_mean(mode):
    # a batch with a single valid token: every mean of it is that token's loss (no count is rounded up to 2)
    losses, mask = torch.tensor([[3.0, 5.0], [7.0, 9.0]]), torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    assert agg_loss(losses, mask, mode).item() == pytest.approx(3.0)

"""The catalogue policy losses against per-token references in float64, and their gradients.

References are written from each paper's / veRL 0.9's formula, one token at a
time with ``math``; gradients are derived by hand (d loss / d log pi) and
compared with ``torch.autograd.grad``, which is where a missing stop-gradient
shows.
"""

import math

import pytest
import torch

from hybridflow.plugins import get_policy_loss
from hybridflow.plugins.listing import format_plugin_table
from hybridflow.plugins.manager import POLICY_LOSSES, get_plugin_manager

CATALOGUE = ["dppo_tv", "dppo_kl", "gpg", "cispo", "dro", "sapo", "geo_mean", "clip_cov", "kl_cov"]
ALL = ["vanilla", "gspo", *CATALOGUE]
NEEDED_OPTIONS = {"dro": {"dro_beta": 0.3}}


def loss(name, old, new, adv, mask=None, **opts):
    fn = get_policy_loss(name).fn
    mask = torch.ones_like(new) if mask is None else mask
    return fn(old, new, adv, mask, **{**NEEDED_OPTIONS.get(name, {}), **opts})


def leaf(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


def grad_of(token_losses, log_probs, mask=None):
    weights = torch.ones_like(token_losses) if mask is None else mask
    (grad,) = torch.autograd.grad((token_losses * weights).sum(), log_probs)
    return grad


def random_case(seed, rows=4, length=5):
    gen = torch.Generator().manual_seed(seed)
    old = torch.log(torch.rand(rows, length, generator=gen, dtype=torch.float64) * 0.9 + 0.05)
    new = (old + 0.4 * torch.randn(rows, length, generator=gen, dtype=torch.float64)).clamp(max=-1e-3)
    adv = torch.randn(rows, length, generator=gen, dtype=torch.float64)
    mask = (torch.arange(length) < torch.randint(2, length + 1, (rows,), generator=gen)[:, None]).double()
    return old, new.requires_grad_(), adv, mask


def per_token(fn, old, new, adv):
    return [
        [fn(o, n, a) for o, n, a in zip(ro, rn, ra)] for ro, rn, ra in zip(old.tolist(), new.tolist(), adv.tolist())
    ]


def assert_close(actual, expected, atol=1e-9):
    expected = torch.as_tensor(expected, dtype=torch.float64)
    assert torch.allclose(actual.detach().double(), expected, atol=atol), (actual, expected)


# ------------------------------------------------------------------- CISPO
def test_cispo_value_and_gradient_outside_the_clip():
    old = torch.zeros(1, 3, dtype=torch.float64)
    new = leaf([[math.log(1.1), math.log(1.5), math.log(0.5)]])
    adv = torch.tensor([[1.0, 2.0, -1.0]], dtype=torch.float64)
    losses, metrics = loss("cispo", old, new, adv)
    clipped = [1.1, 1.2, 0.8]
    assert_close(losses, [[-c * a * lp for c, a, lp in zip(clipped, [1, 2, -1], new[0].tolist())]])
    # d/d log pi = -sg[clip(r)] * A: never zero, even where PPO's clip would zero it (tokens 2 and 3)
    assert_close(grad_of(losses, new), [[-1.1, -2.4, 0.8]])
    assert metrics["pg_clipfrac"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("seed", range(3))
def test_cispo_matches_reference(seed):
    old, new, adv, mask = random_case(seed)
    losses, _ = loss("cispo", old, new, adv, mask, clip_ratio_low=0.3, clip_ratio_high=0.1)
    ref = per_token(lambda o, n, a: -min(max(math.exp(n - o), 0.7), 1.1) * a * n, old, new, adv)
    assert_close(losses, ref)
    grad = per_token(lambda o, n, a: -min(max(math.exp(n - o), 0.7), 1.1) * a, old, new, adv)
    assert_close(grad_of(losses, new, mask), torch.tensor(grad) * mask)


# -------------------------------------------------------------------- DPPO
def ref_dppo(o, n, a, low, high, c, region):
    keep = region(math.exp(n), math.exp(o), a, low, high)
    return -a * min(math.exp(n - o), c) * n * keep, -a * min(math.exp(n - o), c) * keep


def tv(p, q, a, low, high):
    return float(p - q <= high) if a > 0 else float(p - q >= -low)


def binary_kl(p, q, a, low, high):
    d = q * math.log(q / p) + (1 - q) * math.log((1 - q + 1e-8) / (1 - p + 1e-8))
    return float(d <= high or p <= q) if a > 0 else float(d <= low or p >= q)


def test_dppo_tv_hand_computed_cases():
    # old p = 0.5 everywhere; new p: 0.6 (A>0, moved 0.1 < 0.15: kept), 0.7 (A>0, moved 0.2: dropped),
    # 0.3 (A<0, moved -0.2: dropped), 0.4 (A<0, moved -0.1: kept)
    old = torch.full((1, 4), math.log(0.5), dtype=torch.float64)
    new = leaf([[math.log(0.6), math.log(0.7), math.log(0.3), math.log(0.4)]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    losses, metrics = loss("dppo_tv", old, new, adv)
    keep = [1, 0, 0, 1]
    ratios = [1.2, 1.4, 0.6, 0.8]
    assert_close(losses, [[-a * r * lp * k for a, r, lp, k in zip([1, 1, -1, -1], ratios, new[0].tolist(), keep)]])
    # the truncated ratio is an importance weight, not a surrogate: d/d log pi = -A * min(r, c) * keep
    assert_close(grad_of(losses, new), [[-1.2, 0.0, 0.0, 0.8]])
    assert metrics["pg_clipfrac"] == pytest.approx(0.5)


def test_dppo_truncates_the_ratio_without_a_gradient_through_it():
    old = torch.full((1, 2), math.log(0.01), dtype=torch.float64)
    new = leaf([[math.log(0.05), math.log(0.012)]])  # ratios 5 (truncated at c = 2) and 1.2
    adv = torch.ones(1, 2, dtype=torch.float64)
    losses, metrics = loss("dppo_tv", old, new, adv, clip_ratio_c=2.0)
    assert_close(grad_of(losses, new), [[-2.0, -1.2]])
    assert metrics["pg_clipfrac_lower"] == pytest.approx(0.5)


@pytest.mark.parametrize("name,region,low,high", [("dppo_tv", tv, 0.15, 0.15), ("dppo_kl", binary_kl, 0.05, 0.05)])
@pytest.mark.parametrize("seed", range(4))
def test_dppo_matches_reference(name, region, low, high, seed):
    old, new, adv, mask = random_case(seed)
    losses, _ = loss(name, old, new, adv, mask, clip_ratio_c=3.0)
    pairs = per_token(lambda o, n, a: ref_dppo(o, n, a, low, high, 3.0, region), old, new, adv)
    assert_close(losses, [[v for v, _ in row] for row in pairs])
    assert_close(grad_of(losses, new, mask), torch.tensor([[g for _, g in row] for row in pairs]) * mask)
    kept = torch.tensor([[g != 0 for _, g in row] for row in pairs])
    assert 0 < kept.sum() < kept.numel()  # the case exercises both sides of the trust region


def test_dppo_kl_keeps_moves_against_the_advantage():
    # p_old = 0.5: A>0 and p falls to 0.1 (a huge binary KL, but the wrong direction to exploit): kept;
    # A>0 and p rises to 0.8 (KL 0.22 > 0.05): dropped; A<0 and p rises to 0.9: kept
    old = torch.full((1, 3), math.log(0.5), dtype=torch.float64)
    new = leaf([[math.log(0.1), math.log(0.8), math.log(0.9)]])
    losses, metrics = loss("dppo_kl", old, new, torch.tensor([[1.0, 1.0, -1.0]], dtype=torch.float64))
    assert_close(grad_of(losses, new), [[-0.2, 0.0, 1.8]])
    assert metrics["pg_clipfrac"] == pytest.approx(1 / 3)  # the share dropped (one of three), not the share kept


# -------------------------------------------------------------------- GSPO
def test_gspo_gradient_is_token_level_through_the_stop_gradient():
    old = torch.zeros(2, 3, dtype=torch.float64)
    new = leaf([[0.01, -0.02, 0.04], [0.5, 0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([[2.0] * 3, [1.0] * 3], dtype=torch.float64)
    losses, _ = loss("gspo", old, new, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
    s0 = math.exp(0.01)  # geometric mean ratio of row 0 (inside the clip); row 1: e^0.5 > 1.2, clipped
    assert_close(losses[0], [-2 * s0] * 3)
    assert_close(losses[1, :2], [-1.2, -1.2])
    # d (sum_t loss_t) / d log pi_t = -A s_i: each token's own, scaled by sg[s_i]; 0 for the clipped row.
    # Without the stop-gradient on s_i it would be -A s_i (1 + 1): s_i's own derivative adds s_i / |y| per token.
    assert_close(grad_of(losses, new, mask), [[-2 * s0] * 3, [0.0, 0.0, 0.0]])


# ---------------------------------------------------------- GPG, DRO, SAPO
@pytest.mark.parametrize("seed", range(3))
def test_gpg_dro_sapo_match_references(seed):
    old, new, adv, mask = random_case(seed)
    cases = {
        "gpg": ({}, lambda o, n, a: -a * n, lambda o, n, a: -a),
        "dro": ({"dro_beta": 0.7}, lambda o, n, a: -(a * n - 0.35 * (n - o) ** 2), lambda o, n, a: -a + 0.7 * (n - o)),
        "sapo": (
            {"tau_pos": 1.5, "tau_neg": 3.0},
            lambda o, n, a: -sapo_gate(math.exp(n - o), 1.5 if a > 0 else 3.0) * a,
            lambda o, n, a: -a * sapo_slope(math.exp(n - o), 1.5 if a > 0 else 3.0) * math.exp(n - o),
        ),
    }
    for name, (opts, value, slope) in cases.items():
        losses, _ = loss(name, old, new, adv, mask, **opts)
        assert_close(losses, per_token(value, old, new, adv))
        assert_close(grad_of(losses, new, mask), torch.tensor(per_token(slope, old, new, adv)) * mask)


def sapo_gate(r, tau):
    return 1 / (1 + math.exp(-tau * (r - 1))) * 4 / tau


def sapo_slope(r, tau):
    s = 1 / (1 + math.exp(-tau * (r - 1)))
    return 4 * s * (1 - s)


def test_sapo_is_the_policy_gradient_at_ratio_one():
    new = leaf([[-1.0, -2.0]])
    losses, _ = loss("sapo", new.detach().clone(), new, torch.tensor([[1.0, -2.0]], dtype=torch.float64))
    assert_close(losses, [[-2.0, 2 * 2 / 1.05]])  # f(1) = 2 / tau
    assert_close(grad_of(losses, new), [[-1.0, 2.0]])  # f'(1) * r = 1


def test_dro_needs_a_positive_beta():
    fn = get_policy_loss("dro").fn
    with pytest.raises(ValueError, match="needs a positive dro_beta"):
        fn(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1))


# -------------------------------------------------------------------- GMPO
def ref_geo_mean(old, new, adv, mask, low, high):
    out = []
    for o, n, a, m in zip(old.tolist(), new.tolist(), adv.tolist(), mask.tolist()):
        length = sum(m) + 1e-8
        logs = []
        for ot, nt, at, mt in zip(o, n, a, m):
            d = nt - ot
            sgn = (at > 0) - (at < 0)
            clipped = min(max(d, -low), high)
            logs.append(sgn * min(sgn * d, sgn * clipped) * mt)
        seq_adv = sum(at * mt for at, mt in zip(a, m)) / length
        out.append(-seq_adv * math.exp(sum(logs) / length))
    return out


@pytest.mark.parametrize("seed", range(3))
def test_geo_mean_matches_reference_and_is_one_loss_per_sequence(seed):
    old, new, adv, mask = random_case(seed)
    adv = adv[:, :1].expand_as(adv).contiguous()  # GMPO is defined for a sequence-level advantage
    losses, _ = loss("geo_mean", old, new, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.3)
    ref = ref_geo_mean(old, new, adv, mask, 0.2, 0.3)
    assert_close(losses, torch.tensor(ref)[:, None].expand_as(losses))


def test_geo_mean_gradient_skips_the_clipped_tokens():
    # A > 0: a token above the clip contributes no gradient; the others d L / d log pi_t = -A rho / |y|
    old = torch.zeros(1, 3, dtype=torch.float64)
    new = leaf([[0.1, 0.9, -0.2]])
    adv = torch.ones(1, 3, dtype=torch.float64)
    losses, metrics = loss("geo_mean", old, new, adv, clip_ratio_low=0.4, clip_ratio_high=0.4)
    rho = math.exp((0.1 + 0.4 - 0.2) / 3)
    assert_close(losses[0, 0], -rho, atol=1e-7)
    (grad,) = torch.autograd.grad(losses[0, 0], new)
    assert_close(grad, [[-rho / 3, 0.0, -rho / 3]], atol=1e-7)
    assert metrics["pg_clipfrac"] == pytest.approx(1 / 3)


# ---------------------------------------------------------- Clip-Cov, KL-Cov
def test_clip_cov_detaches_the_high_covariance_token():
    # one token (A = 3 with the largest log-prob) has cov in (lb, ub); ratio 1 everywhere, so nothing is PPO-clipped
    new = leaf([[-0.1, -2.0, -2.0, -1.5]])
    adv = torch.tensor([[3.0, 0.0, 0.0, -1.0]], dtype=torch.float64)
    cov = [(a - 0.5) * (lp - (-1.4)) for a, lp in zip([3.0, 0.0, 0.0, -1.0], [-0.1, -2.0, -2.0, -1.5])]
    assert 1.0 < cov[0] < 5.0 and all(not 1.0 < c < 5.0 for c in cov[1:])
    losses, metrics = loss("clip_cov", new.detach().clone(), new, adv)
    assert_close(losses, [[0.0, 0.0, 0.0, 1.0]])
    assert_close(grad_of(losses, new), [[0.0, 0.0, 0.0, 1.0]])  # -A r for the rest, nothing for the detached one
    assert metrics["pg_clipfrac"] == pytest.approx(0.25)


def test_clip_cov_drops_the_configured_share_among_candidates():
    torch.manual_seed(0)
    old, new, adv, _ = random_case(4, rows=8, length=25)
    adv = adv * 4
    base, _ = loss("clip_cov", old, new, adv, clip_cov_ratio=1e-9, clip_cov_lb=1e9)  # no candidate at all
    losses, metrics = loss("clip_cov", old, new, adv, clip_cov_ratio=0.05, clip_cov_lb=0.2, clip_cov_ub=50.0)
    dropped = (losses == 0) & (base != 0)
    assert dropped.sum() == int(0.05 * 200) and metrics["pg_clipfrac"] == pytest.approx(10 / 200)
    assert torch.equal(losses[~dropped], base[~dropped])


def test_kl_cov_matches_reference():
    old, new, adv, mask = random_case(2, rows=6, length=10)
    losses, metrics = loss("kl_cov", old, new, adv, mask, kl_cov_ratio=0.1, ppo_kl_coef=0.5)
    valid = [(i, t) for i in range(6) for t in range(10) if mask[i, t]]
    a = [adv[i, t].item() for i, t in valid]
    lp = [new[i, t].item() for i, t in valid]
    mean_a, mean_lp = sum(a) / len(a), sum(lp) / len(lp)
    cov = [(x - mean_a) * (y - mean_lp) for x, y in zip(a, lp)]
    top = sorted(range(len(cov)), key=lambda k: -cov[k])[: max(1, int(len(cov) * 0.1))]
    expected = [
        [-adv[i, t].item() * math.exp(new[i, t].item() - old[i, t].item()) for t in range(10)] for i in range(6)
    ]
    for k in top:
        i, t = valid[k]
        expected[i][t] += 0.5 * abs(new[i, t].item() - old[i, t].item())
    assert_close(losses, expected)
    assert metrics["ppo_kl"] == pytest.approx(
        sum(abs(new[i, t].item() - old[i, t].item()) for i, t in valid) / len(valid)
    )


# -------------------------------------------------------- every loss, the same way
@pytest.mark.parametrize("name", ALL)
def test_rollout_is_weights_multiply_the_token_losses_and_carry_no_gradient(name):
    torch.manual_seed(0)
    old, new, adv, mask = random_case(6)
    weights = (torch.rand_like(old) + 0.5).requires_grad_()
    plain, _ = loss(name, old, new, adv, mask)
    torch.manual_seed(0)
    weighted, _ = loss(name, old, new, adv, mask, rollout_is_weights=weights)
    if name == "geo_mean":  # a sequence loss: weighted by the geometric mean of its tokens' weights
        geo = torch.exp((torch.log(weights.detach() + 1e-10) * mask).sum(-1) / (mask.sum(-1) + 1e-8))
        assert_close(weighted, plain * geo[:, None])
    else:
        assert_close(weighted, plain * weights.detach())
    assert torch.autograd.grad((weighted * mask).sum(), weights, allow_unused=True)[0] is None


@pytest.mark.parametrize("name", ALL)
def test_rollout_is_weights_is_a_runtime_input_not_an_option(name):
    entry = get_policy_loss(name)
    assert "rollout_is_weights" not in entry.options
    assert entry.fn.__kwdefaults__["rollout_is_weights"] is None


def test_catalogue_losses_are_builtin_plugins_listed_with_summaries():
    registry = get_plugin_manager().registry(POLICY_LOSSES)
    assert set(ALL) <= set(registry.names())
    listing = format_plugin_table(get_plugin_manager(), verbose=True)
    for name in CATALOGUE:
        assert registry.by_name[name][0].source.distribution == "hybridflow"
        line = next(line for line in listing.splitlines() if line.strip().startswith(f"{name}("))
        assert "(no docstring)" not in line and len(line.split("): ", 1)[1]) > 20, line


# ----------------------------------------------------- the defaults, by what they do (veRL's numbers)
def test_clip_cov_defaults_drop_a_token_whose_covariance_is_between_1_and_5():
    # A = (1.5, -1.5), log pi = (-1, -3): both covariances are 1.5 x 1 = 1.5; one of the two is dropped (at least 1)
    new = leaf([[-1.0, -3.0]])
    _, metrics = loss("clip_cov", new.detach().clone(), new, torch.tensor([[1.5, -1.5]], dtype=torch.float64))
    assert metrics["pg_clipfrac"] == pytest.approx(0.5)
    # A = (1, -1): covariances exactly 1, not above the lower bound: nothing is dropped
    _, metrics = loss("clip_cov", new.detach().clone(), new, torch.tensor([[1.0, -1.0]], dtype=torch.float64))
    assert metrics["pg_clipfrac"] == 0.0


def test_clip_cov_clips_the_ratio_at_one_minus_0_2_below():
    # A = -1, r = 0.5: pg1 = 0.5, pg2 = -A clip(0.5, 0.8, 1.2) = 0.8, the larger one counts
    old = torch.zeros(1, 1, dtype=torch.float64)
    losses, _ = loss("clip_cov", old, leaf([[math.log(0.5)]]), -torch.ones(1, 1, dtype=torch.float64), clip_cov_lb=1e9)
    assert_close(losses, [[0.8]])


def test_geo_mean_clips_at_0_4_by_default():
    # A > 0: the token at +0.5 in log space is past the default 0.4 and clipped; the other two are not
    old = torch.zeros(1, 3, dtype=torch.float64)
    _, metrics = loss("geo_mean", old, leaf([[0.1, 0.5, -0.3]]), torch.ones(1, 3, dtype=torch.float64))
    assert metrics["pg_clipfrac"] == pytest.approx(1 / 3)


def test_gspo_clips_the_sequence_ratio_at_one_minus_3e_4_below():
    # A = -1 and a sequence ratio of exp(-0.01) < 1 - 3e-4: the clipped term, -A (1 - 3e-4), is the larger one
    old = torch.zeros(1, 2, dtype=torch.float64)
    losses, _ = loss("gspo", old, leaf([[-0.01, -0.01]]), -torch.ones(1, 2, dtype=torch.float64))
    assert_close(losses, [[1 - 3e-4, 1 - 3e-4]], atol=1e-12)


def test_geo_mean_counts_clips_under_a_negative_advantage_as_lower():
    # A < 0: the token at -0.5 in log space is past the 0.4 clip; it counts as pg_clipfrac_lower, not pg_clipfrac
    old = torch.zeros(1, 3, dtype=torch.float64)
    _, metrics = loss("geo_mean", old, leaf([[0.1, -0.5, -0.3]]), -torch.ones(1, 3, dtype=torch.float64))
    assert metrics["pg_clipfrac_lower"] == pytest.approx(1 / 3) and metrics["pg_clipfrac"] == 0.0


def test_dppo_counts_the_truncated_ratios_among_the_kept_tokens():
    # ratios 5 and 3 pass c = 2 (truncated), 1.2 does not: two of three
    old = torch.full((1, 3), math.log(0.01), dtype=torch.float64)
    new = leaf([[math.log(0.05), math.log(0.03), math.log(0.012)]])
    _, metrics = loss("dppo_tv", old, new, torch.ones(1, 3, dtype=torch.float64), clip_ratio_c=2.0)
    assert metrics["pg_clipfrac_lower"] == pytest.approx(2 / 3)


def test_clip_cov_leaves_tokens_above_the_upper_covariance_bound():
    # both covariances are 1.5 (as above): past an upper bound of 1.2, neither is a candidate
    new = leaf([[-1.0, -3.0]])
    adv = torch.tensor([[1.5, -1.5]], dtype=torch.float64)
    _, metrics = loss("clip_cov", new.detach().clone(), new, adv, clip_cov_ub=1.2)
    assert metrics["pg_clipfrac"] == 0.0


def test_gspo_caps_the_sequence_log_ratio_at_10():
    # a sequence log-ratio of 12 under A = -1: the unclipped term, capped at e^10, is the larger one
    old = torch.zeros(1, 2, dtype=torch.float64)
    losses, _ = loss("gspo", old, leaf([[12.0, 12.0]]), -torch.ones(1, 2, dtype=torch.float64))
    assert_close(losses, [[math.exp(10.0), math.exp(10.0)]], atol=1e-6)


def test_clip_cov_takes_the_larger_ppo_term_on_both_sides_of_the_band():
    old = torch.zeros(1, 2, dtype=torch.float64)
    new = leaf([[math.log(1.5), math.log(1.5)]])  # r = 1.5, past 1 + 0.2
    adv = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    losses, _ = loss("clip_cov", old, new, adv, clip_cov_lb=1e9)
    # A = 1: max(-1.5, -1.2) = -1.2 (clipped); A = -1: max(1.5, 1.2) = 1.5 (unclipped)
    assert_close(losses, [[-1.2, 1.5]])
    for bad in (0, -0.1):
        with pytest.raises(ValueError, match=f"clip_cov_ratio must be > 0, got {bad}"):
            loss("clip_cov", old, new, adv, clip_cov_ratio=bad)


def test_gspo_counts_only_the_binding_clips():
    # A = 1 and a sequence ratio of 0.9, below the band: the clipped term is the smaller one, so it is not a clip
    old = torch.zeros(1, 2, dtype=torch.float64)
    _, metrics = loss("gspo", old, leaf([[math.log(0.9)] * 2]), torch.ones(1, 2, dtype=torch.float64))
    assert metrics["pg_clipfrac"] == 0.0
    _, metrics = loss("gspo", old, leaf([[math.log(1.1)] * 2]), torch.ones(1, 2, dtype=torch.float64))
    assert metrics["pg_clipfrac"] == 1.0  # above it, the clip binds


def test_clip_cov_reports_the_kl_of_the_old_policy_from_the_new():
    old = torch.zeros(1, 2, dtype=torch.float64)
    _, metrics = loss("clip_cov", old, leaf([[0.1, 0.3]]), torch.ones(1, 2, dtype=torch.float64), clip_cov_lb=1e9)
    assert metrics["ppo_kl"] == pytest.approx(-0.2)  # mean of log pi_old - log pi


def test_log_ratios_are_clamped_to_plus_minus_20():
    from hybridflow.losses.functional import clamped_log_ratio

    new = torch.tensor([[-30.0, 25.0, 3.0]], dtype=torch.float64)
    assert clamped_log_ratio(new, torch.zeros_like(new)).tolist() == [[-20.0, 20.0, 3.0]]


def test_sapo_reports_the_kl_of_the_old_policy_from_the_new():
    old = torch.zeros(1, 2, dtype=torch.float64)
    _, metrics = loss("sapo", old, leaf([[0.1, 0.3]]), torch.ones(1, 2, dtype=torch.float64))
    assert metrics["ppo_kl"] == pytest.approx(-0.2)  # mean of log pi_old - log pi

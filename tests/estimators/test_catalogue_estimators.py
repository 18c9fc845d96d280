"""The catalogue estimators (grpo_passk, gdpo, remax, opo, gpg, the optimal token baselines) and their declarations.

Every reference below is written from the formula in the estimator's paper /
veRL 0.9's ``core_algos.py``, one response (or one token) at a time, in plain
Python floats (float64), without calling the code under test. Group members
are never adjacent: groups are formed by equal uid, not by position.
"""

import math
import statistics

import numpy as np
import pytest
import torch

from hybridflow.core import DataProto
from hybridflow.estimators import compute_advantage
from hybridflow.plugins import AdvantageEstimator, get_estimator
from hybridflow.plugins.entries import GROUP_IDS, POLICY_SUM_PI_SQUARED
from hybridflow.plugins.listing import format_plugin_table
from hybridflow.plugins.manager import get_plugin_manager

CATALOGUE = ["grpo_passk", "gdpo", "remax", "opo", "gpg", "optimal_token_baseline", "tir_optimal_token_baseline"]


def make_batch(rewards, mask=None, uids=None, **extra):
    rewards = torch.tensor(rewards, dtype=torch.float32)
    mask = torch.ones_like(rewards) if mask is None else torch.tensor(mask, dtype=torch.float32)
    tensors = {"token_level_rewards": rewards, "response_mask": mask}
    tensors.update({k: torch.tensor(v, dtype=torch.float32) for k, v in extra.items()})
    return DataProto.from_dict(tensors, {"uid": uids or ["g"] * len(rewards)})


def otb_batch(rewards, mask, uids):
    """A batch for the optimal token baselines: pi = 0.5 and sum pi^2 = 0.5 at every token (w_t = 0.5)."""
    width = len(rewards[0])
    half = math.log(0.5)
    return make_batch(
        rewards,
        mask,
        uids=uids,
        old_log_probs=[[half] * width] * len(rewards),
        sum_pi_squared=[[0.5] * width] * len(rewards),
    )


def adv(data, name, **opts):
    out = compute_advantage(data, name, **opts)
    return out.batch["advantages"], out.batch["returns"]


def random_batch(seed, rows=12, length=6, groups=4, holes=False, empty_row=False, components=3):
    """Interleaved groups, outcome or dense rewards, every column the catalogue may need."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (rows,), generator=gen)
    mask = (torch.arange(length) < lengths[:, None]).float()
    if holes:  # observation tokens in the middle of a multi-turn response
        mask = mask * (torch.rand(rows, length, generator=gen) > 0.25).float()
        mask[:, 0] = 1
    if empty_row:
        mask[3] = 0
    rewards = torch.randn(rows, length, generator=gen) * mask
    probs = torch.softmax(torch.randn(rows, length, 5, generator=gen), -1)
    old_log_probs = probs[..., 0].log()
    sum_pi_squared = probs.square().sum(-1)
    uids = [f"p{i % groups}" for i in range(rows)]
    np.random.default_rng(seed).shuffle(uids)
    return DataProto.from_dict(
        {
            "token_level_rewards": rewards,
            "response_mask": mask,
            "reward_baselines": torch.randn(rows, generator=gen),
            "reward_components": torch.randint(0, 3, (rows, components), generator=gen).float(),
            "old_log_probs": old_log_probs,
            "sum_pi_squared": sum_pi_squared,
        },
        {"uid": uids},
    )


def cols(data, key):
    return data.batch[key].double().tolist()


def assert_close(actual, expected, atol=1e-5):
    expected = torch.tensor(expected, dtype=torch.float64)
    assert torch.allclose(actual.double(), expected, atol=atol), (actual, expected)


# ------------------------------------------------------------------ references
def groups_of(uids):
    out = {}
    for i, u in enumerate(uids):
        out.setdefault(u, []).append(i)
    return out


def ref_grpo_scalar(scores, uids, norm=True, eps=1e-6):
    out = []
    for i, u in enumerate(uids):
        members = [scores[j] for j in groups_of(uids)[u]]
        mean, std = (0.0, 1.0) if len(members) == 1 else (statistics.fmean(members), statistics.stdev(members))
        out.append((scores[i] - mean) / (std + eps) if norm else scores[i] - mean)
    return out


def ref_whiten_masked(matrix, mask):
    vals = [v for row, m in zip(matrix, mask) for v, k in zip(row, m) if k]
    mean, var = statistics.fmean(vals), statistics.variance(vals)
    return [[(v - mean) / math.sqrt(var + 1e-8) * k for v, k in zip(row, m)] for row, m in zip(matrix, mask)]


def ref_reward_to_go(rewards, mask):
    out = []
    for row, m in zip(rewards, mask):
        g, res = 0.0, [0.0] * len(row)
        for t in reversed(range(len(row))):
            g += row[t] * m[t]
            res[t] = g
        out.append(res)
    return out


def ref_passk(data, norm=True, eps=1e-6):
    scores = [sum(r) for r in cols(data, "token_level_rewards")]
    uids = list(data.non_tensor_batch["uid"])
    per_row = [0.0] * len(scores)
    for members in groups_of(uids).values():
        values = [scores[j] for j in members]
        best = max(range(len(members)), key=lambda k: (values[k], -k))  # first of the maxima
        runner_up = max(v for k, v in enumerate(values) if k != best)
        margin = values[best] - runner_up
        per_row[members[best]] = margin / (statistics.stdev(values) + eps) if norm else margin
    mask = cols(data, "response_mask")
    return [[a * k for k in m] for a, m in zip(per_row, mask)]


def ref_gdpo(data, weights=None, norm=True):
    comps = cols(data, "reward_components")
    uids = list(data.non_tensor_batch["uid"])
    mask = cols(data, "response_mask")
    weights = weights or [1.0] * len(comps[0])
    per_k = [ref_grpo_scalar([row[k] for row in comps], uids, norm) for k in range(len(weights))]
    mixed = [sum(w * per_k[k][i] for k, w in enumerate(weights)) for i in range(len(comps))]
    return ref_whiten_masked([[a * k for k in m] for a, m in zip(mixed, mask)], mask)


def ref_remax(data):
    mask = cols(data, "response_mask")
    returns = ref_reward_to_go(cols(data, "token_level_rewards"), mask)
    base = cols(data, "reward_baselines")
    return [[(g - b) * k for g, k in zip(row, m)] for row, b, m in zip(returns, base, mask)], returns


def ref_opo(data):
    scores = [sum(r) for r in cols(data, "token_level_rewards")]
    mask = cols(data, "response_mask")
    lengths = [sum(m) for m in mask]
    uids = list(data.non_tensor_batch["uid"])
    out = []
    for i, u in enumerate(uids):
        members = groups_of(uids)[u]
        b = (
            0.0
            if len(members) == 1
            else sum(lengths[j] * scores[j] for j in members) / sum(lengths[j] for j in members)
        )
        out.append([(scores[i] - b) * k for k in mask[i]])
    return out


def ref_gpg(data, f_norm=1.0):
    scores = [sum(r) for r in cols(data, "token_level_rewards")]
    alpha = len(scores) / max(sum(1 for s in scores if s != 0), 1)
    uids = list(data.non_tensor_batch["uid"])
    mask = cols(data, "response_mask")
    out = []
    for i, u in enumerate(uids):
        members = groups_of(uids)[u]
        mean = 0.0 if len(members) == 1 else statistics.fmean(scores[j] for j in members)
        out.append([alpha * (scores[i] - mean) / f_norm * k for k in mask[i]])
    return out


def ref_energy(data, is_weights=None):
    """W_{i,t} = sum_{s<=t} mask * (1 - 2 pi + S) * rho^2, one token at a time."""
    old, spi, mask = cols(data, "old_log_probs"), cols(data, "sum_pi_squared"), cols(data, "response_mask")
    out = []
    for i in range(len(mask)):
        acc, row = 0.0, []
        for t in range(len(mask[i])):
            rho2 = 1.0 if is_weights is None else is_weights[i][t] ** 2
            acc += mask[i][t] * (1 - 2 * math.exp(old[i][t]) + spi[i][t]) * rho2
            row.append(acc)
        out.append(row)
    return out


def ref_zero_tail(baseline, member_rows, lengths):
    """veRL's handle_zero_tail: a strictly longest member's baseline is zero from the second-longest length on."""
    ordered = sorted(lengths[j] for j in member_rows)
    longest = [j for j in member_rows if lengths[j] == ordered[-1]]
    if len(longest) == 1 and ordered[-1] > ordered[-2]:
        for t in range(int(ordered[-2]), len(baseline[longest[0]])):
            baseline[longest[0]][t] = 0.0


def ref_otb(data, zero_tail=True, is_weights=None, eps=1e-8):
    mask = cols(data, "response_mask")
    returns = ref_reward_to_go(cols(data, "token_level_rewards"), mask)
    energy = ref_energy(data, is_weights)
    uids = list(data.non_tensor_batch["uid"])
    lengths = [sum(m) for m in mask]
    T = len(mask[0])
    baseline = [[0.0] * T for _ in mask]
    for members in groups_of(uids).values():
        if len(members) == 1:
            continue
        for t in range(T):
            num = sum(returns[j][t] * energy[j][t] * mask[j][t] for j in members)
            den = sum(energy[j][t] * mask[j][t] for j in members) + eps
            for j in members:
                baseline[j][t] = num / den
        if zero_tail:
            ref_zero_tail(baseline, members, lengths)
    adv = [[(g - b) * k for g, b, k in zip(returns[i], baseline[i], mask[i])] for i in range(len(mask))]
    return adv, returns


def ref_tir_otb(data, zero_tail=True, eps=1e-8):
    mask = cols(data, "response_mask")
    returns = ref_reward_to_go(cols(data, "token_level_rewards"), mask)
    energy = ref_energy(data)
    uids = list(data.non_tensor_batch["uid"])
    positions = [[t for t, k in enumerate(m) if k] for m in mask]
    lengths = [len(p) for p in positions]
    packed_g = [[returns[i][t] for t in p] for i, p in enumerate(positions)]
    packed_w = [[energy[i][t] for t in p] for i, p in enumerate(positions)]
    width = max(lengths)
    baseline = [[0.0] * width for _ in mask]
    nonempty = groups_of([u if lengths[i] else f"empty{i}" for i, u in enumerate(uids)])
    for members in nonempty.values():
        if len(members) == 1:
            continue
        for k in range(width):
            num = sum(packed_g[j][k] * packed_w[j][k] for j in members if k < lengths[j])
            den = sum(packed_w[j][k] for j in members if k < lengths[j]) + eps
            for j in members:
                baseline[j][k] = num / den
        if zero_tail:
            ref_zero_tail(baseline, members, lengths)
    adv = [[0.0] * len(m) for m in mask]
    for i, p in enumerate(positions):
        for k, t in enumerate(p):
            adv[i][t] = packed_g[i][k] - baseline[i][k]
    return adv, returns


# ------------------------------------------------------------- hand-computed
def test_passk_hand_computed():
    # group g (rows 0, 2, 4): 0.2, 0.9, 0.5 -> row 2 learns (0.9 - 0.5) / std; h (rows 1, 3): tie at 1.0 -> margin 0
    data = make_batch([[0.2], [1.0], [0.9], [1.0], [0.5]], uids=["g", "h", "g", "h", "g"])
    a, ret = adv(data, "grpo_passk")
    std = statistics.stdev([0.2, 0.9, 0.5])
    assert_close(a[:, 0], [0.0, 0.0, 0.4 / (std + 1e-6), 0.0, 0.0])
    assert torch.equal(a, ret)
    a_raw, _ = adv(data, "grpo_passk", norm_by_std=False)
    assert_close(a_raw[:, 0], [0.0, 0.0, 0.4, 0.0, 0.0])


def test_passk_rejects_a_group_of_one():
    with pytest.raises(ValueError, match="at least 2 responses per prompt"):
        adv(make_batch([[1.0], [0.0], [1.0]], uids=["g", "g", "alone"]), "grpo_passk")


def test_gdpo_hand_computed():
    # two components, group g = rows 0, 1; h = rows 2, 3. Component 0: g (1, 0), h (1, 1); component 1: g (0, 2),
    # h (3, 1)
    data = make_batch([[0.0]] * 4, uids=["g", "g", "h", "h"], reward_components=[[1, 0], [0, 2], [1, 3], [1, 1]])
    a, _ = adv(data, "gdpo", reward_weights=[1.0, 0.5])
    s = math.sqrt(0.5)  # unbiased std of two values 1 apart
    c0 = [0.5 / (s + 1e-6), -0.5 / (s + 1e-6), 0.0, 0.0]
    c1 = [-1 / (2 * s + 1e-6), 1 / (2 * s + 1e-6), 1 / (2 * s + 1e-6), -1 / (2 * s + 1e-6)]
    mixed = [x + 0.5 * y for x, y in zip(c0, c1)]
    mean, sd = statistics.fmean(mixed), math.sqrt(statistics.variance(mixed) + 1e-8)
    assert_close(a[:, 0], [(m - mean) / sd for m in mixed])


def test_remax_hand_computed():
    # reward-to-go 1, 1, 1 and 2, 2 (a masked 7 is not counted); greedy baselines 0.5 and 3
    data = make_batch([[0, 0, 1], [0, 2, 7]], mask=[[1, 1, 1], [1, 1, 0]], reward_baselines=[0.5, 3.0])
    a, ret = adv(data, "remax")
    assert_close(a, [[0.5, 0.5, 0.5], [-1.0, -1.0, 0.0]])
    assert_close(ret, [[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]])


def test_opo_hand_computed():
    # group g: scores 1 (length 3), 0 (length 1) -> baseline 3/4; h alone keeps its score
    data = make_batch([[0, 0, 1], [0, 0, 0], [0, 0, 2]], mask=[[1, 1, 1], [1, 0, 0], [1, 1, 1]], uids=["g", "g", "h"])
    a, _ = adv(data, "opo")
    assert_close(a, [[0.25] * 3, [-0.75, 0, 0], [2.0] * 3])


def test_gpg_hand_computed():
    # 4 rows, 2 with a non-zero score -> alpha = 2; group means 0.5 (g) and 1.5 (h)
    data = make_batch([[1.0], [0.0], [0.0], [3.0]], uids=["g", "g", "h", "h"])
    a, _ = adv(data, "gpg")
    assert_close(a[:, 0], [1.0, -1.0, -3.0, 3.0])
    a2, _ = adv(data, "gpg", f_norm=2.0)
    assert_close(a2[:, 0], [0.5, -0.5, -1.5, 1.5])


def test_otb_hand_computed():
    # pi = 0.5 and sum pi^2 = 0.5 everywhere: w_t = 1 - 1 + 0.5 = 0.5, so W_t = 0.5 (t + 1) on valid tokens.
    # Rows: G = (1, 1) over 2 tokens and G = (3, 3, 3) over 3 tokens, same prompt.
    rewards, mask = [[0, 1, 0], [0, 0, 3]], [[1, 1, 0], [1, 1, 1]]
    half = math.log(0.5)
    data = make_batch(rewards, mask, uids=["g", "g"], old_log_probs=[[half] * 3] * 2, sum_pi_squared=[[0.5] * 3] * 2)
    a, ret = adv(data, "optimal_token_baseline", handle_zero_tail=False)
    b0 = (1 * 0.5 + 3 * 0.5) / (0.5 + 0.5 + 1e-8)  # t = 0: equal energies, plain mean 2
    b1 = (1 * 1.0 + 3 * 1.0) / (1.0 + 1.0 + 1e-8)  # t = 1: again 2
    b2 = (3 * 1.5) / (1.5 + 1e-8)  # t = 2: only the long row -> its own return
    assert_close(a, [[1 - b0, 1 - b1, 0.0], [3 - b0, 3 - b1, 3 - b2]])
    assert_close(ret, [[1, 1, 0], [3, 3, 3]])
    a_tail, _ = adv(data, "optimal_token_baseline")  # the strictly longest row: zero baseline from t = 2 on
    assert_close(a_tail[1], [3 - b0, 3 - b1, 3.0])


def test_tir_otb_compares_the_kth_valid_token():
    # row 1 has an observation token at t = 1: its 2nd valid token is at t = 2 and is compared with row 0's t = 1
    data = otb_batch([[0, 1, 0], [0, 9, 3]], [[1, 1, 0], [1, 0, 1]], uids=["g", "g"])
    a, ret = adv(data, "tir_optimal_token_baseline")
    # both rows have 2 valid tokens with W = 0.5, 1.0 and G = (1, 1) and (3, 3): baseline 2 at k = 1, 2
    assert_close(a, [[-1.0, -1.0, 0.0], [1.0, 0.0, 1.0]])
    assert_close(ret, [[1, 1, 0], [3, 3, 3]])
    a_pos, _ = adv(data, "optimal_token_baseline")  # by position, t = 1 of row 1 is masked: a different baseline
    assert not torch.allclose(a_pos, a)


# -------------------------------------------------------------- vs references
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("holes", [False, True])
def test_against_references(seed, holes):
    data = random_batch(seed, holes=holes)
    assert_close(adv(data, "grpo_passk")[0], ref_passk(data))
    assert_close(adv(data, "grpo_passk", norm_by_std=False)[0], ref_passk(data, norm=False))
    assert_close(adv(data, "gdpo")[0], ref_gdpo(data))
    assert_close(
        adv(data, "gdpo", reward_weights=[2.0, 0.0, -1.0], norm_by_std=False)[0],
        ref_gdpo(data, [2.0, 0.0, -1.0], False),
    )
    a, ret = adv(data, "remax")
    ref_a, ref_ret = ref_remax(data)
    assert_close(a, ref_a)
    assert_close(ret, ref_ret)
    assert_close(adv(data, "opo")[0], ref_opo(data))
    assert_close(adv(data, "gpg", f_norm=3.0)[0], ref_gpg(data, 3.0))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("zero_tail", [True, False])
@pytest.mark.parametrize("holes", [False, True])
def test_optimal_token_baselines_against_references(seed, zero_tail, holes):
    data = random_batch(seed, holes=holes, empty_row=True)
    a, ret = adv(data, "optimal_token_baseline", handle_zero_tail=zero_tail)
    ref_a, ref_ret = ref_otb(data, zero_tail)
    assert_close(a, ref_a, atol=1e-4)
    assert_close(ret, ref_ret)
    a, ret = adv(data, "tir_optimal_token_baseline", handle_zero_tail=zero_tail)
    ref_a, ref_ret = ref_tir_otb(data, zero_tail)
    assert_close(a, ref_a, atol=1e-4)
    assert_close(ret, ref_ret)


def test_otb_scales_the_energy_by_the_squared_rollout_weights():
    data = random_batch(5)
    gen = torch.Generator().manual_seed(9)
    weights = (0.5 + torch.rand(data.batch["response_mask"].shape, generator=gen)) * data.batch["response_mask"]
    plain, _ = adv(data, "optimal_token_baseline")
    data.batch["rollout_is_weights"] = weights
    corrected, _ = adv(data, "optimal_token_baseline")
    ref_a, _ = ref_otb(data, is_weights=weights.double().tolist())
    assert_close(corrected, ref_a, atol=1e-4)
    assert not torch.allclose(plain, corrected)


# ---------------------------------------------------------------------- traps
def test_groups_are_formed_by_uid_not_position():
    data = random_batch(7)
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))
    shuffled = DataProto.from_dict(
        {k: v[order] for k, v in data.batch.items()}, {"uid": data.non_tensor_batch["uid"][order.numpy()]}
    )
    for name in ["grpo", "grpo_passk", "gdpo", "opo", "gpg", "optimal_token_baseline", "tir_optimal_token_baseline"]:
        a, _ = adv(data, name)
        b, _ = adv(shuffled, name)
        assert torch.allclose(a[order], b, atol=1e-5), name


def test_grpo_std_is_unbiased_with_epsilon_added_to_the_std():
    # scores 0 and 2e-6: unbiased std = sqrt(2) * 1e-6 (biased: 1e-6); epsilon 1e-6 is added to the std, not the
    # variance
    a, _ = adv(make_batch([[0.0], [2e-6]], uids=["g", "g"]), "grpo")
    expected = 1e-6 / (math.sqrt(2) * 1e-6 + 1e-6)
    assert_close(a[:, 0], [-expected, expected], atol=1e-4)
    assert abs(a[1, 0].item() - 0.5) > 0.05 and a[1, 0].item() > 0.01  # neither biased std nor sqrt(var + eps)


@pytest.mark.parametrize("name", ["reinforce_plus_plus", "reinforce_plus_plus_baseline", "gae", "gdpo"])
def test_whitening_is_over_the_whole_batch(name):
    data = random_batch(3, holes=True)
    data.batch["values"] = torch.randn(data.batch["response_mask"].shape, generator=torch.Generator().manual_seed(1))
    a, _ = adv(data, name)
    m = data.batch["response_mask"].bool()
    valid = a[m].double()
    assert abs(valid.mean().item()) < 1e-5 and abs(valid.var().item() - 1) < 1e-4  # unbiased, over all valid tokens
    row_means = [a[i][m[i]].mean().item() for i in range(len(a))]
    assert max(abs(x) for x in row_means) > 0.1  # not per row


def test_group_of_one():
    # a prompt answered once: no baseline (GRPO's mean 0 / std 1 convention everywhere it applies)
    data = make_batch(
        [[0.0, 2.0], [1.0, 0.0], [0.0, 3.0]], uids=["g", "g", "alone"],
        old_log_probs=[[-0.5, -0.5]] * 3, sum_pi_squared=[[0.4, 0.4]] * 3,
    )  # fmt: skip
    assert_close(adv(data, "opo")[0][2], [3.0, 3.0])
    assert_close(adv(data, "gpg")[0][2], [3.0, 3.0])  # alpha = 3 rows / 3 non-zero
    assert_close(adv(data, "optimal_token_baseline")[0][2], [3.0, 3.0])
    assert_close(adv(data, "tir_optimal_token_baseline")[0][2], [3.0, 3.0])


def test_all_masked_rows_get_zero_and_do_not_move_the_others():
    data = random_batch(11, empty_row=True)
    for name in CATALOGUE:
        a, _ = adv(data, name)
        assert (a[3] == 0).all(), name
    # tir: an empty row leaves its group, so it cannot make a group of two out of a single response
    solo = make_batch(
        [[0, 2.0], [0, 0]],
        [[1, 1], [0, 0]],
        uids=["g", "g"],
        old_log_probs=[[-0.5] * 2] * 2,
        sum_pi_squared=[[0.4] * 2] * 2,
    )
    assert_close(adv(solo, "tir_optimal_token_baseline")[0][0], [2.0, 2.0])


def test_equal_rewards_give_zero():
    data = make_batch(
        [[0, 1.0], [0, 1.0], [0, 1.0], [0, 0.0], [0, 0.0]], uids=["g", "g", "g", "h", "h"],
        reward_components=[[1, 0]] * 3 + [[0, 1]] * 2, reward_baselines=[1.0, 1.0, 1.0, 0.0, 0.0],
        old_log_probs=[[-0.5, -0.7]] * 5, sum_pi_squared=[[0.4, 0.3]] * 5,
    )  # fmt: skip
    for name in CATALOGUE:
        a, _ = adv(data, name)
        assert torch.allclose(a[:, 1], torch.zeros(5), atol=1e-5), name  # the last token, where G = the score


# ---------------------------------------------------------------- declarations
NEEDED_COLUMNS = {
    "grpo_passk": ["uid"],
    "gdpo": ["uid", "reward_components"],
    "remax": ["reward_baselines"],
    "opo": ["uid"],
    "gpg": ["uid"],
    "optimal_token_baseline": ["uid", "old_log_probs", "sum_pi_squared", "rollout_is_weights"],
    "tir_optimal_token_baseline": ["uid", "old_log_probs", "sum_pi_squared", "rollout_is_weights"],
    "grpo": ["uid"],
    "gae": ["values"],
    "reinforce_plus_plus": [],
}


@pytest.mark.parametrize("name", sorted(NEEDED_COLUMNS))
def test_each_estimator_declares_its_columns(name):
    est = get_estimator(name)
    assert [n.column for n in est.needs] == NEEDED_COLUMNS[name]
    assert est.needs_groups == ("uid" in NEEDED_COLUMNS[name]) and est.needs_critic == (
        "values" in NEEDED_COLUMNS[name]
    )
    assert not set(est.options) & {n.arg for n in est.needs}  # needs are filled from the batch, not the config


@pytest.mark.parametrize(
    "name,column,pattern",
    [
        (
            "optimal_token_baseline",
            "sum_pi_squared",
            r"'optimal_token_baseline' needs batch\['sum_pi_squared'\] \(\(B, T\)",
        ),
        ("tir_optimal_token_baseline", "old_log_probs", r"'tir_optimal_token_baseline' needs batch\['old_log_probs'\]"),
        (
            "remax",
            "reward_baselines",
            r"'remax' needs batch\['reward_baselines'\] \(\(B,\) outcome score of one greedy",
        ),
        ("gdpo", "reward_components", r"'gdpo' needs batch\['reward_components'\] \(\(B, K\)"),
    ],
)
def test_a_missing_declared_column_names_it_and_the_estimator(name, column, pattern):
    data = random_batch(0)
    data.pop(batch_keys=[column])
    with pytest.raises(KeyError, match=pattern):
        compute_advantage(data, name)


def test_declared_shapes_are_checked():
    data = random_batch(0)
    data.batch["reward_baselines"] = torch.zeros(len(data), 6)
    with pytest.raises(ValueError, match=r"batch\['reward_baselines'\] has shape \(12, 6\), expected \(B,\)"):
        compute_advantage(data, "remax")
    data = random_batch(0)
    data.batch["sum_pi_squared"] = torch.zeros(len(data), 5)
    with pytest.raises(ValueError, match=r"expected \(B, T\) with B=12, T=6"):
        compute_advantage(data, "optimal_token_baseline")


def test_gdpo_weights_must_match_the_components():
    with pytest.raises(ValueError, match="2 reward_weights for 3 reward components"):
        compute_advantage(random_batch(0), "gdpo", reward_weights=[1.0, 1.0])


def test_flags_and_needs_agree_and_registration_is_checked():
    def fn(token_level_rewards, response_mask, index, sum_pi_squared):
        return token_level_rewards, token_level_rewards

    by_flag = AdvantageEstimator(name="a", fn=fn, needs_groups=True, needs=(POLICY_SUM_PI_SQUARED,))
    by_need = AdvantageEstimator(name="a", fn=fn, needs=(GROUP_IDS, POLICY_SUM_PI_SQUARED))
    assert by_flag.needs == by_need.needs and by_flag.needs_groups and by_need.needs_groups
    with pytest.raises(TypeError, match=r"declares it needs \['values'\], but its fn has no such parameter"):
        AdvantageEstimator(name="b", fn=fn, needs_groups=True, needs_critic=True, needs=(POLICY_SUM_PI_SQUARED,))
    with pytest.raises(ValueError, match=r"needs \['index'\] more than once"):
        AdvantageEstimator(name="c", fn=fn, needs=(GROUP_IDS, GROUP_IDS))
    with pytest.raises(TypeError, match="EstimatorInput records"):
        AdvantageEstimator(name="d", fn=fn, needs=("uid",))


def test_hybridflow_plugins_lists_the_catalogue_with_summaries():
    listing = format_plugin_table(get_plugin_manager(), verbose=True)
    for name in CATALOGUE:
        line = next(line for line in listing.splitlines() if line.strip().startswith(f"{name}("))
        assert "(no docstring)" not in line and len(line.split("): ", 1)[1]) > 20, line


def test_demo_runs_every_builtin_and_skips_what_it_cannot_feed():
    from hybridflow.estimators.demo import run_demo

    header = next(line for line in run_demo().splitlines() if line.strip().startswith("uid"))
    for name in [*CATALOGUE, "grpo", "gae", "rloo"]:
        assert name in header.split(), name
    assert "skipped" not in run_demo()


@pytest.mark.parametrize("empty_first", [False, True])
@pytest.mark.parametrize("zero_tail", [False, True])
def test_tir_otb_keeps_an_empty_row_out_of_every_group(zero_tail, empty_first):
    # one row is its prompt's only response (baseline 0: its advantage is its return); the other, of another
    # prompt, is empty: it must not join the first one's group and turn it into a group of two
    rows = [([0, 1, 0], [1, 1, 0]), ([0, 0, 0], [0, 0, 0])]
    rows = rows[::-1] if empty_first else rows  # the empty row first: its prompt gets group id 0, the other id 1
    data = otb_batch([r for r, _ in rows], [m for _, m in rows], uids=["a", "b"])
    a, _ = adv(data, "tir_optimal_token_baseline", handle_zero_tail=zero_tail)
    expected = [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    assert_close(a, expected[::-1] if empty_first else expected)


def test_declared_inputs_longer_than_256_tokens_are_accepted():
    # the declared (rows, tokens) shape is compared by value: 300 is past CPython's cached small ints
    data = otb_batch([[0.0] * 299 + [1.0]] * 2, [[1.0] * 300] * 2, uids=["g", "g"])
    a, ret = adv(data, "optimal_token_baseline")
    assert a.shape == (2, 300) and ret[:, 0].tolist() == [1.0, 1.0]


def test_tir_otb_zeroes_the_strictly_longest_rows_tail_by_default():
    # the OTB hand-computed case (no holes, so ranks are positions): row 1's baseline is 0 from t = 2 on
    data = otb_batch([[0, 1, 0], [0, 0, 3]], [[1, 1, 0], [1, 1, 1]], uids=["g", "g"])
    a, _ = adv(data, "tir_optimal_token_baseline")
    assert a[1, 2].item() == pytest.approx(3.0)


def test_grpo_passk_names_the_groups_of_one():
    data = make_batch([[1.0], [0.0], [1.0]], uids=["g", "g", "h"])
    with pytest.raises(ValueError, match=r"at least 2 responses per prompt; groups \[1\] have 1"):
        adv(data, "grpo_passk")


def test_an_estimator_that_returns_the_wrong_shape_is_named():
    from types import ModuleType

    from hybridflow.plugins import AdvantageEstimator, hookimpl, reset_plugin_manager
    from hybridflow.plugins.manager import PluginSource

    def flat(token_level_rewards, response_mask):
        return token_level_rewards.sum(-1), token_level_rewards  # (B,) advantages: the wrong shape

    plugin = ModuleType("flat_estimator_plugin")
    plugin.hybridflow_register_estimators = hookimpl(
        lambda register: register(AdvantageEstimator(name="flat_for_test", fn=flat))
    )
    get_plugin_manager().register(plugin, PluginSource("flat_estimator_plugin", "tests", "0"))
    try:
        with pytest.raises(ValueError, match=r"'flat_for_test' returned advantages of shape \(2,\), expected \(2, 2\)"):
            adv(make_batch([[1.0, 0.0], [0.0, 1.0]]), "flat_for_test")
    finally:
        reset_plugin_manager()


def test_the_demo_batch_scores_each_response_at_its_last_valid_token():
    from hybridflow.estimators.demo import demo_batch

    data = demo_batch(seed=0)
    rewards, lengths = data.batch["token_level_rewards"], data.batch["response_mask"].sum(-1).long()
    last = rewards[torch.arange(len(lengths)), lengths - 1]
    assert last.sum() > 0 and (lengths > 1).any()  # the case has scored responses longer than one token
    assert (lengths <= 3).any() and (lengths > 3).any()  # short and long ones: the second component varies
    assert torch.equal(rewards.sum(-1), last)  # nothing anywhere else
    assert (data.batch["values"][data.batch["response_mask"] == 0] == 0).all()  # no value past a response's end
    components = data.batch["reward_components"]
    assert torch.equal(components[:, 0], last) and torch.equal(components[:, 1], (lengths <= 3).float())


def test_a_declared_input_with_too_few_dimensions_is_refused():
    half = math.log(0.5)
    data = make_batch([[0.0, 1.0]] * 2, uids=["g", "g"], old_log_probs=[half] * 2, sum_pi_squared=[[0.5] * 2] * 2)
    with pytest.raises(ValueError, match=r"batch\['old_log_probs'\] has shape \(2,\)"):
        adv(data, "optimal_token_baseline")


def test_tir_otb_an_empty_response_of_the_same_prompt_does_not_count_as_a_peer():
    # prompt g: one real response and one empty one (say, cut at zero tokens); the real one has no peer to be
    # compared with, so its baseline is 0 and its advantage is its return
    data = otb_batch([[0, 1, 0], [0, 0, 0]], [[1, 1, 0], [0, 0, 0]], uids=["g", "g"])
    a, _ = adv(data, "tir_optimal_token_baseline", handle_zero_tail=False)
    assert_close(a, [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])

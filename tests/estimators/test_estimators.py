"""Built-in estimators against hand-computed numbers and independent references.

The references below are written from the formulas in the issue / papers, one
response at a time in plain Python floats (float64), not by calling the code
under test.
"""

import math
import statistics

import numpy as np
import pytest
import torch

from hybridflow.core import DataProto
from hybridflow.estimators import compute_advantage
from hybridflow.plugins import UnknownNameError, get_estimator

BUILTINS = ["gae", "grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"]


def batch(rewards, mask=None, uids=None, values=None):
    rewards = torch.tensor(rewards, dtype=torch.float32)
    mask = torch.ones_like(rewards) if mask is None else torch.tensor(mask, dtype=torch.float32)
    tensors = {"token_level_rewards": rewards, "response_mask": mask}
    if values is not None:
        tensors["values"] = torch.tensor(values, dtype=torch.float32)
    return DataProto.from_dict(tensors, {"uid": uids or ["g"] * len(rewards)})


def adv(data, name, **opts):
    out = compute_advantage(data, name, **opts)
    return out.batch["advantages"], out.batch["returns"]


def random_batch(seed, rows=12, length=7, groups=4, with_holes=False):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (rows,), generator=gen)
    mask = (torch.arange(length) < lengths[:, None]).float()
    if with_holes:  # masked positions in the middle too (e.g. tool output)
        mask = mask * (torch.rand(rows, length, generator=gen) > 0.2).float()
        mask[:, 0] = 1
    rewards = torch.randn(rows, length, generator=gen) * mask
    values = torch.randn(rows, length, generator=gen)
    uids = [f"p{i % groups}" for i in range(rows)]
    rng = np.random.default_rng(seed)
    rng.shuffle(uids)  # group members need not be adjacent
    return batch(rewards.tolist(), mask.tolist(), uids, values.tolist())


# ------------------------------------------------------------------ references
def ref_group_stats(scores, uids):
    out = []
    for u in uids:
        members = [scores[j] for j, v in enumerate(uids) if v == u]
        if len(members) == 1:
            out.append((0.0, 1.0, members))
        else:
            out.append((statistics.fmean(members), statistics.stdev(members), members))
    return out


def ref_whiten(matrix, mask):
    vals = [v for row, m in zip(matrix, mask) for v, k in zip(row, m) if k]
    mean, var = statistics.fmean(vals), statistics.variance(vals)
    return [[(v - mean) / math.sqrt(var + 1e-8) for v in row] for row in matrix]


def ref_outcome(data, name):
    r = data.batch["token_level_rewards"].double().tolist()
    m = data.batch["response_mask"].tolist()
    uids = list(data.non_tensor_batch["uid"])
    scores = [sum(row) for row in r]
    per_row = []
    for s, (mean, std, members) in zip(scores, ref_group_stats(scores, uids)):
        if name == "grpo":
            per_row.append((s - mean) / (std + 1e-6))
        elif name in ("dr_grpo", "reinforce_plus_plus_baseline"):
            per_row.append(s - mean)
        elif name == "rloo":
            per_row.append(s if len(members) == 1 else s - (sum(members) - s) / (len(members) - 1))
    tiled = [[a * k for k in row_mask] for a, row_mask in zip(per_row, m)]
    if name == "reinforce_plus_plus_baseline":
        tiled = [[v * k for v, k in zip(row, mk)] for row, mk in zip(ref_whiten(tiled, m), m)]
    return tiled, tiled


def ref_reinforce_pp(data, gamma):
    r = data.batch["token_level_rewards"].double().tolist()
    m = data.batch["response_mask"].tolist()
    returns = []
    for row, mk in zip(r, m):
        g, out = 0.0, [0.0] * len(row)
        for t in reversed(range(len(row))):
            if mk[t]:
                g = row[t] + gamma * g
                out[t] = g
        returns.append(out)
    advantages = [[v * k for v, k in zip(row, mk)] for row, mk in zip(ref_whiten(returns, m), m)]
    return advantages, returns


def ref_gae(data, gamma, lam):
    r = data.batch["token_level_rewards"].double().tolist()
    m = data.batch["response_mask"].tolist()
    v = data.batch["values"].double().tolist()
    raw = []
    for row, mk, vals in zip(r, m, v):
        next_v = next_a = 0.0
        out = [0.0] * len(row)
        for t in reversed(range(len(row))):
            a = row[t] + gamma * next_v - vals[t] + gamma * lam * next_a
            out[t] = a
            if mk[t]:
                next_v, next_a = vals[t], a
        raw.append(out)
    returns = [[a + b for a, b in zip(ra, rv)] for ra, rv in zip(raw, v)]
    return ref_whiten(raw, m), returns


def assert_close(actual, expected, atol=1e-5):
    assert torch.allclose(actual, torch.tensor(expected, dtype=torch.float32), atol=atol), (actual, expected)


# ------------------------------------------------------------- hand-computed
def test_grpo_hand_computed():
    # group g: scores 1, 0, 1 -> mean 2/3, unbiased std sqrt(1/3); group h alone
    a, ret = adv(batch([[0, 1], [0, 0], [1, 0], [0, 5]], uids=["g", "g", "g", "h"]), "grpo")
    std = math.sqrt(1 / 3)
    assert_close(a[:, 0], [(1 / 3) / (std + 1e-6), (-2 / 3) / (std + 1e-6), (1 / 3) / (std + 1e-6), 5 / (1 + 1e-6)])
    assert torch.equal(a, ret)


def test_grpo_without_std_and_dr_grpo_agree():
    data = batch([[1.0], [0.0], [0.0], [3.0]], uids=["g", "g", "g", "g"])
    a_dr, _ = adv(data, "dr_grpo")
    a_opt, _ = adv(data, "grpo", norm_by_std=False)
    assert_close(a_dr[:, 0], [0.0, -1.0, -1.0, 2.0])
    assert torch.equal(a_dr, a_opt)


def test_dr_grpo_declares_its_actor_defaults():
    assert get_estimator("dr_grpo").actor_defaults == {"loss_agg_mode": "seq-mean-token-sum-norm"}


def test_rloo_hand_computed():
    a, _ = adv(batch([[1.0], [0.0], [1.0], [4.0]], uids=["g", "g", "g", "h"]), "rloo")
    assert_close(a[:, 0], [1 - 0.5, 0 - 1.0, 1 - 0.5, 4.0])


def test_reinforce_plus_plus_hand_computed_with_mid_sequence_mask():
    data = batch(
        [[0, 0, 1], [0, 1, 7], [0, 5, 1]],
        mask=[[1, 1, 1], [1, 1, 0], [1, 0, 1]],
    )
    a, ret = adv(data, "reinforce_plus_plus", gamma=0.5)
    # row 1: the masked 7 is neither added nor discounted; row 2: the masked 5 is skipped,
    # and the return passes through position 1 without a discount step.
    assert_close(ret, [[0.25, 0.5, 1.0], [0.5, 1.0, 0.0], [0.5, 0.0, 1.0]])
    valid = [0.25, 0.5, 1.0, 0.5, 1.0, 0.5, 1.0]
    mean, sd = statistics.fmean(valid), math.sqrt(statistics.variance(valid) + 1e-8)
    assert_close(a[0], [(0.25 - mean) / sd, (0.5 - mean) / sd, (1 - mean) / sd])
    assert a[1, 2] == 0 and a[2, 1] == 0


def test_reinforce_plus_plus_baseline_hand_computed():
    data = batch([[1.0, 0.0], [0.0, 0.0], [2.0, 0.0]], mask=[[1, 1], [1, 0], [1, 1]], uids=["g", "g", "h"])
    a, _ = adv(data, "reinforce_plus_plus_baseline")
    # baselined: g -> +0.5, -0.5 ; h alone -> 2.0 ; tiled over valid tokens: .5,.5,-.5,2,2
    valid = [0.5, 0.5, -0.5, 2.0, 2.0]
    mean, sd = statistics.fmean(valid), math.sqrt(statistics.variance(valid) + 1e-8)
    assert_close(a, [[(0.5 - mean) / sd] * 2, [(-0.5 - mean) / sd, 0.0], [(2 - mean) / sd] * 2])


def test_gae_returns_are_reward_to_go_with_gamma_lam_one():
    data = batch([[0, 0, 1], [0, 2, 0]], mask=[[1, 1, 1], [1, 1, 0]], values=[[0.3, 0.1, 0.4], [0.5, 0.2, 9.0]])
    _, ret = adv(data, "gae")
    # with gamma = lam = 1, A_t + V_t = sum of the rewards from t on (on valid tokens)
    assert_close(ret[0], [1.0, 1.0, 1.0])
    assert_close(ret[1, :2], [2.0, 2.0])


# -------------------------------------------------------------- vs references
@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_outcome_estimators_match_reference(name, seed):
    data = random_batch(seed)
    a, ret = adv(data, name)
    ref_a, ref_ret = ref_outcome(data, name)
    assert_close(a, ref_a)
    assert_close(ret, ref_ret)


@pytest.mark.parametrize("gamma", [1.0, 0.9])
@pytest.mark.parametrize("holes", [False, True])
def test_reinforce_plus_plus_matches_reference(gamma, holes):
    data = random_batch(3, with_holes=holes)
    a, ret = adv(data, "reinforce_plus_plus", gamma=gamma)
    ref_a, ref_ret = ref_reinforce_pp(data, gamma)
    assert_close(a, ref_a)
    assert_close(ret, ref_ret)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.5)])
@pytest.mark.parametrize("holes", [False, True])
def test_gae_matches_reference(gamma, lam, holes):
    data = random_batch(4, with_holes=holes)
    a, ret = adv(data, "gae", gamma=gamma, lam=lam)
    ref_a, ref_ret = ref_gae(data, gamma, lam)
    assert_close(a, ref_a, atol=2e-5)
    assert_close(ret, ref_ret)


# ------------------------------------------------------------------ invariants
@pytest.mark.parametrize("seed", range(3))
def test_grpo_advantages_sum_to_zero_per_group(seed):
    data = random_batch(seed)
    a, _ = adv(data, "grpo")
    first = a[:, 0]  # every response has a valid first token
    for u in set(data.non_tensor_batch["uid"]):
        members = torch.tensor(data.non_tensor_batch["uid"] == u)
        assert abs(first[members].sum().item()) < 1e-4


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline"])
def test_equal_rewards_in_a_group_give_zero(name):
    data = batch([[0.0, 1.0], [1.0, 0.0], [0.5, 0.5], [0.0, 0.0], [0.0, 0.0]], uids=["g", "g", "g", "h", "h"])
    a, _ = adv(data, name)
    assert torch.allclose(a, torch.zeros_like(a), atol=1e-6)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"])
def test_masked_positions_are_zero(name):
    data = random_batch(5, with_holes=True)
    a, ret = adv(data, name)
    masked = data.batch["response_mask"] == 0
    assert masked.any()
    assert (a[masked] == 0).all() and (ret[masked] == 0).all()


def test_gae_returns_equal_unwhitened_advantage_plus_values():
    data = random_batch(6)
    a, ret = adv(data, "gae", gamma=0.9, lam=0.8)
    raw_from_returns = ret - data.batch["values"]
    m = data.batch["response_mask"]
    n = m.sum()
    mean = (raw_from_returns * m).sum() / n
    var = (((raw_from_returns - mean) ** 2) * m).sum() / (n - 1)
    assert torch.allclose(a, (raw_from_returns - mean) / torch.sqrt(var + 1e-8), atol=1e-5)


def test_outputs_are_float32_and_added_to_batch():
    data = random_batch(0)
    out = compute_advantage(data, "grpo")
    assert out is data
    assert out.batch["advantages"].dtype == torch.float32 and out.batch["returns"].dtype == torch.float32


def test_integer_mask_and_bf16_rewards_are_accepted():
    data = DataProto.from_dict(
        {
            "token_level_rewards": torch.tensor([[1.0], [0.0]], dtype=torch.bfloat16),
            "response_mask": torch.ones(2, 1, dtype=torch.long),
        },
        {"uid": ["a", "a"]},
    )
    a, _ = adv(data, "rloo")
    assert_close(a[:, 0], [1.0, -1.0])


# ---------------------------------------------------------------------- errors
def test_unknown_estimator_lists_known_names():
    with pytest.raises(UnknownNameError) as err:
        compute_advantage(random_batch(0), "grpoo")
    msg = str(err.value)
    assert "Did you mean 'grpo'" in msg
    for name in BUILTINS:
        assert name in msg


def test_missing_uid_for_group_estimator():
    data = random_batch(0)
    data.pop(non_tensor_batch_keys=["uid"])
    with pytest.raises(KeyError, match="needs the non-tensor column 'uid'"):
        compute_advantage(data, "grpo")
    compute_advantage(data, "reinforce_plus_plus")  # needs no groups


def test_missing_values_for_critic_estimator():
    data = random_batch(0)
    data.pop(batch_keys=["values"])
    with pytest.raises(KeyError, match=r"'gae' needs batch\['values'\]"):
        compute_advantage(data, "gae")


def test_shape_mismatch_and_bad_rank():
    data = batch([[1.0, 0.0]], uids=["a"])
    data.batch["response_mask"] = torch.ones(1, 3)
    with pytest.raises(ValueError, match=r"response_mask'\] has shape \(1, 3\), expected \(1, 2\)"):
        compute_advantage(data, "grpo")
    flat = DataProto.from_dict(
        {"token_level_rewards": torch.ones(2), "response_mask": torch.ones(2)}, {"uid": ["a", "b"]}
    )
    with pytest.raises(ValueError, match="must be 2-D"):
        compute_advantage(flat, "grpo")


def test_unknown_option_lists_the_options():
    with pytest.raises(TypeError, match=r"no option\(s\) \['gama'\]; its options are \{'gamma': 1.0\}"):
        compute_advantage(random_batch(0), "reinforce_plus_plus", gama=0.9)


def test_declarations():
    assert get_estimator("gae").needs_critic and not get_estimator("grpo").needs_critic
    assert get_estimator("grpo").needs_groups and not get_estimator("reinforce_plus_plus").needs_groups
    assert get_estimator("grpo").options == {"norm_by_std": True, "epsilon": 1e-6}
    assert get_estimator("gae").options == {"gamma": 1.0, "lam": 1.0}


def test_epsilon_is_added_to_a_group_std_it_is_comparable_to():
    # scores 0 and 1e-6: mean 5e-7, unbiased std 5e-7 * sqrt(2); epsilon (1e-6) is the same size, so
    # std + eps and std - eps give different advantages (0.2929 against -1.707)
    std = 5e-7 * math.sqrt(2)
    data = batch([[0.0], [1e-6]], uids=["g", "g"])
    a, _ = adv(data, "grpo")
    assert_close(a[:, 0], [-5e-7 / (std + 1e-6), 5e-7 / (std + 1e-6)], atol=1e-4)
    a, _ = adv(batch([[0.0], [1e-6]], uids=["g", "g"]), "grpo_passk")
    assert_close(a[:, 0], [0.0, 1e-6 / (std + 1e-6)], atol=1e-4)  # the best one's margin over the rest


def test_gae_on_one_token_responses():
    # T = 1: A = r - V (nothing follows), returns = A + V = r
    from hybridflow.estimators.gae import gae_advantage

    rewards, values = torch.tensor([[1.0], [2.0]]), torch.tensor([[0.5], [0.5]])
    _, returns = gae_advantage(rewards, torch.ones(2, 1), values, gamma=0.9, lam=0.8)
    assert returns.tolist() == [[1.0], [2.0]]

"""rollout_correction: token / sequence importance weights, truncated or masked, against float64 references."""

import math

import pytest
import torch

from hybridflow.losses import rollout_correction
from hybridflow.plugins import get_policy_loss

# two rows, T = 3; row 1's last token is padding. Token log-ratios old - rollout: row 0: 1.0, -0.5, 0.2;
# row 1: 0.1, -1.5
OLD = torch.tensor([[-0.5, -1.5, -0.3], [-1.0, -2.5, -9.0]], dtype=torch.float64)
ROLLOUT = torch.tensor([[-1.5, -1.0, -0.5], [-1.1, -1.0, 0.0]], dtype=torch.float64)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
LOG_W = [[1.0, -0.5, 0.2], [0.1, -1.5]]


def metric(result, name):
    return result.metrics[f"rollout_corr/{name}"]


def assert_close(actual, expected, atol=1e-9):
    assert torch.allclose(actual.double(), torch.tensor(expected, dtype=torch.float64), atol=atol), (actual, expected)


def test_token_truncated_is_min_of_the_ratio_and_the_threshold():
    out = rollout_correction(OLD, ROLLOUT, MASK, rollout_is="token", rollout_is_threshold=2.0)
    raw = [[math.exp(x) for x in row] for row in LOG_W]  # e = 2.72 is the only one above 2
    expected = [[2.0, raw[0][1], raw[0][2]], [raw[1][0], raw[1][1], 0.0]]
    assert_close(out.weights, expected)
    assert torch.equal(out.response_mask, MASK)
    applied = [2.0, raw[0][1], raw[0][2], raw[1][0], raw[1][1]]
    assert metric(out, "rollout_is_mean") == pytest.approx(sum(applied) / 5)
    assert metric(out, "rollout_is_ratio_fraction_high") == pytest.approx(1 / 5)  # the truncated share
    assert metric(out, "rollout_is_ratio_fraction_low") == pytest.approx(1 / 5)  # e^-1.5 = 0.22 < 1/2
    assert metric(out, "rollout_rs_masked_fraction") == 0.0
    mean = sum(applied) / 5
    assert metric(out, "rollout_is_eff_sample_size") == pytest.approx(1 / (sum((w / mean) ** 2 for w in applied) / 5))
    assert metric(out, "rollout_is_max") == pytest.approx(2.0) and metric(out, "rollout_is_min") == pytest.approx(
        raw[1][1]
    )


def test_token_masked_drops_tokens_outside_the_bounds():
    out = rollout_correction(OLD, ROLLOUT, MASK, rollout_is_mode="mask", rollout_is_threshold=2.0)
    keep = [[0, 1, 1], [1, 0, 0]]  # e^1 > 2 and e^-1.5 < 1/2 are dropped
    assert_close(out.response_mask, keep)
    assert_close(out.weights, [[0.0, math.exp(-0.5), math.exp(0.2)], [math.exp(0.1), 0.0, 0.0]])
    assert metric(out, "rollout_rs_masked_fraction") == pytest.approx(2 / 5)
    assert metric(out, "rollout_rs_seq_masked_fraction") == pytest.approx(1.0)  # both rows lost a token
    custom = rollout_correction(
        OLD, ROLLOUT, MASK, rollout_is_mode="mask", rollout_is_threshold=3.0, rollout_is_threshold_lower=0.7
    )
    assert_close(custom.response_mask, [[1, 0, 1], [1, 0, 0]])  # e^-0.5 = 0.61 < 0.7 now dropped, e^1 < 3 kept


def test_sequence_level_weight_is_the_product_of_the_token_ratios():
    out = rollout_correction(OLD, ROLLOUT, MASK, rollout_is="sequence", rollout_is_threshold=5.0)
    w0, w1 = math.exp(1.0 - 0.5 + 0.2), math.exp(0.1 - 1.5)  # the padding token (-9 vs 0) is not counted
    assert_close(out.weights, [[w0] * 3, [w1, w1, 0.0]])
    assert metric(out, "rollout_is_ratio_fraction_low") == 0.0  # w1 = e^-1.4 = 0.247 > 1/5
    tight = rollout_correction(
        OLD, ROLLOUT, MASK, rollout_is="sequence", rollout_is_mode="mask", rollout_is_threshold=1.5
    )
    assert_close(tight.response_mask, [[0, 0, 0], [0, 0, 0]])  # 2.01 > 1.5 and 0.247 < 1/1.5: both dropped whole
    assert metric(tight, "rollout_rs_seq_masked_fraction") == pytest.approx(1.0)
    assert metric(tight, "rollout_is_ratio_fraction_high") == pytest.approx(0.5)
    assert metric(tight, "rollout_is_ratio_fraction_low") == pytest.approx(0.5)


def test_batch_normalize_gives_mean_one():
    token = rollout_correction(OLD, ROLLOUT, MASK, rollout_is_batch_normalize=True, rollout_is_threshold=10.0)
    assert ((token.weights * MASK).sum() / MASK.sum()).item() == pytest.approx(1.0)
    raw_mean = sum(math.exp(x) for row in LOG_W for x in row) / 5
    assert metric(token, "rollout_is_batch_norm_factor") == pytest.approx(raw_mean)
    assert metric(token, "rollout_is_mean") == pytest.approx(raw_mean)  # statistics before normalization
    seq = rollout_correction(
        OLD, ROLLOUT, MASK, rollout_is="sequence", rollout_is_batch_normalize=True, rollout_is_threshold=10.0
    )
    # one weight per sequence: the mean over the two sequences is 1 (a token mean would weigh row 0 by 3/5)
    assert (seq.weights[0, 0] + seq.weights[1, 0]).item() / 2 == pytest.approx(1.0)


def test_kl_metrics_and_no_gradient():
    old = OLD.clone().requires_grad_()
    out = rollout_correction(old, ROLLOUT, MASK)
    flat = [x for row in LOG_W for x in row]
    assert metric(out, "kl") == pytest.approx(-sum(flat) / 5)
    assert metric(out, "k3_kl") == pytest.approx(sum(math.exp(x) - x - 1 for x in flat) / 5)
    assert not out.weights.requires_grad


def test_huge_log_ratios_are_clamped_and_fully_masked_rows_are_ignored():
    old = torch.tensor([[40.0, 0.0], [0.0, 0.0]])
    mask = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    out = rollout_correction(old, torch.zeros(2, 2), mask, rollout_is_threshold=1e12)
    assert out.weights[0, 0].item() == pytest.approx(math.exp(20.0), rel=1e-5)
    assert (out.weights[1] == 0).all() and metric(out, "rollout_rs_seq_masked_fraction") == 0.0


def test_errors():
    with pytest.raises(ValueError, match="rollout_is='geo'; allowed: token, sequence"):
        rollout_correction(OLD, ROLLOUT, MASK, rollout_is="geo")
    with pytest.raises(ValueError, match="rollout_is_mode='clip'; allowed: truncate, mask"):
        rollout_correction(OLD, ROLLOUT, MASK, rollout_is_mode="clip")
    with pytest.raises(ValueError, match="needs 0 < lower <= upper"):
        rollout_correction(
            OLD, ROLLOUT, MASK, rollout_is_mode="mask", rollout_is_threshold=2.0, rollout_is_threshold_lower=3.0
        )
    with pytest.raises(ValueError, match="must have one"):
        rollout_correction(OLD, ROLLOUT[:, :2], MASK)
    with pytest.raises(ValueError, match="must have one"):  # the log-probs agree, the mask does not
        rollout_correction(OLD, ROLLOUT, MASK[:, :2])


def test_the_weights_feed_a_loss():
    out = rollout_correction(OLD, ROLLOUT, MASK)
    fn = get_policy_loss("vanilla").fn
    new = OLD + 0.05
    adv = torch.ones_like(OLD)
    plain, _ = fn(OLD, new, adv, out.response_mask)
    weighted, _ = fn(OLD, new, adv, out.response_mask, rollout_is_weights=out.weights)
    assert torch.allclose(weighted, plain * out.weights)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_settings_read_from_a_config_act_as_the_literals_do(level, mode):
    """A value from a file or the command line is a new string object: equal to the literal, not identical."""

    def run(level, mode):
        return rollout_correction(
            OLD, ROLLOUT, MASK, rollout_is=level, rollout_is_mode=mode, rollout_is_batch_normalize=True
        )

    literal, read = run(level, mode), run("".join(list(level)), "".join(list(mode)))
    assert torch.equal(literal.weights, read.weights) and torch.equal(literal.response_mask, read.response_mask)
    assert literal.metrics == read.metrics


def test_the_default_threshold_is_2():
    # e = 2.72 is the only ratio above 2: truncated to 2 by default, the others as they are
    out = rollout_correction(OLD, ROLLOUT, MASK, rollout_is="token")
    assert out.weights[0, 0].item() == pytest.approx(2.0)
    assert out.weights[0, 2].item() == pytest.approx(math.exp(0.2))

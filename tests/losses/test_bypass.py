"""Rollout correction's bypass mode (veRL's ``compute_policy_loss_bypass_mode``) against numbers worked out by hand,
and the settings around it: the driver skips the recompute pass and its own correction, the config check
refuses a policy loss the mode would ignore.

Two rows, rollout log-probs r and current log-probs lp, delta = lp - r per token::

    row 0, A = +1:  r = -1.0 -1.0 -1.0   lp = -0.9 -1.8  0.0   delta =  0.1 -0.8  1.0
    row 1, A = -2:  r = -2.0 -2.0  pad   lp = -1.5 -2.0  pad   delta =  0.5  0.0
"""

import math
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from hybridflow.configs.schema import PPOConfig
from hybridflow.core import DataProto
from hybridflow.losses.bypass import bypass_policy_loss
from hybridflow.plugins import get_estimator
from hybridflow.trainer.config_checks import config_problems, config_warnings
from hybridflow.trainer.estimator_inputs import input_problems, recompute_old_log_prob
from hybridflow.trainer.ppo_trainer import PPOTrainer

E = math.exp
ROLLOUT = [[-1.0, -1.0, -1.0], [-2.0, -2.0, 0.0]]
CURRENT = [[-0.9, -1.8, 0.0], [-1.5, -2.0, 0.0]]
MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
ADV = [[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]]


def tensors():
    lp = torch.tensor(CURRENT, dtype=torch.float64, requires_grad=True)
    t = lambda x: torch.tensor(x, dtype=torch.float64)  # noqa: E731
    return t(ROLLOUT), lp, t(ADV), t(MASK)


def flat(rows):
    """A (B, T) tensor or nested list as one flat list (pytest.approx compares flat sequences)."""
    rows = rows.tolist() if isinstance(rows, torch.Tensor) else rows
    return [x for row in rows for x in row]


def near(rows):
    return pytest.approx(flat(rows), abs=1e-12)


def masked_grad(token_losses, mask, lp):
    (grad,) = torch.autograd.grad((token_losses * mask).sum(), lp)
    return flat(grad)


def test_ppo_clip_is_the_clipped_ratio_against_the_rollout_and_takes_no_weights():
    rollout, lp, adv, mask = tensors()
    losses, kept, metrics = bypass_policy_loss(rollout, lp, adv, mask, loss_type="ppo_clip")
    # A > 0: -A * r unless r > 1.2 (then -1.2 A); A < 0: -A * r unless r < 0.8 (then -0.8 A), dual clip at -3 A = 6
    expected = [[-E(0.1), -E(-0.8), -1.2], [2 * E(0.5), 2.0]]
    assert losses[0].tolist() == pytest.approx(expected[0], abs=1e-12)
    assert losses[1, :2].tolist() == pytest.approx(expected[1], abs=1e-12)
    assert kept.tolist() == MASK
    # the gradient of -A * exp(lp - r) is -A * r where the ratio is not clipped, 0 where it is
    assert masked_grad(losses, mask, lp) == near([[-E(0.1), -E(-0.8), 0.0], [2 * E(0.5), 2.0, 0.0]])
    assert metrics["ppo_kl"] == pytest.approx(-(0.1 - 0.8 + 1.0 + 0.5 + 0.0) / 5)
    assert metrics["pg_clipfrac"] == pytest.approx(1 / 5)  # only (0, 2): (0, 1) at 0.449 is -A r > -0.8 A for A > 0
    # truncated weights are computed (for the metrics) but never multiply the PPO clip: the ratio is the correction
    weighted, _, with_corr = bypass_policy_loss(
        rollout, lp, adv, mask, loss_type="ppo_clip", correction={"rollout_is": "token", "rollout_is_threshold": 2.0}
    )
    assert torch.equal(weighted, losses)
    assert with_corr["rollout_corr/rollout_is_max"] == pytest.approx(2.0)  # e^1 truncated at C


def test_reinforce_is_minus_a_log_pi_times_the_truncated_weight():
    rollout, lp, adv, mask = tensors()
    losses, kept, metrics = bypass_policy_loss(
        rollout, lp, adv, mask, loss_type="reinforce", correction={"rollout_is": "token", "rollout_is_threshold": 2.0}
    )
    w = [[E(0.1), E(-0.8), 2.0], [E(0.5), 1.0]]  # min(exp(delta), 2)
    expected = [[-1 * -0.9 * w[0][0], -1 * -1.8 * w[0][1], 0.0], [2 * -1.5 * w[1][0], 2 * -2.0 * w[1][1]]]
    assert losses[0].tolist() == pytest.approx(expected[0], abs=1e-12)
    assert losses[1, :2].tolist() == pytest.approx(expected[1], abs=1e-12)
    assert kept.tolist() == MASK  # truncation drops nothing
    # the weights carry no gradient: d/d lp of -A * lp * w is -A * w
    assert masked_grad(losses, mask, lp) == near([[-w[0][0], -w[0][1], -2.0], [2 * w[1][0], 2.0, 0.0]])
    assert metrics["ppo_kl"] == pytest.approx(-(0.1 - 0.8 + 1.0 + 0.5 + 0.0) / 5)
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx((w[0][0] + w[0][1] + 2.0 + w[1][0] + 1.0) / 5)


def test_reinforce_without_weights_is_plain_reinforce():
    rollout, lp, adv, mask = tensors()
    losses, kept, metrics = bypass_policy_loss(rollout, lp, adv, mask, loss_type="reinforce")
    assert flat(losses * mask) == near([[-0.9 * -1, -1.8 * -1, 0.0], [2 * -1.5, 2 * -2.0, 0.0]])
    assert masked_grad(losses, mask, lp) == near([[-1.0, -1.0, -1.0], [2.0, 2.0, 0.0]])
    assert kept.tolist() == MASK and not any(k.startswith("rollout_corr/") for k in metrics)


def test_mask_mode_drops_tokens_outside_the_bounds_from_the_policy_term():
    rollout, lp, adv, mask = tensors()
    correction = {"rollout_is": "token", "rollout_is_mode": "mask", "rollout_is_threshold": 2.0}
    # bounds [1/2, 2]: e^-0.8 = 0.449 is below, e^1 = 2.718 above
    for loss_type in ("ppo_clip", "reinforce"):
        losses, kept, metrics = bypass_policy_loss(rollout, lp, adv, mask, loss_type=loss_type, correction=correction)
        assert kept.tolist() == [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]], loss_type
        assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 5)
    assert flat(losses * kept) == near([[0.9 * E(0.1), 0.0, 0.0], [-3.0 * E(0.5), -4.0, 0.0]])


def test_sequence_level_mask_drops_a_whole_row():
    rollout, lp, adv, mask = tensors()
    # sequence weights: row 0 e^(0.1 - 0.8 + 1.0) = e^0.3 = 1.35, row 1 e^0.5 = 1.65; bounds [1/1.5, 1.5]
    _, kept, _ = bypass_policy_loss(
        rollout,
        lp,
        adv,
        mask,
        loss_type="ppo_clip",
        correction={"rollout_is": "sequence", "rollout_is_mode": "mask", "rollout_is_threshold": 1.5},
    )
    assert kept.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]


def test_unknown_loss_type_is_refused():
    rollout, lp, adv, mask = tensors()
    with pytest.raises(ValueError, match="loss_type='ppo'; allowed: ppo_clip, reinforce"):
        bypass_policy_loss(rollout, lp, adv, mask, loss_type="ppo")


def cfg(**overrides):
    conf = OmegaConf.structured(PPOConfig)
    for key, value in overrides.items():
        OmegaConf.update(conf, key, value)
    return OmegaConf.to_object(conf)


BYPASS = "algorithm.rollout_correction.bypass_mode"


def test_bypass_skips_the_recompute_pass_unless_the_estimator_or_the_config_asks_for_it():
    # fp32 builtin engine: auto already skips; a bf16 actor would recompute, but not under bypass
    bf16 = {"actor_rollout_ref.actor.fsdp_config.param_dtype": "bfloat16"}
    assert recompute_old_log_prob(cfg(**bf16), needs_pass=False)
    assert not recompute_old_log_prob(cfg(**bf16, **{BYPASS: True}), needs_pass=False)
    corrected = {BYPASS: True, "algorithm.rollout_correction.rollout_is": "token"}
    assert not recompute_old_log_prob(cfg(**bf16, **corrected), needs_pass=False)
    assert recompute_old_log_prob(cfg(**{BYPASS: True}), needs_pass=True)  # sum_pi_squared needs the pass
    assert recompute_old_log_prob(
        cfg(**{BYPASS: True, "actor_rollout_ref.actor.recompute_old_log_prob": "true"}), needs_pass=False
    )
    # no pass and a correction: fine in bypass (the loss compares the two), refused in decoupled mode
    off = {
        "actor_rollout_ref.actor.recompute_old_log_prob": "false",
        "algorithm.rollout_correction.rollout_is": "token",
    }
    assert input_problems(get_estimator("grpo"), cfg(**off, **{BYPASS: True})) == []
    assert input_problems(get_estimator("grpo"), cfg(**off)) != []


def test_the_config_check_takes_the_bypass_keys_and_refuses_a_loss_it_would_ignore():
    assert config_problems(cfg(**{BYPASS: True, "algorithm.rollout_correction.loss_type": "reinforce"})) == []
    [problem] = config_problems(cfg(**{BYPASS: True, "actor_rollout_ref.actor.policy_loss": "gspo"}))
    assert problem.startswith("algorithm.rollout_correction.bypass_mode=true computes its own policy loss")
    assert "policy_loss='gspo' would be ignored" in problem
    [problem] = config_problems(cfg(**{"algorithm.rollout_correction.loss_type": "ppo"}))
    assert problem == "algorithm.rollout_correction.loss_type='ppo'; allowed: ppo_clip, reinforce"


def test_off_policy_warning_knows_the_bypass_ratio_corrects():
    split = {"trainer.rollout_mode": "async", "trainer.placement": "split"}
    assert any("without a correction" in w for w in config_warnings(cfg(**split)))
    assert not any("without a correction" in w for w in config_warnings(cfg(**split, **{BYPASS: True})))
    reinforce = {BYPASS: True, "algorithm.rollout_correction.loss_type": "reinforce"}
    assert any("without a correction" in w for w in config_warnings(cfg(**split, **reinforce)))


def test_the_driver_leaves_the_correction_to_the_loss_in_bypass_mode():
    """Decoupled: the driver weighs pi_old / pi_rollout before the update; bypass: nothing there (the loss does)."""
    rollout, lp, _, mask = tensors()
    for bypass, weighted in ((False, True), (True, False)):
        batch = DataProto.from_dict(
            {"old_log_probs": lp.detach().float(), "rollout_log_probs": rollout.float(), "response_mask": mask.float()}
        )
        config = cfg(**{BYPASS: bypass, "algorithm.rollout_correction.rollout_is": "token"})
        metrics = PPOTrainer.correct_for_rollout(SimpleNamespace(config=config), batch)
        assert ("rollout_is_weights" in batch.batch) is weighted and bool(metrics) is weighted

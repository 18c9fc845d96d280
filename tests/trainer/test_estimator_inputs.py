"""What the driver provides because an estimator declared it: the plan, its checks, the columns."""

import math

import pytest
import torch

from hybridflow.configs.schema import PPOConfig
from hybridflow.plugins import AdvantageEstimator, EstimatorInput, get_estimator
from hybridflow.plugins.manager import ESTIMATORS, get_plugin_manager
from hybridflow.trainer.config_checks import config_problems
from hybridflow.trainer.estimator_inputs import InputPlan, input_problems, recompute_old_log_prob, reward_components
from hybridflow.workers.log_probs import sum_pi_squared_from_logits


def config(estimator, **reward):
    cfg = PPOConfig()
    cfg.algorithm.adv_estimator = estimator
    for key, value in reward.items():
        setattr(cfg.reward, key, value)
    return cfg


# the default config's built-in engine in fp32 reuses the rollout's log-probs, unless the estimator needs the pass
@pytest.mark.parametrize(
    "name,plan",
    [
        ("grpo", InputPlan(recompute_old_log_prob=False)),
        ("remax", InputPlan(greedy_baseline=True, recompute_old_log_prob=False)),
        ("optimal_token_baseline", InputPlan(sum_pi_squared=True, recompute_old_log_prob=True)),
        ("gdpo", InputPlan(reward_components=("a/score", "b/score"), recompute_old_log_prob=False)),
    ],
)
def test_the_plan_follows_the_declaration(name, plan):
    cfg = config(name, component_keys=["a/score", "b/score"])
    assert InputPlan.for_estimator(get_estimator(name), cfg) == plan


def test_gdpo_without_component_keys_is_refused_before_ray():
    problems = config_problems(config("gdpo"))
    assert any(
        "algorithm.adv_estimator='gdpo' needs reward components: set reward.component_keys" in p for p in problems
    )


def test_a_column_no_provider_fills_is_refused():
    need = EstimatorInput("judge_scores", "judge_scores", ("B",), "a learned judge's score")
    estimator = AdvantageEstimator(
        name="judged", fn=lambda token_level_rewards, response_mask, judge_scores: None, needs=(need,)
    )
    [problem] = input_problems(estimator, config("judged"))
    assert "needs batch['judge_scores'] (a learned judge's score), which the driver does not provide" in problem


def test_reward_components_read_the_named_fields_in_order():
    fields = [{"score": 1.0, "a/score": 0.2, "b/score": 0.7}, {"score": 0.0}]  # the second sample's verifier failed
    got = reward_components(fields, ("b/score", "a/score"), missing=-1.0)
    assert got.tolist() == [[pytest.approx(0.7), pytest.approx(0.2)], [-1.0, -1.0]]


def test_sum_pi_squared_equals_the_softmax_formula_even_for_a_peaked_distribution():
    logits = torch.tensor([[[0.0, math.log(3.0)], [200.0, 0.0]]])  # p = (1/4, 3/4); p = (1, e^-200)
    got = sum_pi_squared_from_logits(logits)
    assert got[0, 0].item() == pytest.approx(1 / 16 + 9 / 16) and got[0, 1].item() == pytest.approx(1.0)


def builtin_estimator_names():
    return sorted(
        name
        for name, regs in get_plugin_manager().registry(ESTIMATORS).by_name.items()
        if any(r.source.distribution == "hybridflow" for r in regs)
    )


@pytest.mark.parametrize("name", builtin_estimator_names())
def test_every_builtin_estimator_gets_all_it_declares_under_the_defaults(name):
    # required columns the driver provides (uid, values, sum_pi_squared, ...) are no problem; nor are keys it has
    assert input_problems(get_estimator(name), config(name, component_keys=["a/score"])) == []


def test_recompute_false_is_refused_only_where_the_pass_is_needed():
    otb = get_estimator("optimal_token_baseline")
    for setting in ("auto", "true", "True"):
        cfg = config("optimal_token_baseline")
        cfg.actor_rollout_ref.actor.recompute_old_log_prob = setting
        assert input_problems(otb, cfg) == [], setting
    cfg.actor_rollout_ref.actor.recompute_old_log_prob = "False"
    assert input_problems(otb, cfg) == [
        "actor_rollout_ref.actor.recompute_old_log_prob=false, but algorithm.adv_estimator='optimal_token_baseline' "
        "needs sum_pi_squared, which the training pass computes: set it to auto or true"
    ]
    grpo = config("grpo")
    grpo.actor_rollout_ref.actor.recompute_old_log_prob = "false"
    assert input_problems(get_estimator("grpo"), grpo) == []  # the rollout's log-probs serve
    grpo.algorithm.rollout_correction.rollout_is = "token"
    [problem] = input_problems(get_estimator("grpo"), grpo)
    assert "but algorithm.rollout_correction compares the training and the rollout log-probs" in problem


def test_columns_and_settings_read_at_run_time_compare_by_value():
    # strings built at run time (a YAML file, Hydra's command line) are equal to the constants, not the same objects
    column = "".join(["reward_", "components"])
    need = EstimatorInput(column, column, ("B", "K"), "per-verifier scores")
    estimator = AdvantageEstimator(name="mine", fn=lambda token_level_rewards, response_mask, **_: None, needs=(need,))
    [problem] = input_problems(estimator, config("mine"))
    assert "needs reward components: set reward.component_keys" in problem
    cfg = config("grpo")
    cfg.trainer.rollout_mode = "".join(["sy", "nc"])
    cfg.actor_rollout_ref.model.dtype = "".join(["float", "32"])
    assert not recompute_old_log_prob(cfg, needs_pass=False)


def test_a_plan_built_by_hand_recomputes_unless_told():
    assert InputPlan().recompute_old_log_prob  # the safe choice: the teacher-forced pass

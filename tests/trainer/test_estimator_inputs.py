"""What the driver provides because an estimator declared it: the plan, its checks, the columns."""

import math

import pytest
import torch

from hybridflow.configs.schema import PPOConfig
from hybridflow.plugins import AdvantageEstimator, EstimatorInput, get_estimator
from hybridflow.trainer.config_checks import config_problems
from hybridflow.trainer.estimator_inputs import InputPlan, input_problems, reward_components
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

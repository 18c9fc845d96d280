"""Each plugin against numbers worked out by hand, then through hybridflow's contract kit by name.

Run after ``pip install -e .``: the kit resolves the plugins by name, as the
trainer does. ``check_estimator``, ``check_policy_loss`` and
``check_reward_verifier`` are fixtures of hybridflow's pytest plugin, loaded
by pytest itself wherever hybridflow is installed.
"""

import pytest
import torch
from hybridflow_kit_example import group_rank_advantage, ppo_k3_loss, yes_no_score


def test_group_rank_by_hand():
    # group 0: scores 3, 1, 1, 7 -> ranks 2, 0.5, 0.5, 3 of n - 1 = 3 -> 2r/3 - 1 = 1/3, -2/3, -2/3, 1
    # group 1: scores 0, 5 -> ranks 0, 1 -> -1, 1;  group 2: one response -> 0
    rewards = torch.zeros(7, 3)
    rewards[:, 2] = torch.tensor([3.0, 1.0, 1.0, 7.0, 0.0, 5.0, 4.0])
    mask = torch.ones(7, 3)
    mask[5, 2] = 0.0
    advantages, returns = group_rank_advantage(rewards, mask, torch.tensor([0, 0, 0, 0, 1, 1, 2]))
    assert torch.allclose(advantages[:, 0], torch.tensor([1 / 3, -2 / 3, -2 / 3, 1.0, -1.0, 1.0, 0.0]))
    assert advantages[5, 2] == 0.0 and torch.equal(returns, advantages)


def test_ppo_k3_by_hand():
    # r = e^0.5: loss = -2 * e^0.5 + 0.1 * (e^0.5 - 1 - 0.5);  d loss / d log pi = -2 e^0.5 + 0.1 (e^0.5 - 1)
    r = 1.6487212707001282
    old = torch.tensor([[-1.0]])
    new = torch.tensor([[-0.5]], requires_grad=True)
    losses, metrics = ppo_k3_loss(old, new, torch.tensor([[2.0]]), torch.ones(1, 1))
    (grad,) = torch.autograd.grad(losses.sum(), new)
    assert losses.item() == pytest.approx(-2 * r + 0.1 * (r - 1.5), rel=1e-6)
    assert grad.item() == pytest.approx(-2 * r + 0.1 * (r - 1), rel=1e-6)
    assert metrics == {"ppo_kl": pytest.approx(r - 1.5, rel=1e-6)}


def test_yes_no_by_hand():
    assert yes_no_score("qa", "Yes, because", "yes") == {"score": 1.0, "answered": 1.0}
    assert yes_no_score("qa", " no.", "Yes") == {"score": 0.0, "answered": 1.0}
    assert yes_no_score("qa", "maybe", "no") == {"score": 0.0, "answered": 0.0}


def test_group_rank_keeps_the_estimator_contract(check_estimator):
    # a group of equal scores shares one mean rank: zero advantage, which the kit expects of a group estimator
    report = check_estimator("group_rank")
    assert "equal rewards give zero" in report.checked


def test_ppo_k3_keeps_the_loss_contract(check_policy_loss):
    check_policy_loss("ppo_k3")
    check_policy_loss("ppo_k3", options={"kl_coef": 1.0})


def test_yes_no_keeps_the_verifier_contract(check_reward_verifier):
    # odd text scores 0 rather than raising, so hold it to the stricter promise
    check_reward_verifier(
        "yes_no",
        cases=[("Yes, because", "yes", 1.0), (" no.", "Yes", 0.0), ("", "no", 0.0), ("NO", "no", 1.0)],
        odd_responses_may_raise=False,
    )

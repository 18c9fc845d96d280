"""Three small plugins in one package, each kept honest by hybridflow's contract kit.

``group_rank`` (estimator): the centred rank of a response's outcome score
within its group (rows sharing a ``uid``), ties sharing their mean rank::

    rank_i = #{j in g: s_j < s_i} + #{j in g, j != i: s_j = s_i} / 2      # in [0, n - 1]
    A_i = 2 * rank_i / (n - 1) - 1;   A_i = 0 for a group of one (n = 1)
    A_{i,t} = A_i * mask_{i,t};  returns = advantages

Only the order of the scores counts, so one outlier or the reward's scale
cannot set the step; A lies in [-1, 1].

``ppo_k3`` (policy loss): PPO's penalty form, the unclipped surrogate plus
a k3 estimate of KL(pi_old || pi), with r = exp(log pi - log pi_old)
(log-ratio clamped to [-20, 20]) and rollout weights w (1 when not given)::

    loss = (-A * r + kl_coef * (r - 1 - log r)) * w
    d loss / d log pi = -A * r + kl_coef * (r - 1)        # -A at r = 1

``yes_no`` (reward verifier): 1.0 when the response's first word (letters
only, any case) is the ground truth's ``yes`` or ``no``, else 0.0; the
``answered`` field says whether the first word was yes or no at all.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from hybridflow.plugins import AdvantageEstimator, PolicyLoss, RewardVerifier, hookimpl

_FIRST_WORD = re.compile(r"\s*([A-Za-z]+)")


def group_rank_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Centred rank of the outcome score within its group, in [-1, 1]."""
    scores = token_level_rewards.sum(dim=-1)
    same = index.unsqueeze(0) == index.unsqueeze(1)  # (B, B): row j is in row i's group
    below = (same & (scores.unsqueeze(0) < scores.unsqueeze(1))).sum(dim=1)
    ties = (same & (scores.unsqueeze(0) == scores.unsqueeze(1))).sum(dim=1) - 1  # minus the row itself
    rank = below + ties / 2
    others = same.sum(dim=1) - 1
    adv = torch.where(others > 0, 2 * rank / others.clamp(min=1) - 1, torch.zeros_like(scores))
    advantages = adv.unsqueeze(-1) * response_mask
    return advantages, advantages


def ppo_k3_loss(
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    kl_coef: float = 0.1,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Unclipped surrogate plus kl_coef times the k3 estimate of KL(pi_old || pi), per token."""
    log_ratio = torch.clamp(log_probs - old_log_probs, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    k3 = ratio - 1 - log_ratio
    token_losses = -advantages * ratio + kl_coef * k3
    if rollout_is_weights is not None:
        token_losses = token_losses * rollout_is_weights.detach()
    with torch.no_grad():
        mask = response_mask.to(k3.dtype)
        metrics = {"ppo_kl": float((k3 * mask).sum() / mask.sum().clamp(min=1))}
    return token_losses, metrics


def yes_no_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, float]:
    """1.0 when the response's first word is the ground truth's yes or no; ``answered``: it was yes or no at all."""
    match = _FIRST_WORD.match(solution_str)
    word = match.group(1).lower() if match else ""
    answered = word in ("yes", "no")
    return {"score": float(answered and word == str(ground_truth).strip().lower()), "answered": float(answered)}


@hookimpl
def hybridflow_register_estimators(register):
    register(AdvantageEstimator(name="group_rank", fn=group_rank_advantage, needs_groups=True))


@hookimpl
def hybridflow_register_policy_losses(register):
    register(PolicyLoss(name="ppo_k3", fn=ppo_k3_loss))


@hookimpl
def hybridflow_register_reward_verifiers(register):
    register(RewardVerifier(name="yes_no", fn=yes_no_score))

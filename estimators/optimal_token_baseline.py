"""OTB: the optimal token baseline (arXiv:2602.07078), as veRL's ``optimal_token_baseline``.

A baseline per token position instead of per response: responses of one
prompt (rows sharing a ``uid``) are compared at each position t, each
weighted by how much gradient "energy" it has accumulated up to t. With
pi_t = exp(old_log_probs), S_t = sum_v pi(v)^2 (``sum_pi_squared``, from the
actor's forward) and optional rollout-correction weights rho_t::

    w_t = (1 - 2 pi_t + S_t) * rho_t^2            # ||grad of log pi_t wrt the logits||^2, (rho = 1 if absent)
    W_t = sum_{s <= t} mask_s w_s                  # realized energy up to t
    G_t = sum_{s >= t} mask_s r_s                  # reward-to-go
    B_t = sum_{i in g} G_{i,t} W_{i,t} m_{i,t} / (sum_{i in g} W_{i,t} m_{i,t} + epsilon)
    A_t = (G_t - B_t) * mask_t;  returns = G

A group of one has B = 0. With ``handle_zero_tail`` (veRL 0.9's default),
when one response of a group is strictly the longest, its baseline is zero
from the second-longest length on: nothing else in the group reaches those
positions. Positions are compared by their index in the response (see
``tir_optimal_token_baseline`` for multi-turn responses). Shapes: (B, T) in
and out, index (B,).
"""

from __future__ import annotations

import torch

from hybridflow.estimators.functional import group_sum, reward_to_go
from hybridflow.plugins import AdvantageEstimator, hookimpl
from hybridflow.plugins.entries import (
    GROUP_IDS,
    POLICY_OLD_LOG_PROBS,
    POLICY_SUM_PI_SQUARED,
    ROLLOUT_CORRECTION_WEIGHTS,
)


def realized_energy(
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    mask: torch.Tensor,
    rollout_is_weights: torch.Tensor | None,
) -> torch.Tensor:
    """``W_t``: the cumulative sum over valid tokens of ``(1 - 2 pi_t + S_t) * rho_t^2``."""
    w = 1 - 2 * old_log_probs.exp() + sum_pi_squared
    if rollout_is_weights is not None:
        w = w * rollout_is_weights.square()
    return (w * mask).cumsum(dim=-1)


def zero_tail(baseline: torch.Tensor, lengths: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Zero the baseline of a group's strictly longest row from the group's second-longest length on."""
    num_groups = int(index.max()) + 1
    longest = lengths.new_full((num_groups,), -1.0).scatter_reduce(0, index, lengths, "amax")
    on_top = lengths == longest[index]
    ties = torch.bincount(index[on_top], minlength=num_groups)
    second = lengths.new_full((num_groups,), -1.0).scatter_reduce(0, index, torch.where(on_top, -1.0, lengths), "amax")
    alone = on_top & (ties[index] == 1) & (second[index] >= 0)  # second < 0: a group of one
    tail = torch.arange(baseline.shape[1]) >= second[index].unsqueeze(-1)
    return baseline.masked_fill(alone.unsqueeze(-1) & tail, 0.0)


def optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: torch.Tensor,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reward-to-go minus a per-position group baseline weighted by accumulated gradient energy."""
    returns = reward_to_go(token_level_rewards, response_mask)
    energy = realized_energy(old_log_probs, sum_pi_squared, response_mask, rollout_is_weights) * response_mask
    baseline = group_sum(returns * energy, index) / (group_sum(energy, index) + epsilon)
    alone = torch.bincount(index)[index] == 1
    baseline = baseline.masked_fill(alone.unsqueeze(-1), 0.0)
    if handle_zero_tail:
        baseline = zero_tail(baseline, response_mask.sum(dim=-1), index)
    return (returns - baseline) * response_mask, returns


OTB_NEEDS = (GROUP_IDS, POLICY_OLD_LOG_PROBS, POLICY_SUM_PI_SQUARED, ROLLOUT_CORRECTION_WEIGHTS)


@hookimpl
def hybridflow_register_estimators(register):
    register(AdvantageEstimator(name="optimal_token_baseline", fn=optimal_token_baseline_advantage, needs=OTB_NEEDS))

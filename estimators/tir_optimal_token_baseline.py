"""Multi-turn OTB, as veRL's ``tir_optimal_token_baseline`` (tool-integrated reasoning).

The optimal token baseline of ``optimal_token_baseline``, but responses are
compared at their k-th *valid* token instead of at position t: in a
multi-turn response, tool output and other observation tokens are masked in
the middle, so the same position index means different things in different
rows. With the row's valid tokens renumbered k = 1..|y_i| (W, G and mask as
in ``optimal_token_baseline``)::

    B_k = sum_{i in g, |y_i| >= k} G_{i,(k)} W_{i,(k)} / (sum_{i in g, |y_i| >= k} W_{i,(k)} + epsilon)
    A at the k-th valid token of row i = G_{i,(k)} - B_k;  0 elsewhere;  returns = G

Rows without valid tokens are left out of their group; a group of one has
B = 0; ``handle_zero_tail`` (on by default, as in veRL) zeroes the baseline
of a group's strictly longest response beyond the second-longest length.
Shapes: (B, T) in and out, index (B,).
"""

from __future__ import annotations

import torch

from hybridflow.estimators.functional import group_sum, reward_to_go
from hybridflow.estimators.optimal_token_baseline import OTB_NEEDS, realized_energy, zero_tail
from hybridflow.plugins import AdvantageEstimator, hookimpl


def tir_optimal_token_baseline_advantage(
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
    """Optimal token baseline over each response's valid tokens, compared by their rank k."""
    returns = reward_to_go(token_level_rewards, response_mask)
    energy = realized_energy(old_log_probs, sum_pi_squared, response_mask, rollout_is_weights)
    valid = response_mask > 0
    lengths = response_mask.sum(dim=-1)
    rows = torch.arange(len(lengths)).unsqueeze(-1).expand_as(valid)[valid]
    rank = (response_mask.cumsum(dim=-1) - 1).long()[valid]  # k - 1 of each valid token
    packed_g = returns.new_zeros(len(lengths), int(lengths.max()) if valid.any() else 0)
    packed_w = torch.zeros_like(packed_g)
    packed_g[rows, rank], packed_w[rows, rank] = returns[valid], energy[valid]
    # an empty row joins no group: give it an id of its own
    groups = torch.where(lengths > 0, index, int(index.max()) + 1 + torch.arange(len(index)))
    baseline = group_sum(packed_g * packed_w, groups) / (group_sum(packed_w, groups) + epsilon)
    baseline = baseline.masked_fill((torch.bincount(groups)[groups] == 1).unsqueeze(-1), 0.0)
    if handle_zero_tail:
        baseline = zero_tail(baseline, lengths, groups)
    advantages = torch.zeros_like(returns)
    advantages[valid] = returns[valid] - baseline[rows, rank]
    return advantages, returns


@hookimpl
def hybridflow_register_estimators(register):
    register(
        AdvantageEstimator(name="tir_optimal_token_baseline", fn=tir_optimal_token_baseline_advantage, needs=OTB_NEEDS)
    )

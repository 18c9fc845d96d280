"""Pass@k GRPO (arXiv:2503.19595, the paper veRL cites), as veRL's ``grpo_passk``.

Pass@k rewards a group for its best answer, so only the best response of
each group (rows sharing a ``uid``) learns, by its margin over the runner-up::

    i* = argmax_{i in g} s_i                       # first one on a tie
    A_{i*} = (s_{i*} - max_{j in g, j != i*} s_j) / (std_g + epsilon)   # std_g unbiased
    A_i = 0 for every other i;  A_{i,t} = A_i * mask_{i,t};  returns = advantages

Without ``norm_by_std`` the margin is not divided. Every group needs at
least two responses (a ``ValueError`` otherwise, as in veRL). Shapes:
rewards and mask (B, T), index (B,); outputs (B, T).
"""

from __future__ import annotations

import torch

from hybridflow.estimators.functional import group_mean_std
from hybridflow.plugins import AdvantageEstimator, hookimpl


def grpo_passk_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: torch.Tensor,
    *,
    norm_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Only each group's best response learns, from its margin over the second best."""
    scores = token_level_rewards.sum(dim=-1)
    _, std, count = group_mean_std(scores, index)
    if (count < 2).any():
        raise ValueError(
            f"grpo_passk needs at least 2 responses per prompt; groups {index[count < 2].unique().tolist()} have 1"
        )
    num_groups, rows = int(index.max()) + 1, torch.arange(len(scores))
    best = scores.new_full((num_groups,), -torch.inf).scatter_reduce(0, index, scores, "amax")
    on_top = scores == best[index]
    first = torch.full((num_groups,), len(scores)).scatter_reduce(0, index[on_top], rows[on_top], "amin")
    winner = rows == first[index]
    others = torch.where(winner, -torch.inf, scores)
    runner_up = scores.new_full((num_groups,), -torch.inf).scatter_reduce(0, index, others, "amax")
    adv = torch.where(winner, scores - runner_up[index], torch.zeros_like(scores))
    if norm_by_std:
        adv = adv / (std + epsilon)
    advantages = adv.unsqueeze(-1) * response_mask
    return advantages, advantages


@hookimpl
def hybridflow_register_estimators(register):
    register(AdvantageEstimator(name="grpo_passk", fn=grpo_passk_advantage, needs_groups=True))

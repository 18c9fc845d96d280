"""ReMax (Li et al. 2023, arXiv:2310.10505): a greedy response's score as the baseline, as veRL's ``remax``.

REINFORCE with one extra, greedy (temperature 0) response per prompt whose
outcome score b_i is the baseline of every sampled response to that prompt::

    G_{i,t} = sum_{s >= t} mask_{i,s} r_{i,s}          # reward-to-go, undiscounted
    A_{i,t} = (G_{i,t} - b_i) * mask_{i,t};  returns = G

The driver generates the greedy response and scores it (``reward_baselines``,
one float per row: the greedy score of the row's prompt, repeated for its n
samples). veRL leaves G at masked positions of the advantages; here they are
zero (the loss never reads them). Shapes: rewards and mask (B, T),
reward_baselines (B,); outputs (B, T). No groups.
"""

from __future__ import annotations

import torch

from hybridflow.estimators.functional import reward_to_go
from hybridflow.plugins import AdvantageEstimator, hookimpl
from hybridflow.plugins.entries import GREEDY_BASELINE_SCORES


def remax_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, reward_baselines: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reward-to-go minus the score of a greedy response to the same prompt."""
    returns = reward_to_go(token_level_rewards, response_mask)
    advantages = (returns - reward_baselines.unsqueeze(-1)) * response_mask
    return advantages, returns


@hookimpl
def hybridflow_register_estimators(register):
    register(AdvantageEstimator(name="remax", fn=remax_advantage, needs=(GREEDY_BASELINE_SCORES,)))

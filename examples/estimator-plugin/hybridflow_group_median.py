"""Group-median baseline: a robust cousin of GRPO, shipped as its own package.

For the n responses of one prompt with outcome scores s_i::

    A_i = s_i - median_g(s)        # median of the group (mean of the two middle values when n is even)
    A_{i,t} = A_i * mask_{i,t};  returns = advantages

The median ignores a single outlier score, which the mean does not.
Use it with ``algorithm.adv_estimator=group_median`` once installed.
"""

import torch

from hybridflow.plugins import AdvantageEstimator, hookimpl


def group_median_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: torch.Tensor, *, scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outcome score minus the median score of its group, times ``scale``."""
    scores = token_level_rewards.sum(dim=-1)
    baseline = torch.empty_like(scores)
    for group in index.unique():
        members = index == group
        sorted_scores = scores[members].sort().values
        n = sorted_scores.numel()
        baseline[members] = (sorted_scores[(n - 1) // 2] + sorted_scores[n // 2]) / 2
    advantages = (scale * (scores - baseline)).unsqueeze(-1) * response_mask
    return advantages, advantages


@hookimpl
def hybridflow_register_estimators(register):
    register(AdvantageEstimator(name="group_median", fn=group_median_advantage, needs_groups=True))

"""``my_estimator``: the group-centred outcome score, clipped (a template estimator).

For the n responses of one prompt (rows sharing a group id), with outcome
score s_i = sum_t r_{i,t}::

    A_i = clip(s_i - mean_g(s), -clip, +clip)
    A_{i,t} = A_i * mask_{i,t};  returns = advantages

Centring without dividing by the group's std keeps the scale of the reward
(as Dr.GRPO argues); the clip bounds the step one outlier score can cause.
A group of one gets A_i = 0. Shapes: rewards and mask (B, T), index (B,);
outputs (B, T).

Select it with ``algorithm.adv_estimator=my_estimator`` and set its option
with ``+algorithm.estimator_options.clip=0.5`` (dict-valued keys take a leading ``+``).
"""

from __future__ import annotations

import torch

from hybridflow.plugins import AdvantageEstimator, hookimpl


def my_estimator_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: torch.Tensor,
    *,
    clip: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outcome score minus its group's mean score, clipped to [-clip, clip].

    ``index`` holds int64 group ids in ``[0, num_groups)`` (the trainer maps
    the batch's ``uid`` column to these). Returns ``(advantages, returns)``,
    both (B, T) and zero outside the response mask.
    """
    scores = token_level_rewards.sum(dim=-1)
    num_groups = int(index.max()) + 1
    sums = torch.zeros(num_groups, dtype=scores.dtype).index_add_(0, index, scores)
    counts = torch.zeros(num_groups, dtype=scores.dtype).index_add_(0, index, torch.ones_like(scores))
    centred = scores - (sums / counts)[index]
    advantages = centred.clamp(-clip, clip).unsqueeze(-1) * response_mask
    return advantages, advantages


@hookimpl
def hybridflow_register_estimators(register):
    """Called once per process by hybridflow's plugin manager: describe, do no work."""
    register(AdvantageEstimator(name="my_estimator", fn=my_estimator_advantage, needs_groups=True))

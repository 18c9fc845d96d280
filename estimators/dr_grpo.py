"""Dr.GRPO: GRPO done right (Liu et al. 2025, arXiv:2503.20783).

Drops GRPO's two length and difficulty biases. The advantage keeps the group
baseline but not the std division::

    A_i = s_i - mean_g;   A_{i,t} = A_i * mask_{i,t};  returns = advantages

The other half of the fix is in the actor loss: sum the token losses of a
sequence and divide by a constant (the max response length) instead of the
sequence's own length, i.e. loss aggregation ``seq-mean-token-sum-norm``.
That is declared here as ``actor_defaults`` and applied by the trainer unless
the config sets ``loss_agg_mode`` itself.
"""

from __future__ import annotations

import torch

from hybridflow.estimators.grpo import grpo_advantage
from hybridflow.plugins import AdvantageEstimator, hookimpl


def dr_grpo_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-mean baseline without std normalization."""
    return grpo_advantage(token_level_rewards, response_mask, index, norm_by_std=False)


@hookimpl
def hybridflow_register_estimators(register):
    register(
        AdvantageEstimator(
            name="dr_grpo",
            fn=dr_grpo_advantage,
            needs_groups=True,
            actor_defaults={"loss_agg_mode": "seq-mean-token-sum-norm"},
        )
    )

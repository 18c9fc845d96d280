"""GPG's policy loss (Chu et al. 2025, arXiv:2504.02546), as veRL's ``gpg`` loss: plain REINFORCE.

No ratio, no clip, no surrogate: the policy gradient itself, per token::

    loss = -A * log pi * w                 # d loss / d log pi = -A

(w: rollout-correction weights, 1 when not given). Pair it with the ``gpg``
estimator; with old log-probs equal to the current ones it has the gradient
of the vanilla loss at ratio 1.
"""

from __future__ import annotations

import torch

from hybridflow.losses.functional import reweight
from hybridflow.plugins import PolicyLoss, hookimpl


def gpg_loss(
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE: minus the advantage times the token's log-probability."""
    return reweight(-advantages * log_probs, rollout_is_weights), {}


@hookimpl
def hybridflow_register_policy_losses(register):
    register(PolicyLoss(name="gpg", fn=gpg_loss))

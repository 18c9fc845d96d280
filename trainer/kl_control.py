"""KL-in-reward: the penalty and its coefficient's controller.

``rewards_t = scores_t - beta * KL_t`` on every response token, where KL_t is
the configured per-token estimator of KL(pi || pi_ref) and beta comes from a
fixed controller, or the adaptive one of Ziegler et al. 2019 (arXiv:1909.08593)::

    error = clip(kl / target_kl - 1, -0.2, 0.2)
    beta <- beta * (1 + error * n_steps / horizon)
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.configs.schema import KLControlConfig
from hybridflow.core import DataProto
from hybridflow.core.keys import OLD_LOG_PROBS, REF_LOG_PROBS, RESPONSE_MASK, TOKEN_LEVEL_REWARDS, TOKEN_LEVEL_SCORES
from hybridflow.losses import kl_penalty


@dataclass
class KLController:
    """Holds the current coefficient; ``update`` adapts it when ``adaptive``."""

    value: float
    adaptive: bool = False
    target_kl: float = 0.1
    horizon: int = 10000

    @classmethod
    def from_config(cls, config: KLControlConfig) -> KLController:
        """The controller ``algorithm.kl_ctrl`` describes; its section's rules (``KLControlConfig.problems``) must
        hold."""
        problems = config.problems()
        if problems:
            raise ValueError("algorithm.kl_ctrl: " + "; ".join(problems))
        return cls(config.kl_coef, config.type == "adaptive", config.target_kl, config.horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move the coefficient towards the target after a batch of ``n_steps`` samples."""
        if self.adaptive:
            error = max(-0.2, min(0.2, current_kl / self.target_kl - 1))
            self.value *= 1 + error * n_steps / self.horizon


def apply_kl_penalty(batch: DataProto, controller: KLController, kind: str) -> dict[str, float]:
    """Set ``token_level_rewards = token_level_scores - beta * KL`` and adapt beta; returns metrics."""
    mask = batch.batch[RESPONSE_MASK].float()
    kl = kl_penalty(batch.batch[OLD_LOG_PROBS], batch.batch[REF_LOG_PROBS], kind) * mask
    batch.batch[TOKEN_LEVEL_REWARDS] = batch.batch[TOKEN_LEVEL_SCORES] - controller.value * kl
    per_sequence = kl.sum(-1) / mask.sum(-1).clamp(min=1)
    current = float(per_sequence.mean())
    beta = controller.value
    controller.update(current, n_steps=len(batch))
    return {"actor/reward_kl_penalty": current, "actor/reward_kl_penalty_coeff": beta}

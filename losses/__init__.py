"""Policy losses (plugins, like estimators), loss aggregation and KL estimators.

The built-in losses ``vanilla`` (PPO clip with dual clip) and ``gspo`` are
registered through the ``hybridflow`` entry-point group in setup.cfg and
resolved with :func:`hybridflow.plugins.get_policy_loss`; the actor owns
aggregation (:func:`agg_loss`), so a loss only returns per-token values.
"""

from hybridflow.losses.aggregation import LOSS_AGG_MODES, agg_loss
from hybridflow.losses.kl import KL_PENALTIES, kl_penalty

__all__ = ["KL_PENALTIES", "LOSS_AGG_MODES", "agg_loss", "kl_penalty"]

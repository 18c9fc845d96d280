"""Policy losses (plugins, like estimators), loss aggregation, KL estimators and rollout correction.

The built-in losses (``vanilla`` PPO clip with dual clip, ``gspo``,
``cispo``, ``dppo_tv``, ``dppo_kl``, ``gpg``, ``dro``, ``sapo``,
``geo_mean``, ``clip_cov``, ``kl_cov``) are registered through the
``hybridflow`` entry-point group in setup.cfg and resolved with
:func:`hybridflow.plugins.get_policy_loss`; the actor owns aggregation
(:func:`agg_loss`), so a loss only returns per-token values.
:func:`rollout_correction` computes the ``rollout_is_weights`` every loss
accepts.
"""

from hybridflow.losses.aggregation import LOSS_AGG_MODES, agg_loss
from hybridflow.losses.kl import KL_PENALTIES, kl_penalty
from hybridflow.losses.rollout_correction import RolloutCorrection, rollout_correction

__all__ = ["KL_PENALTIES", "LOSS_AGG_MODES", "RolloutCorrection", "agg_loss", "kl_penalty", "rollout_correction"]

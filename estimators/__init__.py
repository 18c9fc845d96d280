"""Advantage estimators: one short module each, registered as plugins.

The framework never imports an estimator module by name: they are listed
under the ``hybridflow`` entry-point group in setup.cfg, exactly as a
third-party estimator would be, and found through the plugin manager.
"""

from hybridflow.estimators.adapter import compute_advantage, group_index

__all__ = ["compute_advantage", "group_index"]

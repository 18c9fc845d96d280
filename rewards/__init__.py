"""Reward verifiers (plugins) and the batch reward manager.

Verifiers are registered through the ``hybridflow`` entry points like any
plugin: ``math`` (:mod:`.math_answer`), ``gsm8k`` / ``gsm8k_flexible``
(:mod:`.gsm8k`), ``format`` (:mod:`.format`), ``code`` (:mod:`.code`, with
the sandbox in :mod:`hybridflow.sandbox`) and ``custom`` (:mod:`.custom`). The
framework scores batches with :class:`~hybridflow.rewards.manager.RewardManager`
(import it from :mod:`hybridflow.rewards.manager`; this package imports
nothing heavy on its own).
"""

"""hybridflow's contract kit: checks any estimator, policy loss, reward verifier or rollout engine package can run
in its tests.

::

    def test_my_estimator_contract(check_estimator):        # a fixture of the kit's pytest plugin
        check_estimator("my_estimator", options={"clip": 0.5})

    def test_my_reward_contract(check_reward_verifier):
        check_reward_verifier("my_reward", cases=[("8", "8", 1.0), ("x", "8", 0.0)])

The fixtures come from :mod:`hybridflow.testing.plugin`, which pytest loads
by itself (the ``pytest11`` entry point named ``hybridflow``) wherever
hybridflow is installed; ``-p no:hybridflow`` switches it off. The same
functions can be imported from here. Each takes a registered name or the
record itself, raises one ``AssertionError`` listing every property the
plugin breaks (which property, on which input, with the numbers) and
returns a :class:`ContractReport` otherwise:

- :func:`check_estimator` (:mod:`~hybridflow.testing.estimator_checks`):
  shapes, finiteness, zero advantage on masked tokens, invariance to row
  and group order, zero advantage for a group of equal rewards, edge cases;
- :func:`check_policy_loss` (:mod:`~hybridflow.testing.loss_checks`):
  shapes, finite losses and float metrics, no loss and no gradient through
  masked tokens, the gradient at ratio 1, unit rollout weights;
- :func:`check_reward_verifier` (:mod:`~hybridflow.testing.verifier_checks`):
  finite scores or ordinary exceptions, never a hang, deterministic,
  expected scores, on empty, 1 MB and non-ASCII responses too;
- :func:`check_rollout_engine` (:mod:`~hybridflow.testing.rollout_engine_checks`):
  tokenizer facts, n samples per prompt, deterministic greedy and seeded
  sampling, stop tokens, weights loaded in place, the log-probs of what it
  generated (builds the engine on a one-rank world of this process).

A property a formula does not imply is declared off by a keyword of the
check (``zero_on_masked=False``, ``equal_rewards_give_zero=False``, ...);
each module's docstring says which properties there are and the rule for
their defaults.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hybridflow.testing.contract import ContractReport
    from hybridflow.testing.estimator_checks import check_estimator
    from hybridflow.testing.loss_checks import check_policy_loss
    from hybridflow.testing.rollout_engine_checks import check_rollout_engine
    from hybridflow.testing.verifier_checks import VerifierCase, check_reward_verifier

# pytest imports this package (for its plugin) at the start of every session
# in an environment where hybridflow is installed; the checks import torch,
# so they load on first use instead, and `pytest --version` stays fast.
_EXPORTS = {
    "ContractReport": "hybridflow.testing.contract",
    "VerifierCase": "hybridflow.testing.verifier_checks",
    "check_estimator": "hybridflow.testing.estimator_checks",
    "check_policy_loss": "hybridflow.testing.loss_checks",
    "check_reward_verifier": "hybridflow.testing.verifier_checks",
    "check_rollout_engine": "hybridflow.testing.rollout_engine_checks",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)

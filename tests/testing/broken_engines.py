"""Rollout engines that each break one property of the contract (run by tests/testing/test_rollout_engine_contract.py
in a process of its own: the contract starts a one-rank torch.distributed world).

    python tests/testing/broken_engines.py   # prints {engine: the contract's error, or "passed"} as JSON
"""

import json

from hybridflow.core.keys import RESPONSE_MASK, ROLLOUT_LOG_PROBS
from hybridflow.plugins import RolloutEngineEntry
from hybridflow.testing.rollout_engine_checks import check_rollout_engine
from hybridflow.workers.rollout.builtin import BuiltinRollout


class KeepsFirstWeights(BuiltinRollout):
    """Loads the first weights, then only claims to load the next."""

    def load_weights(self, source, **kwargs):
        if self.weight_version >= 0:
            self.weight_version = source.version
            return {}
        return super().load_weights(source, **kwargs)


class IgnoresStopTokens(BuiltinRollout):
    def generate(self, prompts, **kwargs):
        kwargs["stop_token_ids"] = ()
        return super().generate(prompts, **kwargs)


class ShiftedLogProbs(BuiltinRollout):
    def generate(self, prompts, **kwargs):
        out = super().generate(prompts, **kwargs)
        out.batch[ROLLOUT_LOG_PROBS] -= 0.01 * out.batch[RESPONSE_MASK]
        return out


class UnseededSampling(BuiltinRollout):
    def generate(self, prompts, **kwargs):
        kwargs["seed"] = None
        return super().generate(prompts, **kwargs)


ENGINES = {
    "builtin": BuiltinRollout,
    "keeps_first_weights": KeepsFirstWeights,
    "ignores_stop_tokens": IgnoresStopTokens,
    "shifted_log_probs": ShiftedLogProbs,
    "unseeded_sampling": UnseededSampling,
}


def main() -> None:
    results = {}
    for name, engine in ENGINES.items():
        try:
            check_rollout_engine(RolloutEngineEntry(name, engine))
            results[name] = "passed"
        except AssertionError as err:
            results[name] = str(err)
    print(json.dumps(results))


if __name__ == "__main__":
    main()

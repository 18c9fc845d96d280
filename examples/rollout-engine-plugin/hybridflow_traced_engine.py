"""``traced_builtin``: hybridflow's built-in rollout engine under another name, counting what it does.

Select it with ``actor_rollout_ref.rollout.name=traced_builtin``. Every weight load reports
``rollout/traced_loads`` (this rank's loads so far, the first at start) and ``rollout/traced_calls`` (its
generations so far) among the load's metrics, which reach the step's metrics; everything else is the
built-in engine's. A real engine package has the same shape: a
factory that builds one rank's engine from the context, registered by name.
"""

from __future__ import annotations

from hybridflow.plugins import RolloutEngineEntry, hookimpl


class TracedEngine:
    """The built-in engine, its generations and loads counted (the RolloutEngine interface, delegated)."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = self.loads = 0
        self.pad_token_id = inner.pad_token_id
        self.eos_token_ids = inner.eos_token_ids
        self.keeps_weights = inner.keeps_weights
        self.generates_through_stream = inner.generates_through_stream

    @property
    def weight_version(self):
        return self.inner.weight_version

    @weight_version.setter
    def weight_version(self, version):
        self.inner.weight_version = version

    def generate(self, prompts, **kwargs):
        self.calls += 1
        return self.inner.generate(prompts, **kwargs)

    def load_weights(self, source, **kwargs):
        self.loads += 1
        metrics = self.inner.load_weights(source, **kwargs)
        return {**metrics, "rollout/traced_loads": float(self.loads), "rollout/traced_calls": float(self.calls)}

    def wake_up(self, tags=None):
        self.inner.wake_up(tags)

    def sleep(self):
        self.inner.sleep()

    def stream(self, n, slots, sampling, swap):
        return self.inner.stream(n, slots, sampling, swap)


def traced_builtin(context):
    """The built-in engine, counting its weight loads and generations (rollout/traced_*)."""
    from hybridflow.workers.rollout.builtin import BuiltinRollout

    return TracedEngine(BuiltinRollout(context))


@hookimpl
def hybridflow_register_rollout_engines(register):
    register(RolloutEngineEntry("traced_builtin", traced_builtin, log_probs_match_training=True))

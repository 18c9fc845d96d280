"""Rollout: turn a batch of prompts into sampled responses with their log-probs.

:class:`BuiltinEngine` is the built-in engine (HF model forward with a KV
cache); :class:`SamplingParams` holds temperature, top-p, top-k and the
response length.
"""

from typing import Any

__all__ = ["EngineConfig", "BuiltinEngine", "SamplingParams"]


def __getattr__(name: str) -> Any:
    # imported when asked for: the config checks import tp_plan from this package before any engine is built,
    # and the engine's imports (transformers' models) would double the time a bad command line takes to refuse
    if name == "SamplingParams":
        from hybridflow.core.sampling import SamplingParams

        return SamplingParams
    if name in ("BuiltinEngine", "EngineConfig"):
        from hybridflow.workers.rollout import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

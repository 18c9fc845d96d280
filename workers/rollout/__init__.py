"""Rollout: turn a batch of prompts into sampled responses with their log-probs.

:class:`BuiltinEngine` is the built-in engine (HF model forward with a KV
cache); :class:`SamplingParams` holds temperature, top-p, top-k and the
response length.
"""

from hybridflow.core.sampling import SamplingParams
from hybridflow.workers.rollout.engine import BuiltinEngine, EngineConfig

__all__ = ["EngineConfig", "BuiltinEngine", "SamplingParams"]

"""What a rollout engine is to the workers that hold one: one typed interface, built by name.

An engine samples ``n`` responses per prompt from the policy's current weights on one rank. The actor's
colocated rollout and the rollout group's ranks hold it as a :class:`RolloutEngine` and never ask which
one it is: the built-in engine (``workers/rollout/builtin.py``), vLLM in-process
(``workers/rollout/vllm_engine.py``) and a plugin package's engine are built the same way, by
``actor_rollout_ref.rollout.name``, through the ``hybridflow_register_rollout_engines`` hook
(:func:`build_engine`). The life of an engine on a rank, as the workers drive it::

    engine = build_engine(context)        # once, in init_model (collective over the rank's world)
    engine.wake_up(["weights"])           # before new weights or a generation
    engine.load_weights(source)           # the policy's weights of one version, sharded or whole
    engine.wake_up(["kv_cache"])
    engine.generate(prompts, n=..., ...)  # the same call on every rank of a tensor-parallel group
    engine.sleep()                        # the trainer's turn: free what the engine can

``docs/writing-a-rollout-engine.md`` shows a package that registers one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from hybridflow.core.data_proto import DataProto
from hybridflow.core.sampling import SamplingParams

if TYPE_CHECKING:
    from hybridflow.configs.schema import PPOConfig
    from hybridflow.core.parallel_dims import ParallelDims
    from hybridflow.workers.rollout.stream import RolloutStream

SLEEP_TAGS = ("weights", "kv_cache")
"""What :meth:`RolloutEngine.wake_up` restores: the weights (before a load) and the KV cache (before a generation)."""


class WeightSource(Protocol):
    """The policy's weights of one version, as one load sees them.

    Colocated with the trainer, :meth:`sharded` gives the training shards in place (the built-in engine
    reshards them into its tensor-parallel blocks without gathering a whole model); on the rollout's own
    ranks the weights arrive whole over the transfer group, and :meth:`sharded` is None.
    """

    version: int
    """The policy version: how many optimizer updates made these weights."""

    def full(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every weight whole, under the HF model's names, one at a time (gathered or received: collective,
        the same order on every rank). A tensor may be reused once the next one is asked for."""
        ...

    def sharded(self) -> list[tuple[str, torch.Tensor]] | None:
        """The training shards (DTensors), current for this version; None where the weights come whole."""
        ...


@dataclass(frozen=True)
class EngineContext:
    """What a factory gets to build the engine of one rank."""

    config: PPOConfig
    dims: ParallelDims
    tokenizer: Any
    device: torch.device
    tp_group: Any
    """The rollout tensor-parallel process group of this rank (None with tp 1)."""
    tp_rank: int
    policy: torch.nn.Module | None = None
    """Colocated: the training model (its config and generation config shape the engine's copy); None on the
    rollout's own ranks, where only the model directory's config is read."""
    batches: int = 1
    """Steps' worth of this rank's rows that may be in flight at once (pipelined modes submit ahead)."""
    stepwise: bool = False
    """A pipelined stream will step the engine (:meth:`RolloutEngine.stream`)."""

    @property
    def rollout(self) -> Any:
        """``actor_rollout_ref.rollout``."""
        return self.config.actor_rollout_ref.rollout

    @property
    def tp_size(self) -> int:
        return self.dims.rollout.tp


@runtime_checkable
class RolloutEngine(Protocol):
    """One rank's rollout engine. Every method is called on every rank of the rollout's tensor-parallel group
    together (they may be collective); only the worker that holds the engine calls it."""

    pad_token_id: int
    """Fills responses after they end; the driver pads prompts with it."""
    eos_token_ids: tuple[int, ...]
    """Token ids that end a response (the tokenizer's EOS first, then the generation config's)."""
    weight_version: int
    """The policy version of the weights the engine holds; -1 when it holds none (not loaded yet, discarded
    by :meth:`sleep`, or invalidated by the worker after a checkpoint load)."""
    keeps_weights: bool
    """True: the weights stay usable between generations, so the actor loads new ones right after each update;
    False: the load waits for the next generation's wake-up (an engine that sleeps through training)."""
    generates_through_stream: bool
    """True: once a pipelined stream runs, it alone steps the engine, and a plain generation joins it as one
    more request; False: a plain generation pauses the stream and runs beside it."""

    def generate(
        self,
        prompts: DataProto,
        *,
        n: int,
        sampling: SamplingParams,
        greedy: bool,
        seed: int | None,
        stop_token_ids: tuple[int, ...] = (),
    ) -> DataProto:
        """``n`` responses per left-padded prompt row, a prompt's samples adjacent: ``responses``,
        ``response_mask``, ``rollout_log_probs`` and the full sequences' ``input_ids`` / ``attention_mask`` /
        ``position_ids``; ``meta_info["metrics"]`` the engine's ``rollout/*`` numbers. ``greedy`` ignores
        ``sampling``'s temperature; ``seed`` makes sampling repeatable; a response ends at an EOS id or one of
        ``stop_token_ids``, or after ``sampling.max_new_tokens``."""
        ...

    def load_weights(self, source: WeightSource, *, requests_in_flight: bool = False) -> dict[str, float]:
        """Take the policy's weights of ``source.version`` in place; returns the load's metrics
        (``reshard/*`` or ``weight_sync/*``). ``requests_in_flight``: a stream swaps weights between two of
        its steps, requests still running."""
        ...

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Restore ``tags`` (of :data:`SLEEP_TAGS`; None: all) after :meth:`sleep`; a no-op where nothing sleeps."""
        ...

    def sleep(self) -> None:
        """Free what the engine can while the trainer runs (called after every generation)."""
        ...

    def stream(self, n: int, slots: int, sampling: SamplingParams, swap: str) -> RolloutStream:
        """A running :class:`~hybridflow.workers.rollout.stream.RolloutStream` over this engine for the pipelined
        modes: ``n`` samples per prompt, at most ``slots`` rows decoding at once (the engine may bound them
        further), new weights let in at ``swap`` points."""
        ...


def special_token_ids(
    tokenizer: Any,
    generation_eos: int | Sequence[int] | None = None,
    *,
    eos: Sequence[int] | None = None,
    pad: int | None = None,
) -> tuple[int, tuple[int, ...]]:
    """``(pad_token_id, eos_token_ids)`` of a rollout: the one rule every engine and the rollout server follow.

    The EOS ids are ``eos`` when given, else the tokenizer's EOS followed by the generation config's
    (``generation_eos``: one id, several or None), in that order, repeats dropped; a response ends at any of
    them. The pad is ``pad`` when given, else the tokenizer's pad, else the first EOS id.

    :raises ValueError: when there is no EOS id at all.
    """
    if eos is not None:
        ids = list(eos)
    else:
        more = generation_eos if isinstance(generation_eos, (list, tuple)) else [generation_eos]
        ids = [tokenizer.eos_token_id, *more]
    eos_ids = tuple(dict.fromkeys(int(i) for i in ids if i is not None))
    if not eos_ids:
        raise ValueError("no EOS token id: the tokenizer has no eos_token and none was given")
    if pad is None:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    return int(pad), eos_ids


def tokenizer_info(engine: RolloutEngine) -> dict[str, Any]:
    """The pad id the driver pads prompts with, the first EOS id and all of them (``tokenizer_info`` of the
    worker groups)."""
    return {
        "pad_token_id": engine.pad_token_id,
        "eos_token_id": engine.eos_token_ids[0],
        "eos_token_ids": list(engine.eos_token_ids),
    }


def build_engine(context: EngineContext) -> RolloutEngine:
    """The engine ``actor_rollout_ref.rollout.name`` names, built for this rank (the one place an engine is
    chosen). Raises ``TypeError`` when a plugin's factory returns something that is not a
    :class:`RolloutEngine`."""
    from hybridflow.plugins import get_rollout_engine

    name = context.rollout.name
    engine = get_rollout_engine(name).fn(context)
    if not isinstance(engine, RolloutEngine):
        members = [*RolloutEngine.__annotations__, *(m for m, v in vars(RolloutEngine).items() if _public_method(m, v))]
        missing = [m for m in members if not hasattr(engine, m)]
        raise TypeError(f"rollout engine {name!r} built a {type(engine).__name__}, which lacks {missing}")
    return engine


def _public_method(name: str, value: Any) -> bool:
    return callable(value) and not name.startswith("_")

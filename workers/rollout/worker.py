"""The rollout worker: the policy's rollout layout on ranks of its own (``trainer.placement=split``).

It holds only what generation needs: this rank's rollout engine (whichever
``rollout.name`` names, ``workers/rollout/base.py``) and one end of the weight
transfer (``core/weight_transfer.py``). It never loads
a checkpoint: the weights arrive from the trainer's ranks, versioned, right
after start and after every update, and each generation reports the version
it sampled with. Besides plain generation calls it runs a
:class:`~hybridflow.workers.rollout.stream.RolloutStream` for the pipelined
modes (``trainer.rollout_mode``): ``generate_stream`` calls may be in flight
several at once (the group's actors are threaded) and all decode in one
loop that keeps its row slots full; the engine makes the stream (vLLM's steps
its own engine loop, and every call joins it).
"""

from __future__ import annotations

import itertools
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from hybridflow.configs.schema import PPOConfig
from hybridflow.core import DP_COMPUTE_PROTO, ONE_TO_ALL, DataProto, Worker, register
from hybridflow.core.keys import (
    GREEDY,
    MAX_NEW_TOKENS,
    N_SAMPLES,
    ROLLOUT_VERSIONS,
    SEED,
    SEQUENCE_COLUMNS,
    STOP_TOKEN_IDS,
    STREAM_REQUEST,
    WEIGHT_VERSION,
)
from hybridflow.core.parallel_dims import ParallelDims
from hybridflow.core.sampling import SamplingParams
from hybridflow.core.weight_transfer import WeightSyncError, WeightTransfer
from hybridflow.workers.models import load_tokenizer
from hybridflow.workers.rollout.base import EngineContext, build_engine, tokenizer_info
from hybridflow.workers.rollout.sources import ReceivedWeights
from hybridflow.workers.rollout.stream import RolloutStream, StreamCall

PIPELINED_MODES = ("async", "one_step_off")
"""The ``trainer.rollout_mode`` values whose rollout runs a stream (``workers/rollout/stream.py``)."""


def swap_point(trainer: Any) -> str:
    """When the stream lets new weights in (:data:`~hybridflow.workers.rollout.stream.SWAP_POINTS`): once it has
    run dry one step off, as ``trainer.async_weight_swap`` says in async mode."""
    return "drained" if trainer.rollout_mode == "one_step_off" else trainer.async_weight_swap


def sampling_for(config: PPOConfig, meta: dict[str, Any]) -> SamplingParams:
    """The rollout's sampling for one call: ``meta["max_new_tokens"]`` (an agent loop's turn) within
    ``rollout.response_length``."""
    rollout = config.actor_rollout_ref.rollout
    steps = min(int(meta.get(MAX_NEW_TOKENS, rollout.response_length)), rollout.response_length)
    return SamplingParams(
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        max_new_tokens=steps,
        ignore_eos=rollout.ignore_eos,
    )


def call_seed(meta: dict[str, Any], dp_rank: int) -> int:
    """The sampling seed of one generation call on rollout dp rank ``dp_rank`` (tp peers share it)."""
    return meta[SEED] * 1_000_003 + dp_rank


class RolloutWorker(Worker):
    """Generation of the policy on one rank of the rollout's own pool."""

    def __init__(self, config: PPOConfig, dims: ParallelDims) -> None:
        super().__init__()
        self.config, self.dims = config, dims
        self.init_device_mesh(*dims.rollout.mesh)
        self.tp_size = dims.rollout.tp
        self.transfer: WeightTransfer | None = None
        self.stream: RolloutStream | None = None
        self.broken_sync: str | None = None  # a sync that failed partway: what the engine holds is no one version
        self._calls = itertools.count(-1, -1)  # stream ids of generate_sequences calls, apart from the driver's

    @property
    def tp_rank(self) -> int:
        """This rank's position in its rollout tensor-parallel group."""
        return self.device_mesh.get_local_rank("tp") if self.tp_size > 1 else 0

    @register(dispatch=ONE_TO_ALL, reads=())
    def init_model(self) -> None:
        """Build this rank's engine (no weights until the first transfer) and, for a pipelined
        ``trainer.rollout_mode``, the stream that steps it."""
        arr = self.config.actor_rollout_ref
        pipelined = self.config.trainer.rollout_mode in PIPELINED_MODES
        context = EngineContext(
            self.config,
            self.dims,
            load_tokenizer(arr.model.path),
            self.device,
            self.device_mesh.get_group("tp") if self.tp_size > 1 else None,
            self.tp_rank,
            batches=1 + self.config.trainer.batches_ahead(),
            stepwise=pipelined,
        )
        self.engine = build_engine(context)
        if pipelined:
            self.stream = self._new_stream(arr.rollout.n)

    @register(dispatch=ONE_TO_ALL, reads=())
    def tokenizer_info(self) -> dict[str, Any]:
        """The pad token id the driver pads prompts with, the engine's first EOS id and all of them."""
        return tokenizer_info(self.engine)

    @register(dispatch=ONE_TO_ALL, reads=())
    def join_weight_transfer(self, host: str, port: int, members: int) -> None:
        """Join the trainer-to-rollout group as member ``1 + rank`` (with the trainer's ``join_weight_transfer``)."""
        self.transfer = WeightTransfer(
            host, port, 1 + self.rank, members, self.device, timeout_s=self.config.trainer.timeouts.weight_sync_s
        )
        self.transfer.read_manifest()

    @register(dispatch=ONE_TO_ALL, reads=())
    def receive_weights(self, admit: list[int] | None = None) -> dict[str, float]:
        """Receive one transfer into the engine (with the trainer's ``send_weights``); its ``weight_sync/*``
        metrics. Inside a running stream it waits for the stream's swap point (``stream.paused``), and the stream
        requests ``admit`` names enter the decoder with the new weights."""
        bucket = int(self.config.actor_rollout_ref.rollout.reshard_bucket_mb * 2**20)
        try:
            with torch.no_grad(), self._paused(weights=True):
                source = ReceivedWeights(self.transfer.incoming(bucket))
                self.engine.load_weights(source, requests_in_flight=self.stream is not None)
                stats = source.stats()
                if self.stream is not None:
                    self.stream.set_version(stats.version, admit or ())
        except BaseException as err:  # fail closed: nothing generates on a partial sync
            self.broken_sync = f"{type(err).__name__}: {err}"
            if self.stream is not None:
                self.stream.close()
            raise
        return stats.metrics()

    @register(dispatch=DP_COMPUTE_PROTO, reads=SEQUENCE_COLUMNS)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """One generation call, as the actor's (``meta_info``: ``n``, ``greedy``, ``seed``, optionally
        ``max_new_tokens``, ``stop_token_ids``); a running stream pauses for it, or takes it as one more request
        where the stream alone steps the engine."""
        self._refuse_a_broken_sync()
        meta = prompts.meta_info
        stops = tuple(meta.get(STOP_TOKEN_IDS, ()))
        if self.engine.generates_through_stream and self.stream is not None:
            request = next(self._calls)
            call = StreamCall(greedy=meta[GREEDY], sampling=sampling_for(self.config, meta), stop_token_ids=stops)
            self.stream.submit(request, prompts, self._seed(meta), n=meta[N_SAMPLES], call=call)
            out = self.stream.take(request)
            out.batch.pop(ROLLOUT_VERSIONS)
        else:
            with self._paused():
                out = self.engine.generate(
                    prompts,
                    n=meta[N_SAMPLES],
                    sampling=sampling_for(self.config, meta),
                    greedy=meta[GREEDY],
                    seed=self._seed(meta),
                    stop_token_ids=stops,
                )
        out.meta_info[WEIGHT_VERSION] = self.engine.weight_version
        return out

    @register(dispatch=DP_COMPUTE_PROTO, reads=SEQUENCE_COLUMNS)
    def generate_stream(self, prompts: DataProto) -> DataProto:
        """Submit ``prompts`` (``meta_info``: ``n``, ``seed``, ``request``: the batch index, which is also the
        weight version a ``batch`` swap holds for it) to the stream, where they wait to be named
        (:meth:`admit_requests`, or with the weights :meth:`receive_weights` brings), and wait for their rollout:
        the columns of :meth:`generate_sequences` plus ``rollout_versions`` (each token's weight version, which the
        driver checks against its staleness bound)."""
        self._refuse_a_broken_sync()
        meta, stream = prompts.meta_info, self._running_stream()
        request = int(meta[STREAM_REQUEST])
        stream.submit(request, prompts, self._seed(meta), named=True, holds_version=request)
        return stream.take(request)

    @register(dispatch=ONE_TO_ALL, reads=())
    def admit_requests(self, requests: list[int]) -> None:
        """Name stream requests for admission with the current weights: they enter the decoder together, before its
        next step, however their ``generate_stream`` calls arrive."""
        self._running_stream().admit(requests)

    def _running_stream(self) -> RolloutStream:
        if self.stream is None:
            raise RuntimeError(f"trainer.rollout_mode={self.config.trainer.rollout_mode!r} streams nothing")
        return self.stream

    def _new_stream(self, n: int) -> RolloutStream:
        rows = self.dims.rows_per_step // self.dims.rollout.dp  # one step's rows on this rank
        # by default a slot for every row that may be in flight: this step's and those submitted ahead
        slots = self.config.actor_rollout_ref.rollout.max_num_seqs or rows * (1 + self.config.trainer.batches_ahead())
        stream = self.engine.stream(n, slots, sampling_for(self.config, {}), swap_point(self.config.trainer))
        stream.set_version(self.engine.weight_version)
        return stream

    def _refuse_a_broken_sync(self) -> None:
        if self.broken_sync is not None:
            raise WeightSyncError(
                f"rollout rank {self.rank} generates nothing after a failed weight sync: {self.broken_sync}"
            )

    def _paused(self, weights: bool = False) -> AbstractContextManager:
        return self.stream.paused(weights) if self.stream is not None else nullcontext()

    def _seed(self, meta: dict[str, Any]) -> int:
        return call_seed(meta, self.dp_layout().dp_rank)

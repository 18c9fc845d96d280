"""The rollout worker: the policy's rollout layout on ranks of its own (``trainer.placement=split``).

It holds only what generation needs: this rank's tensor-parallel block of
the policy (``workers/rollout/tensor_parallel.py``) and the built-in engine, or
this rank's vLLM engine (``rollout.name=vllm``), and one end of the weight
transfer (``core/weight_transfer.py``). It never loads
a checkpoint: the weights arrive from the trainer's ranks, versioned, right
after start and after every update, and each generation reports the version
it sampled with. Besides plain generation calls it runs a
:class:`~hybridflow.workers.rollout.stream.RolloutStream` for the pipelined
modes (``trainer.rollout_mode``): ``generate_stream`` calls may be in flight
several at once (the group's actors are threaded) and all decode in one
loop that keeps its row slots full. With vLLM that loop steps vLLM's own
engine (``workers/rollout/vllm_stream.py``), and every call joins it.
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
from hybridflow.core.weight_transfer import WeightTransfer
from hybridflow.workers.models import load_model_config, load_tokenizer, torch_dtype
from hybridflow.workers.rollout.engine import EngineConfig, RolloutEngine
from hybridflow.workers.rollout.stream import RolloutStream
from hybridflow.workers.rollout.tensor_parallel import build_tp_rollout_model
from hybridflow.workers.rollout.tp_plan import rollout_slice
from hybridflow.workers.rollout.vllm_stream import VLLMCall, VLLMDecoder

SWAP_FOR_MODE = {"async": "step", "one_step_off": "drained"}
"""When a stream lets new weights in, per pipelined ``trainer.rollout_mode`` (``workers/rollout/stream.py``)."""


def sampling_for(config: PPOConfig, meta: dict[str, Any]) -> SamplingParams:
    """The rollout's sampling for one call: ``meta["max_new_tokens"]`` (an agent loop's turn) within
    ``rollout.response_length``."""
    rollout = config.actor_rollout_ref.rollout
    steps = min(int(meta.get(MAX_NEW_TOKENS, rollout.response_length)), rollout.response_length)
    return SamplingParams(
        temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k, max_new_tokens=steps
    )


def builtin_engine(model: torch.nn.Module, tokenizer: Any, rollout: Any, device: torch.device) -> RolloutEngine:
    """The built-in engine over ``model`` with the rollout config's row bounds; on a GPU its KV cache is bounded
    by ``rollout.gpu_memory_utilization`` of the device (none on a CPU)."""
    budget = None
    if device.type == "cuda":
        budget = int(rollout.gpu_memory_utilization * torch.cuda.get_device_properties(device).total_memory)
    return RolloutEngine(
        model,
        tokenizer,
        EngineConfig(max_kv_cache_bytes=budget, max_num_seqs=rollout.max_num_seqs, refill=rollout.refill),
    )


def vllm_engine(
    config: PPOConfig, dims: ParallelDims, tokenizer: Any, *, batches: int = 1, stepwise: bool = False
) -> Any:
    """This rank's vLLM engine (``rollout.name=vllm``; collective over the rank's torch.distributed world), built
    with dummy weights: the first push fills them. Its KV cache on a CPU holds ``batches`` steps' rows of this
    rank (or ``rollout.max_num_seqs`` rows) at full length; vLLM queues what does not fit. ``stepwise``: a
    stream steps it (:func:`~hybridflow.workers.rollout.vllm_engine.vllm_engine_kwargs`)."""
    from hybridflow.workers.rollout.vllm_engine import VLLMRolloutEngine  # noqa: PLC0415 - imports vLLM when built

    arr = config.actor_rollout_ref
    rows = arr.rollout.max_num_seqs or batches * dims.rows_per_step // dims.rollout.dp
    return VLLMRolloutEngine.create(
        arr.model.path,
        tokenizer,
        arr.rollout,
        dims.rollout.tp,
        device=config.trainer.device,
        rows=rows,
        max_model_len=config.data.max_prompt_length + arr.rollout.response_length,
        dtype=arr.actor.fsdp_config.compute_dtype(arr.model),
        seed=config.trainer.seed,
        stepwise=stepwise,
    )


def call_seed(meta: dict[str, Any], dp_rank: int) -> int:
    """The sampling seed of one generation call on rollout dp rank ``dp_rank`` (tp peers share it)."""
    return meta[SEED] * 1_000_003 + dp_rank


def block_writer(params: dict[str, torch.Tensor], hf_config: Any, tp_rank: int, tp_size: int):
    """``write(name, full)`` for :meth:`WeightTransfer.receive`: copy tp rank ``tp_rank``'s block of the full
    weight into the rollout parameter ``name`` (in place: the engine keeps seeing the same tensors)."""

    def write(name: str, full: torch.Tensor) -> None:
        params[name].copy_(rollout_slice(name, tuple(full.shape), hf_config, tp_rank, tp_size).take(full))

    return write


class RolloutWorker(Worker):
    """Generation of the policy on one rank of the rollout's own pool."""

    def __init__(self, config: PPOConfig, dims: ParallelDims) -> None:
        super().__init__()
        self.config, self.dims = config, dims
        self.init_device_mesh(*dims.rollout.mesh)
        self.tp_size = dims.rollout.tp
        self.version = -1  # no weights yet
        self.transfer: WeightTransfer | None = None
        self.stream: RolloutStream | None = None
        self.use_vllm = config.actor_rollout_ref.rollout.name == "vllm"
        self._calls = itertools.count(-1, -1)  # stream ids of generate_sequences calls, apart from the driver's

    @property
    def tp_rank(self) -> int:
        """This rank's position in its rollout tensor-parallel group."""
        return self.device_mesh.get_local_rank("tp") if self.tp_size > 1 else 0

    @register(dispatch=ONE_TO_ALL, reads=())
    def init_model(self) -> None:
        """Build this rank's block of the policy (zeros until the first weight transfer) and the engine; with
        ``rollout.name=vllm``, this rank's vLLM engine (dummy weights until the first transfer) and, for a
        pipelined ``trainer.rollout_mode``, the stream that steps it."""
        arr = self.config.actor_rollout_ref
        self.tokenizer = load_tokenizer(arr.model.path)
        self.hf_config = load_model_config(arr.model.path)
        if self.use_vllm:
            pipelined = self.config.trainer.rollout_mode in SWAP_FOR_MODE
            self.engine = vllm_engine(
                self.config,
                self.dims,
                self.tokenizer,
                stepwise=pipelined,
                batches=1 + self.config.trainer.batches_ahead(),
            )
            if pipelined:  # every call goes through the stream: it alone steps the engine
                self._stream(arr.rollout.n)
            return
        tp_group = self.device_mesh.get_group("tp") if self.tp_size > 1 else None
        model = build_tp_rollout_model(
            self.hf_config,
            tp_group,
            self.tp_rank,
            self.tp_size,
            dtype=torch_dtype(arr.actor.fsdp_config.compute_dtype(arr.model)),
            device=self.device,
        )
        self.params = dict(model.named_parameters())
        self.engine = builtin_engine(model, self.tokenizer, arr.rollout, self.device)

    @register(dispatch=ONE_TO_ALL, reads=())
    def tokenizer_info(self) -> dict[str, Any]:
        """The pad token id the driver pads prompts with, the engine's first EOS id and all of them."""
        return {
            "pad_token_id": self.engine.pad_token_id,
            "eos_token_id": self.engine.eos_token_ids[0],
            "eos_token_ids": list(self.engine.eos_token_ids),
        }

    @register(dispatch=ONE_TO_ALL, reads=())
    def join_weight_transfer(self, host: str, port: int, members: int) -> None:
        """Join the trainer-to-rollout group as member ``1 + rank`` (with the trainer's ``join_weight_transfer``)."""
        self.transfer = WeightTransfer(
            host, port, 1 + self.rank, members, self.device, timeout_s=self.config.trainer.timeouts.weight_sync_s
        )
        self.transfer.read_manifest()

    @register(dispatch=ONE_TO_ALL, reads=())
    def receive_weights(self) -> dict[str, float]:
        """Receive one transfer into the rollout blocks (with the trainer's ``send_weights``); its ``weight_sync/*``
        metrics. Inside a running stream it waits for the stream's swap point (``stream.paused``)."""
        bucket = int(self.config.actor_rollout_ref.rollout.reshard_bucket_mb * 2**20)
        with torch.no_grad(), self._paused():
            if self.use_vllm:  # vLLM pulls each weight from the transfer into its in-place reload
                incoming = self.transfer.incoming(bucket)
                self.engine.update_weights(
                    incoming, version=incoming.version, requests_in_flight=self.stream is not None
                )
                stats = incoming.stats()
            else:
                stats = self.transfer.receive(
                    block_writer(self.params, self.hf_config, self.tp_rank, self.tp_size), bucket
                )
            self.version = stats.version
            if self.stream is not None:
                self.stream.set_version(stats.version)
        return stats.metrics()

    @register(dispatch=DP_COMPUTE_PROTO, reads=SEQUENCE_COLUMNS)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """One generation call, as the actor's (``meta_info``: ``n``, ``greedy``, ``seed``, optionally
        ``max_new_tokens``, ``stop_token_ids``); a running stream pauses for it."""
        meta = prompts.meta_info
        stops = tuple(meta.get(STOP_TOKEN_IDS, ()))
        if self.use_vllm and self.stream is not None:  # vLLM's engine is the stream's: the call joins its loop
            request = next(self._calls)
            call = VLLMCall(greedy=meta[GREEDY], sampling=sampling_for(self.config, meta), stop_token_ids=stops)
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
        out.meta_info[WEIGHT_VERSION] = self.version
        return out

    @register(dispatch=DP_COMPUTE_PROTO, reads=SEQUENCE_COLUMNS)
    def generate_stream(self, prompts: DataProto) -> DataProto:
        """Submit ``prompts`` (``meta_info``: ``n``, ``seed``, ``request``: a unique id) to the stream and wait for
        their rollout: the columns of :meth:`generate_sequences` plus ``rollout_versions`` (each token's weight
        version, which the driver checks against its staleness bound)."""
        meta = prompts.meta_info
        stream = self._stream(meta[N_SAMPLES])
        stream.submit(int(meta[STREAM_REQUEST]), prompts, self._seed(meta))
        return stream.take(int(meta[STREAM_REQUEST]))

    def _stream(self, n: int) -> RolloutStream:
        if self.stream is None and self.use_vllm:
            decoder = VLLMDecoder(self.engine, n, sampling_for(self.config, {}))
            self.stream = RolloutStream(decoder, n, SWAP_FOR_MODE[self.config.trainer.rollout_mode])
            self.stream.set_version(self.version)
        if self.stream is None:
            rows = self.dims.rows_per_step // self.dims.rollout.dp  # one step's rows on this rank
            # by default a slot for every row that may be in flight: this step's and those submitted ahead
            slots = self.config.actor_rollout_ref.rollout.max_num_seqs or rows * (
                1 + self.config.trainer.batches_ahead()
            )
            sampling = sampling_for(self.config, {})
            bound = self.engine._rows_at_once(self.config.data.max_prompt_length + 2 * sampling.max_new_tokens)
            slots = max(n, min(slots, bound) if bound is not None else slots)
            self.stream = RolloutStream.builtin(
                self.engine, slots, n, sampling, SWAP_FOR_MODE[self.config.trainer.rollout_mode]
            )
            self.stream.set_version(self.version)
        return self.stream

    def _paused(self) -> AbstractContextManager:
        return self.stream.paused() if self.stream is not None else nullcontext()

    def _seed(self, meta: dict[str, Any]) -> int:
        return call_seed(meta, self.dp_layout().dp_rank)

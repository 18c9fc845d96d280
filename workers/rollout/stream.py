"""A streaming rollout: one decode loop in a thread, fed requests, weights swapped between steps.

With the rollout on its own ranks (``trainer.placement=split``) the engine
need not stop at the end of a batch: the driver submits the next batches'
prompts ahead (``trainer.rollout_mode``), and one :class:`SlotDecoder` keeps
its row slots full across batches, so a batch's long tail decodes beside the
next batch's first tokens instead of in a nearly empty batch::

    driver:   submit(b1) submit(b2)      take(b1)  [train b1]  sync v1  submit(b3)  take(b2) ...
    thread:   [b1 b1 b1 b1 b1 b2 b2 b2] [b1 b2 b2 b2 b2 b2 b2 b3] ...   (slots over time)
                                            ^ v1 arrives between two steps: later tokens carry version 1

New weights are written while the thread holds no step (:meth:`RolloutStream.paused`),
at the stream's swap point (:data:`SWAP_POINTS`): in ``async`` mode between any
two decode steps (a sample in flight continues under the new weights, each
token stamped with the version whose forward sampled it: ``rollout_versions``),
or, reproducibly, once the batch the trainer takes next has finished (``batch``);
in ``one_step_off`` mode only once the decoder has run dry, so every sample
comes from one version.

The driver's batches are *named* requests: each waits until the driver names it
for admission (:meth:`RolloutStream.admit`, or with the weights it must not
predate: :meth:`RolloutStream.set_version`), and the requests named together
enter the decoder together, before its next step, however their calls
arrived. With the ``drained`` or ``batch`` swap the decoder's steps are then a
function of the requests alone, not of when the calls and weights arrived: a
run repeats bitwise where the model's arithmetic does.

Each sample's randomness is its own (keyed by its request's seed, its prompt
and sample index: ``workers/rollout/sampling.py``), so a request samples what
:meth:`BuiltinEngine.generate` samples for the same call, whatever else the
stream decodes beside it (up to float rounding of other batch shapes).

The stream drives any decoder with :class:`SlotDecoder`'s shape (``add``,
``step``, ``busy``, ``version``, ``slot_utilization``): the built-in engine's
(:meth:`RolloutStream.builtin`) or vLLM's own continuous batching
(:class:`~hybridflow.workers.rollout.vllm_stream.VLLMDecoder`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from hybridflow.core.data_proto import DataProto
from hybridflow.core.keys import ATTENTION_MASK, INPUT_IDS, METRICS, POSITION_IDS, ROLLOUT_VERSIONS
from hybridflow.core.rollout_batch import positions_from_mask
from hybridflow.core.sampling import SamplingParams
from hybridflow.workers.rollout.continuous import SlotDecoder
from hybridflow.workers.rollout.engine import BuiltinEngine, assemble_rollout
from hybridflow.workers.rollout.sampling import prompt_keys

__all__ = ["BuiltinDecoder", "RolloutStream", "StreamCall", "SWAP_POINTS"]

SWAP_POINTS = ("step", "batch", "drained")
"""When new weights may enter: between any two decode steps (``async``); once every request that holds the
incoming version has finished, the decoder stopping there until they come (``async``, reproducible); only when
nothing decodes (``one_step_off``)."""


@dataclass(frozen=True)
class StreamCall:
    """A stream request's options other than the training rollout's, for an engine whose stream takes every call
    (``generates_through_stream``): greedy decoding (one request per prompt, its response repeated ``n`` times,
    as ``generate`` does), the sampling and extra stop tokens."""

    greedy: bool = False
    sampling: SamplingParams | None = None
    stop_token_ids: tuple[int, ...] = ()


@dataclass
class _Request:
    """One submitted batch of prompts, its samples per prompt and call options, and what has come back of its rows."""

    prompts: DataProto
    seed: int
    n: int
    call: Any = None
    named: bool = False  # admitted once named (a driver's batch), else on arrival (a generation call)
    holds_version: int | None = None  # the ``batch`` swap to this version waits for this request to finish
    admitted: bool = False  # in the decoder (one waiting to be named enters with a swap: it holds none before)
    submitted: float = field(default_factory=time.perf_counter)
    done: int = 0
    rows: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]] = field(default_factory=dict)


class RolloutStream:
    """Decodes submitted requests in a background thread (see the module docstring).

    :param decoder: what the thread steps: :class:`SlotDecoder`'s interface, with ``add`` taking each request's
        seed and call options (:meth:`builtin` builds the built-in engine's).
    :param n: samples per prompt (a request may ask for others, where its decoder takes call options).
    :param swap: one of :data:`SWAP_POINTS`.
    """

    def __init__(self, decoder: Any, n: int, swap: str = "step") -> None:
        if swap not in SWAP_POINTS:
            raise ValueError(f"swap={swap!r}; allowed: {', '.join(SWAP_POINTS)}")
        self.n, self.swap = n, swap
        self.decoder = decoder
        self.requests: dict[int, _Request] = {}
        self.inbox: deque[int] = deque()  # arrived, not yet in the decoder
        self.named: set[int] = set()  # named for admission, not yet in the decoder
        self.lock = threading.Lock()  # held by the thread for each step; paused() takes it
        self.pausers = 0  # paused() calls waiting: the thread lets them in before its next step
        self.wake = threading.Condition(threading.Lock())  # new requests, finished requests, stop
        self.idle_s = 0.0  # time the thread had nothing to decode, since the last take
        self.error: BaseException | None = None
        self.stopping = False
        self.thread = threading.Thread(target=self._run, name="rollout-stream", daemon=True)
        self.thread.start()

    @classmethod
    def builtin(
        cls, engine: BuiltinEngine, slots: int, n: int, sampling: SamplingParams, swap: str = "step"
    ) -> RolloutStream:
        """A stream over the built-in engine's model: a :class:`SlotDecoder` of ``slots`` row slots
        (``rollout.max_num_seqs``) with the training rollout's sampling (temperature, top-p, top-k,
        ``max_new_tokens``)."""
        return cls(BuiltinDecoder(engine, slots, n, sampling), n, swap)

    @property
    def version(self) -> int:
        """The weight version the decoder samples with."""
        return self.decoder.version

    def submit(
        self,
        request_id: int,
        prompts: DataProto,
        seed: int,
        *,
        n: int | None = None,
        call: Any = None,
        named: bool = False,
        holds_version: int | None = None,
    ) -> None:
        """Queue ``prompts`` (``input_ids``, ``attention_mask``, left-padded) under ``request_id``: ``n`` samples
        each (the stream's by default) with the decoder's call options ``call`` (None: the training rollout's).
        ``named``: it waits for :meth:`admit` or :meth:`set_version` to name it; ``holds_version``: a ``batch``
        swap to that version waits for it to finish."""
        with self.wake:
            request = _Request(prompts, seed, self.n if n is None else n, call, named, holds_version)
            self.requests[request_id] = request
            self.inbox.append(request_id)
            self.wake.notify_all()

    def take(self, request_id: int, timeout_s: float | None = None) -> DataProto:
        """Wait for every row of ``request_id``; its rollout (the columns :meth:`BuiltinEngine.generate`
        returns, plus ``rollout_versions``) with ``rollout/*`` metrics: ``rollout/stream_idle_s`` is the time the
        thread had nothing to decode since the previous take, ``rollout/slot_utilization`` the live share of the
        slots over the stream's life."""
        request = self.requests[request_id]
        rows = len(request.prompts) * request.n
        with self.wake:
            if not self.wake.wait_for(lambda: self.error is not None or request.done == rows, timeout_s):
                raise TimeoutError(f"rollout request {request_id} not finished after {timeout_s} s")
            if self.error is not None:
                raise RuntimeError("the rollout stream's decode thread failed") from self.error
            del self.requests[request_id]
            idle, self.idle_s = self.idle_s, 0.0
        out = self._assemble(request)
        metrics = dict(out.meta_info.get(METRICS, {}))
        metrics.update(
            {
                "rollout/stream_idle_s": idle,
                "rollout/latency_s": time.perf_counter() - request.submitted,
                "rollout/slot_utilization": self.decoder.slot_utilization(),
            }
        )
        out.meta_info[METRICS] = metrics
        return out

    @contextmanager
    def paused(self, weights: bool = False) -> Iterator[None]:
        """No decode step runs inside; write new weights (``weights``) here, then :meth:`set_version`. Waits for the
        swap point: ``drained``, until no row is resident or admissible (for any pause); ``batch``, for
        weights, until every request holding the next version has finished (the decoder waits there)."""
        may = lambda: self._may_pause(weights) or self.error is not None or self.stopping  # noqa: E731
        while True:
            with self.wake:
                if not self.wake.wait_for(may, 0.05):
                    continue
                self.pausers += 1  # the thread lets it in before its next step
            self.lock.acquire()
            with self.wake:  # again, with no step under way (the decoder's state is read mid-step otherwise)
                if may():
                    break
                self.pausers -= 1
            self.lock.release()
        try:
            yield
        finally:
            self.lock.release()
            with self.wake:
                self.pausers -= 1
                self.wake.notify_all()

    def _may_pause(self, weights: bool) -> bool:
        if self.swap == "drained":
            return not self._work_left()
        if self.swap == "batch" and weights:
            return self._next_version_free()
        return True

    def _holding_next(self) -> list[_Request]:
        """The requests in the decoder a ``batch`` swap to the next version waits for."""
        return [r for r in self.requests.values() if r.admitted and r.holds_version == self.decoder.version + 1]

    def _next_version_free(self) -> bool:
        """Every request in the decoder that holds the next version has finished (vacuously, where none does)."""
        return all(r.done == len(r.prompts) * r.n for r in self._holding_next())

    def _at_fence(self) -> bool:
        """``batch``: the requests holding the next version have finished, so no step runs until it comes."""
        if self.swap != "batch":
            return False
        with self.wake:
            return bool(self._holding_next()) and self._next_version_free()

    def _work_left(self) -> bool:
        return self.decoder.busy or bool(self._admissible())

    def _admissible(self) -> list[int]:
        """Arrived requests that may enter the decoder now: the named ones in id order, then the others as they
        came."""
        named = sorted(i for i in self.inbox if i in self.named)
        return named + [i for i in self.inbox if not self.requests[i].named]

    def admit(self, request_ids: Iterator[int] | list[int]) -> None:
        """Name requests for admission: they enter the decoder together before its next step (it waits for any
        whose call has not arrived)."""
        with self.wake:
            self.named.update(request_ids)
            self.wake.notify_all()

    def set_version(self, version: int, admit: list[int] | tuple[int, ...] = ()) -> None:
        """Tokens sampled from now on carry ``version``, and the requests ``admit`` names enter with it (call inside
        :meth:`paused`, after writing the weights)."""
        with self.wake:
            self.decoder.version = version
            self.named.update(admit)
            self.wake.notify_all()

    def close(self) -> None:
        """Stop the thread (requests still in flight are dropped)."""
        with self.wake:
            self.stopping = True
            self.wake.notify_all()
        self.thread.join(timeout=10)

    # ------------------------------------------------------------ thread
    def _run(self) -> None:
        try:
            with torch.no_grad():
                while not self.stopping:
                    if not self._feed():
                        continue
                    if self._at_fence():  # reproducible: nothing decodes past it under the old weights
                        with self.wake:
                            self.wake.wait(0.05)
                        continue
                    if self.pausers:  # let a pause in before this step
                        with self.wake:
                            self.wake.wait_for(lambda: not self.pausers or self.stopping, 0.05)
                    with self.lock:
                        finished = self.decoder.step()
                    if finished is not None:
                        self._collect(finished)
        except BaseException as err:  # noqa: BLE001 - reported to the taker
            with self.wake:
                self.error = err
                self.wake.notify_all()

    def _feed(self) -> bool:
        """Move admissible requests into the decoder; wait (counted as idle) while there is nothing to decode or a
        named request has not arrived (those named together enter together)."""
        with self.wake:
            missing = any(i not in self.requests for i in self.named)
            admissible = [] if missing else self._admissible()
            if missing or (not admissible and not self.decoder.busy):
                start = time.perf_counter()
                self.wake.wait(0.05)
                self.idle_s += time.perf_counter() - start
                return False
            for request_id in admissible:
                self.inbox.remove(request_id)
                self.named.discard(request_id)
                self.requests[request_id].admitted = True
        for request_id in admissible:
            request = self.requests[request_id]
            with self.lock:
                batch = request.prompts.batch
                mask = batch[ATTENTION_MASK]
                positions = batch.get(POSITION_IDS)
                positions = positions_from_mask(mask) if positions is None else positions
                self.decoder.add(
                    batch[INPUT_IDS],
                    mask,
                    positions,
                    [(request_id, i) for i in range(len(request.prompts))],
                    seed=request.seed,
                    n=request.n,
                    call=request.call,
                )
        return True

    def _collect(self, finished) -> None:
        with self.wake:
            for k, (request_id, prompt) in enumerate(finished.tags):
                request = self.requests.get(request_id)
                if request is None:
                    continue
                sample = int(finished.samples[k])
                request.rows[prompt * request.n + sample] = (
                    finished.tokens[k],
                    finished.log_probs[k],
                    finished.versions[k],
                    int(finished.lengths[k]),
                )
                request.done += 1
            self.wake.notify_all()

    def _assemble(self, request: _Request) -> DataProto:
        prompts = request.prompts
        order = [request.rows[i] for i in range(len(prompts) * request.n)]
        responses, log_probs, versions = (torch.stack([row[k] for row in order]) for k in range(3))
        lengths = torch.tensor([row[3] for row in order], device=responses.device)
        mask = prompts.batch[ATTENTION_MASK]
        positions = prompts.batch.get(POSITION_IDS)
        positions = positions_from_mask(mask) if positions is None else positions
        out = assemble_rollout(
            prompts, request.n, prompts.batch[INPUT_IDS], mask, positions, responses, log_probs, lengths
        )
        steps = torch.arange(responses.shape[1], device=responses.device)
        out.batch[ROLLOUT_VERSIONS] = torch.where(steps[None] < lengths[:, None], versions, -1)
        out.meta_info[METRICS] = {"rollout/generated_tokens": int(lengths.sum())}
        return out


class BuiltinDecoder(SlotDecoder):
    """The built-in engine's :class:`SlotDecoder` as a stream's decoder, the training rollout's sampling only: a
    request seeded ``seed`` keys prompt ``i``'s sample ``j`` ``seed + i*n + j``, as a call of its own would."""

    def __init__(self, engine: BuiltinEngine, slots: int, n: int, sampling: SamplingParams) -> None:
        super().__init__(engine, slots, n, sampling, False, sampling.stop_ids(engine.eos_token_ids))

    def add(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        positions: torch.Tensor,
        tags: list[Any],
        *,
        seed: int,
        n: int | None = None,
        call: Any = None,
    ) -> None:
        """Queue prompt rows as :meth:`SlotDecoder.add`, keyed by ``seed``. A request for other samples per
        prompt or other options is refused: the slots decode one sampling."""
        if call is not None or (n is not None and n != self.n):
            raise ValueError(
                "the built-in stream decodes the training rollout's sampling only; generate other calls "
                "with the engine (RolloutWorker.generate_sequences)"
            )
        super().add(input_ids, attention_mask, positions, tags, prompt_keys(seed, len(tags), self.n))

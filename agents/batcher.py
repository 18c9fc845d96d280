"""Many agent loops, one engine: concurrent generate requests become batched rollout calls.

Each loop awaits :meth:`GenerationBatcher.generate` for one prompt at a time.
The batcher holds the requests until every loop it was told about is waiting
(:meth:`GenerationBatcher.expect`), or until none has arrived for
``max_wait_s`` (loops busy in a tool, or an HTTP server's unknown clients,
whose requests trickle in), then
sends all of them as one left-padded batch to ``generate_fn``, the rollout
worker group's ``generate_sequences`` (run in a thread, so the event loop
keeps serving loops and HTTP requests meanwhile). Requests that arrive while
a call runs go in the next one. Each call draws its own seed from the
rollout's (``seed + call index``), so a rollout whose calls batch the same
way samples the same tokens.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from hybridflow.agents.client import Completion
from hybridflow.core.data_proto import DataProto
from hybridflow.core.keys import ATTENTION_MASK, INPUT_IDS, POSITION_IDS, RESPONSE_MASK, RESPONSES, ROLLOUT_LOG_PROBS
from hybridflow.core.rollout_batch import left_pad

__all__ = ["BatcherStats", "GenerationBatcher"]

logger = logging.getLogger(__name__)


@dataclass
class BatcherStats:
    """What the batcher did since it was made."""

    calls: int = 0
    requests: int = 0
    generated_tokens: int = 0
    generate_s: float = 0.0
    weight_versions: set[int] = field(default_factory=set)

    def metrics(self) -> dict[str, float]:
        """``agent/generate_calls``, ``agent/requests_per_call`` and ``agent/generate_s``."""
        return {
            "agent/generate_calls": float(self.calls),
            "agent/requests_per_call": self.requests / max(self.calls, 1),
            "agent/generate_s": self.generate_s,
        }


@dataclass
class _Request:
    prompt_ids: list[int]
    max_tokens: int
    stop_token_ids: tuple[int, ...]
    future: asyncio.Future


class GenerationBatcher:
    """A :class:`hybridflow.agents.client.PolicyClient` that batches concurrent requests (module docstring).

    :param generate_fn: ``DataProto -> DataProto``: takes ``input_ids`` / ``attention_mask`` (B, P) and
        ``meta_info`` ``n`` (1), ``greedy``, ``seed``, ``max_new_tokens``, ``stop_token_ids``; returns B rows
        with ``responses``, ``response_mask`` and ``rollout_log_probs`` (T), ``meta_info["weight_version"]``.
    :param pad_token_id: pads prompts on the left.
    :param eos_token_ids: the tokens the engine ends a response with (to tell ``"stop"`` from ``"length"``).
    :param greedy: argmax decoding for every request (validation).
    :param seed: the rollout's seed; call ``k`` uses ``seed + k``.
    :param max_wait_s: a batch goes once no request has arrived for this long...
    :param max_batch_wait_s: ... or this long after its first request, whichever is first.
    """

    def __init__(
        self, generate_fn: Callable[[DataProto], DataProto], pad_token_id: int, eos_token_ids: Sequence[int], *,
        greedy: bool = False, seed: int = 0, max_wait_s: float = 0.01, max_batch_wait_s: float = 1.0,
    ) -> None:
        self.generate_fn, self.pad_token_id = generate_fn, pad_token_id
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.greedy, self.seed, self.max_wait_s, self.max_batch_wait_s = greedy, seed, max_wait_s, max_batch_wait_s
        self.stats = BatcherStats()
        self._pending: list[_Request] = []
        self._expected = 0
        self._wake: asyncio.Event | None = None
        self._runner: asyncio.Task | None = None

    def expect(self, count: int) -> None:
        """Tell the batcher how many loops are live: once that many requests wait, they go at once."""
        self._expected = max(0, count)
        if self._wake is not None:
            self._wake.set()

    async def generate(
        self, prompt_ids: Sequence[int], *, max_tokens: int, stop_token_ids: Sequence[int] = ()
    ) -> Completion:
        """See :meth:`hybridflow.agents.client.PolicyClient.generate`."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if not prompt_ids:
            raise ValueError("a generate request needs at least one prompt token")
        loop = asyncio.get_running_loop()
        if self._runner is None or self._runner.done():
            self._wake = asyncio.Event()
            self._runner = loop.create_task(self._dispatch_forever())
        request = _Request(list(prompt_ids), int(max_tokens), tuple(int(t) for t in stop_token_ids), loop.create_future())
        self._pending.append(request)
        self._wake.set()
        return await request.future

    async def close(self) -> None:
        """Stop the dispatcher (pending requests fail)."""
        if self._runner is not None:
            self._runner.cancel()
            try:
                await self._runner
            except asyncio.CancelledError:
                pass
            self._runner = None
        for request in self._pending:
            if not request.future.done():
                request.future.set_exception(RuntimeError("the generation batcher was closed"))
        self._pending.clear()

    # ------------------------------------------------------------ dispatch
    async def _dispatch_forever(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._pending:
                continue
            # wait while requests keep coming (a gap of max_wait_s ends it), at most max_batch_wait_s in all
            first = time.monotonic()
            deadline = first + self.max_wait_s
            while len(self._pending) < self._expected and (left := deadline - time.monotonic()) > 0:
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=left)
                except TimeoutError:
                    break
                self._wake.clear()
                deadline = min(time.monotonic() + self.max_wait_s, first + self.max_batch_wait_s)
            batch, self._pending = self._pending, []
            await self._run(batch)
            if self._pending:
                self._wake.set()

    async def _run(self, batch: list[_Request]) -> None:
        groups: dict[tuple[int, ...], list[_Request]] = {}
        for request in batch:  # one call per stop set: a call has one
            groups.setdefault(request.stop_token_ids, []).append(request)
        for stops, requests in groups.items():
            try:
                completions = await asyncio.to_thread(self._call, requests, stops)
            except Exception as exc:  # every waiting loop learns of it
                for request in requests:
                    if not request.future.done():
                        request.future.set_exception(exc)
                continue
            for request, completion in zip(requests, completions):
                if not request.future.done():
                    request.future.set_result(completion)

    def _call(self, requests: list[_Request], stops: tuple[int, ...]) -> list[Completion]:
        input_ids, attention_mask, positions = left_pad([r.prompt_ids for r in requests], self.pad_token_id)
        steps = max(r.max_tokens for r in requests)
        meta = {"n": 1, "greedy": self.greedy, "seed": self.seed + self.stats.calls, "max_new_tokens": steps,
                "stop_token_ids": list(stops)}
        start = time.perf_counter()
        prompts = {INPUT_IDS: input_ids, ATTENTION_MASK: attention_mask, POSITION_IDS: positions}
        out = self.generate_fn(DataProto.from_dict(prompts, meta_info=meta))
        self.stats.generate_s += time.perf_counter() - start
        self.stats.calls += 1
        self.stats.requests += len(requests)
        version = out.meta_info.get("weight_version")
        if version is not None:
            self.stats.weight_versions.add(int(version))
        lengths = out.batch[RESPONSE_MASK].sum(-1).tolist()
        enders = set(self.eos_token_ids) | set(stops)
        completions = []
        for i, request in enumerate(requests):
            length = min(int(lengths[i]), request.max_tokens)  # a shorter request's row is cut to its own limit
            ids = out.batch[RESPONSES][i, :length].tolist()
            log_probs = out.batch[ROLLOUT_LOG_PROBS][i, :length].tolist()
            # the engine stops a row only on an EOS or stop token, so the last token tells why it ended
            reason = "stop" if ids and ids[-1] in enders else "length"
            completions.append(Completion(ids, log_probs, reason, version))
            self.stats.generated_tokens += length
        return completions

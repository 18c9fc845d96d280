"""An OpenAI-compatible HTTP server in front of the rollout: agent frameworks and vLLM clients sample the policy.

::

    HTTP clients (openai, CompletionsClient, curl)   the server's thread: its own asyncio loop
        |  POST /v1/completions, /v1/chat/completions  -> parse, tokenize (text -> token ids)
        v
    one GenerationBatcher per sampling stream (greedy | the server's seed | a request's seed)
        |  gathers concurrent requests for max_wait_s, then one left-padded batch;
        |  at most max_tokens_per_call tokens of a request per call, then it queues again
        v
    generate_fn (the rollout worker group's generate_sequences), one call at a time
        -> token ids + per-token log-probs back to each request, decoded for ``text``

**Which requests share a call.** An engine call has one ``greedy`` flag and one
seed, so requests are grouped into streams, each with its own
:class:`~hybridflow.agents.batcher.GenerationBatcher`: ``temperature: 0`` is
greedy (one stream, seeds do not matter); a sampled request with ``seed: s``
goes in stream ``s``; a sampled request without a seed in the server's own
stream (the constructor's ``seed``). As in the direct rollout, a stream's
call ``k`` is seeded ``seed + k``: a server-mode rollout samples the same
tokens as the direct :class:`GenerationBatcher` of the same seed whenever the
calls batch the same way, and the first request of seed ``s`` samples exactly
what ``BuiltinEngine.generate(..., seed=s)`` does for its prompt if it fits in
one call (``max_tokens <= max_tokens_per_call``; see below). A later
request with the same seed continues the stream (it is not OpenAI's "same
seed, same answer"). The most recent ``MAX_SEED_STREAMS`` seeds are kept.
Streams, and the ``stop_token_ids`` sets within one (the batcher's rule),
never mix in one call; calls run one at a time.

**Long requests take turns.** A call generates at most ``max_tokens_per_call``
(64) tokens of a request: a longer one is generated in slices, going back in
its stream's queue after each, so a short request that arrives while it runs
waits for one slice, not for its whole ``max_tokens``, and shares the next
call (the batcher's module docstring). Its answer is its slices joined, as one
call would give it: greedy tokens are the same; a sampled request's slices
are calls of their own, seeded ``seed + k`` each, so it differs from one call's
sample of the same seed; ``weight_version`` is the oldest of its slices'. The
cost: each slice re-reads the context (the engine keeps no KV cache between
calls). Streams take the engine in turns too, one call at a time.

**A client that disconnects is cancelled** (aiohttp's ``handler_cancellation``):
its request is dropped from the queue, and gets no further slice; the slice
already in the engine finishes (a call cannot be interrupted). ``/health``
never waits on the engine or the tokenizer: both run in worker threads, the
server's loop only parses JSON and answers.

**Sampling settings are the trainer's.** Only ``temperature`` 0 versus
anything else matters: a sampled request is sampled at the rollout's
temperature / top-p / top-k, whatever it asks (``top_p`` and the other
sampling fields are ignored). Log-probs are the rollout's
(``log_softmax(logits / rollout temperature)`` of the sampled token, what the
trainer's importance ratio uses; temperature 1 when greedy), and only the
sampled token's: ``top_logprobs`` is null (completions) or ``[]`` (chat).

**Fields** (vLLM's extensions included, so a client of vLLM works unchanged):

- ``/v1/completions``: ``prompt`` (a string, tokenized without special
  tokens; a list of token ids; or a list of either), ``max_tokens``
  (default ``default_max_tokens``), ``temperature``, ``seed``, ``n``,
  ``stop_token_ids``, ``logprobs`` (an int: the choice gets
  ``logprobs.tokens`` / ``token_logprobs``), ``return_token_ids`` (each
  choice gets ``token_ids`` and ``prompt_token_ids``, where vLLM puts them).
- ``/v1/chat/completions``: ``messages`` (rendered by the tokenizer's chat
  template with the generation prompt; ``tools`` are passed to the template,
  calls in the reply are not parsed), ``max_completion_tokens`` /
  ``max_tokens``, ``temperature``, ``seed``, ``n``, ``stop_token_ids``,
  ``logprobs`` (a bool: ``choices[i].logprobs.content``), ``return_token_ids``
  (``token_ids`` on each choice, ``prompt_token_ids`` on the response).
- Every choice carries ``weight_version`` (an extension: the policy weights
  that sampled it). ``finish_reason`` is ``"stop"`` (EOS or a stop token,
  kept in ``token_ids``) or ``"length"``.

Not supported, answered with a 400: ``stream: true`` (the engine returns
whole completions; a stream of one chunk would only pretend), ``stop``
strings (use ``stop_token_ids``), ``echo``, ``suffix``. Bad input gets a 400
with OpenAI's error body ``{"error": {"message", "type", "param", "code"}}``;
an unknown route a 404 in the same shape.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import log as aiohttp_log
from aiohttp import web

from hybridflow.agents.batcher import GenerationBatcher
from hybridflow.agents.client import Completion
from hybridflow.core.data_proto import DataProto
from hybridflow.core.keys import GREEDY, MAX_NEW_TOKENS, N_SAMPLES, SEED, STOP_TOKEN_IDS, WEIGHT_VERSION
from hybridflow.core.sampling import SamplingParams

__all__ = ["MAX_SEED_STREAMS", "PolicyServer", "engine_generate_fn"]

logger = logging.getLogger(__name__)

MAX_SEED_STREAMS = 64
MAX_N = 64
"""The most completions one request may ask for (``n``)."""
"""Seeded streams the server remembers; the least recently used idle one is dropped beyond that."""

_Stream = tuple[bool, int | None]  # (greedy, seed): None is the server's own stream


def engine_generate_fn(engine: Any, sampling: SamplingParams | None = None) -> Callable[[DataProto], DataProto]:
    """A ``generate_fn`` over a bare :class:`~hybridflow.workers.rollout.engine.BuiltinEngine` (tests, benchmarks, a
    server without Ray), called as the actor worker's ``generate_sequences`` calls it; weight version 0.

    :param sampling: temperature / top-p / top-k of sampled requests (``max_new_tokens`` comes from each call).
    """
    sampling = sampling or SamplingParams()

    def generate(prompts: DataProto) -> DataProto:
        meta = prompts.meta_info
        params = SamplingParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            max_new_tokens=int(meta[MAX_NEW_TOKENS]),
        )
        out = engine.generate(
            prompts,
            n=meta[N_SAMPLES],
            sampling=params,
            greedy=meta[GREEDY],
            seed=meta[SEED],
            stop_token_ids=tuple(meta[STOP_TOKEN_IDS]),
        )
        out.meta_info[WEIGHT_VERSION] = 0
        return out

    return generate


class _BadRequest(Exception):
    """Answered with a 400 (or ``status``) and OpenAI's error body."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


@dataclass(frozen=True)
class _Sampling:
    """What a request asks of the sampler, validated."""

    max_tokens: int
    greedy: bool
    seed: int | None
    n: int
    stop_token_ids: tuple[int, ...]

    @property
    def stream(self) -> _Stream:
        return (True, None) if self.greedy else (False, self.seed)


class PolicyServer:
    """Serves ``generate_fn`` over OpenAI's completions and chat completions APIs (see the module docstring).

    :param generate_fn: the :class:`GenerationBatcher` contract (``DataProto -> DataProto``); called from the
        server's threads, one call at a time.
    :param tokenizer: an HF tokenizer: tokenizes string prompts, renders chat messages, decodes ``text``.
    :param model_name: the one model ``/v1/models`` lists; a request naming another gets a 404.
    :param host: interface to listen on; ``port`` 0 picks a free port.
    :param max_wait_s: how long a request waits for others to share its call.
    :param seed: the seed of unseeded sampled requests' stream.
    :param eos_token_ids: the engine's EOS tokens (tells ``"stop"`` from ``"length"``); default the tokenizer's.
    :param default_max_tokens: ``max_tokens`` of a request that gives none.
    :param full_batch_size: a call goes without waiting ``max_wait_s`` once this many requests wait.
    :param access_log: log one line per request (aiohttp's ``aiohttp.access`` logger, at INFO); off by
        default: every agent turn is a request, and a 4-step agent run logged 2,081 such lines in 2,108.
    :param max_tokens_limit: the most ``max_tokens`` a request may ask for (a larger one gets a 400: a
        request of 10**9 tokens would first try to allocate ~12 GB).
    :param max_model_len: the most tokens a prompt and its ``max_tokens`` may hold together (None: unchecked).
    :param max_body_bytes: the largest request body read (413 beyond it, before any parsing or tokenizing).
    :param max_tokens_per_call: the most tokens one engine call generates for a request (a longer request is
        generated in slices that take turns with the other requests); None: a request's whole ``max_tokens`` in
        one call, which lets one long request hold the engine while short ones wait. 64: a short request waits
        at most ~one 64-token slice behind a long one, and a 4,096-token request re-reads its context 64 times.
    """

    def __init__(
        self,
        generate_fn: Callable[[DataProto], DataProto],
        tokenizer: Any,
        *,
        model_name: str = "hybridflow-policy",
        host: str = "127.0.0.1",
        port: int = 0,
        max_wait_s: float = 0.005,
        seed: int = 0,
        eos_token_ids: Sequence[int] | None = None,
        default_max_tokens: int = 16,
        full_batch_size: int = 256,
        access_log: bool = False,
        max_tokens_limit: int = 4096,
        max_model_len: int | None = None,
        max_body_bytes: int = 1 << 20,
        max_tokens_per_call: int | None = 64,
    ) -> None:
        if max_tokens_per_call is not None and max_tokens_per_call < 1:
            raise ValueError(f"max_tokens_per_call must be >= 1 or None, got {max_tokens_per_call}")
        self.tokenizer, self.model_name, self.host, self.port = tokenizer, model_name, host, port
        self.max_wait_s, self.seed, self.default_max_tokens = max_wait_s, seed, default_max_tokens
        self.full_batch_size, self.access_log = full_batch_size, access_log
        self.max_tokens_limit, self.max_model_len, self.max_body_bytes = max_tokens_limit, max_model_len, max_body_bytes
        self.max_tokens_per_call = max_tokens_per_call
        eos = [tokenizer.eos_token_id] if eos_token_ids is None else list(eos_token_ids)
        self.eos_token_ids = [int(t) for t in eos if t is not None]
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else self.eos_token_ids[0])
        self.vocab_size = len(tokenizer)
        self._generate_fn, self._engine_lock = generate_fn, threading.Lock()
        self._streams: OrderedDict[_Stream, GenerationBatcher] = OrderedDict()
        self._in_flight: dict[_Stream, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.url: str | None = None

    # ------------------------------------------------------------ lifecycle
    def start(self) -> str:
        """Listen in a daemon thread; returns the base URL (``http://host:port/v1``)."""
        if self._thread is not None:
            raise RuntimeError("the policy server is already started")
        ready: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="policy-server", daemon=True)
        self._thread.start()
        try:
            port = ready.result(timeout=60)
        except BaseException:
            self._thread.join()
            self._thread = self._loop = None
            raise
        self.url = f"http://{self.host}:{port}/v1"
        return self.url

    def stop(self) -> None:
        """Stop listening; requests still waiting fail. Idempotent."""
        if self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._thread = self._loop = self.url = None

    def __enter__(self) -> PolicyServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _serve(self, ready: concurrent.futures.Future) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            access_log = aiohttp_log.access_logger if self.access_log else None  # None: aiohttp logs no request
            # handler_cancellation: a client that leaves cancels its handler, so its request is dropped between
            # slices (aiohttp >= 3.9 lets handlers run on by default, and the engine would decode for no one)
            runner = web.AppRunner(self._app(), shutdown_timeout=1.0, access_log=access_log, handler_cancellation=True)
            loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, self.host, self.port)
            loop.run_until_complete(site.start())
        except BaseException as exc:  # the caller of start() learns why
            ready.set_exception(exc)
            loop.close()
            return
        ready.set_result(runner.addresses[0][1])
        loop.run_forever()  # until stop()
        try:
            for batcher in self._streams.values():
                loop.run_until_complete(batcher.close())
            self._streams.clear()
            self._in_flight.clear()
            loop.run_until_complete(runner.cleanup())
            loop.run_until_complete(loop.shutdown_default_executor())  # a generate call in flight finishes
        finally:
            loop.close()

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[_openai_errors], client_max_size=self.max_body_bytes)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        return app

    # ------------------------------------------------------------ endpoints
    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _models(self, request: web.Request) -> web.Response:
        card = {"id": self.model_name, "object": "model", "created": int(time.time()), "owned_by": "hybridflow"}
        return web.json_response({"object": "list", "data": [card]})

    async def _completions(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        _reject_unsupported(body, "stop", "echo", "suffix")
        prompts = await asyncio.to_thread(self._prompts, body.get("prompt"))  # see _encode
        sampling = self._sampling(body, body.get("max_tokens"), "max_tokens")
        for ids in prompts:
            self._check_context(ids, sampling, "max_tokens")
        logprobs = _optional_int(body, "logprobs", minimum=0, maximum=20)
        with_ids = _flag(body, "return_token_ids")
        results = await asyncio.gather(*(self._sample(ids, sampling) for ids in prompts))
        choices = []
        for prompt_ids, completions in zip(prompts, results):
            for completion in completions:
                choice = {
                    "index": len(choices),
                    "text": self._text(completion),
                    "finish_reason": completion.finish_reason,
                    "stop_reason": None,
                    "weight_version": completion.weight_version,
                    "logprobs": None,
                }
                if logprobs is not None:
                    choice["logprobs"] = {
                        "tokens": self._token_strings(completion.token_ids),
                        "token_logprobs": completion.log_probs,
                        "top_logprobs": None,
                    }
                if with_ids:
                    choice.update(token_ids=completion.token_ids, prompt_token_ids=prompt_ids)
                choices.append(choice)
        return web.json_response(self._response("cmpl", "text_completion", choices, prompts, results))

    async def _chat_completions(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        _reject_unsupported(body, "stop")
        prompt_ids = await asyncio.to_thread(self._render, body)  # see _encode
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        sampling = self._sampling(body, max_tokens, "max_completion_tokens")
        self._check_context(prompt_ids, sampling, "max_completion_tokens")
        logprobs = _flag(body, "logprobs")
        with_ids = _flag(body, "return_token_ids")
        _optional_int(body, "top_logprobs", minimum=0, maximum=20)  # validated; alternatives are never returned
        completions = await self._sample(prompt_ids, sampling)
        choices = []
        for completion in completions:
            choice = {
                "index": len(choices),
                "message": {"role": "assistant", "content": self._text(completion)},
                "finish_reason": completion.finish_reason,
                "stop_reason": None,
                "weight_version": completion.weight_version,
                "logprobs": None,
            }
            if logprobs:
                pieces = self._token_strings(completion.token_ids)
                choice["logprobs"] = {
                    "content": [
                        {"token": piece, "logprob": lp, "bytes": list(piece.encode("utf-8")), "top_logprobs": []}
                        for piece, lp in zip(pieces, completion.log_probs)
                    ]
                }
            if with_ids:
                choice["token_ids"] = completion.token_ids
            choices.append(choice)
        response = self._response("chatcmpl", "chat.completion", choices, [prompt_ids], [completions])
        if with_ids:
            response["prompt_token_ids"] = prompt_ids
        return web.json_response(response)

    # ------------------------------------------------------------ sampling
    async def _sample(self, prompt_ids: list[int], sampling: _Sampling) -> list[Completion]:
        """``n`` completions of one prompt from its stream's batcher (they share a call, being sent together)."""
        key = sampling.stream
        batcher = self._stream(key)
        self._in_flight[key] = self._in_flight.get(key, 0) + sampling.n
        try:
            await self._forget_idle_seeds()  # after counting this request in, so its own stream stays
            return list(
                await asyncio.gather(
                    *(
                        batcher.generate(
                            prompt_ids, max_tokens=sampling.max_tokens, stop_token_ids=sampling.stop_token_ids
                        )
                        for _ in range(sampling.n)
                    )
                )
            )
        finally:  # stop() may have cleared the count already
            left = self._in_flight.get(key, 0) - sampling.n
            if left > 0:
                self._in_flight[key] = left
            else:
                self._in_flight.pop(key, None)

    def _stream(self, key: _Stream) -> GenerationBatcher:
        batcher = self._streams.get(key)
        if batcher is None:
            greedy, seed = key
            batcher = GenerationBatcher(
                self._locked_generate,
                self.pad_token_id,
                self.eos_token_ids,
                greedy=greedy,
                seed=self.seed if seed is None else seed,
                max_wait_s=self.max_wait_s,
                max_tokens_per_call=self.max_tokens_per_call,
            )
            batcher.expect(self.full_batch_size)  # unknown clients: wait max_wait_s unless the batch is full
            self._streams[key] = batcher
        self._streams.move_to_end(key)
        return batcher

    async def _forget_idle_seeds(self) -> None:
        seeded = [key for key in self._streams if key[1] is not None]  # least recently used first
        for key in seeded[: max(0, len(seeded) - MAX_SEED_STREAMS)]:
            if self._in_flight.get(key, 0) == 0:  # nothing waits on it, so closing it fails no request
                self._in_flight.pop(key, None)
                await self._streams.pop(key).close()

    def _locked_generate(self, data: DataProto) -> DataProto:
        with self._engine_lock:  # the streams' batchers call from several threads; the engine takes one call at a time
            return self._generate_fn(data)

    # ------------------------------------------------------------ parsing
    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.text(), parse_constant=_no_constant)
        except RecursionError:  # 100,000 nested brackets
            raise _BadRequest("the request body is nested deeper than JSON parsing allows") from None
        except ValueError as exc:  # not JSON, not UTF-8, NaN / Infinity, an integer past Python's digit limit
            raise _BadRequest(f"the request body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise _BadRequest("the request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise _BadRequest(
                f"The model `{model}` does not exist; this server serves `{self.model_name}`.",
                "model",
                404,
                "model_not_found",
            )
        if body.get("stream"):
            raise _BadRequest("stream is not supported: the server answers with whole completions", "stream")
        return body

    def _sampling(self, body: dict[str, Any], max_tokens: Any, max_tokens_name: str) -> _Sampling:
        if max_tokens is None:
            max_tokens = self.default_max_tokens
        if not _is_int(max_tokens) or not 1 <= max_tokens <= self.max_tokens_limit:
            raise _BadRequest(
                f"`{max_tokens_name}` must be an integer in [1, {self.max_tokens_limit}], got {_shown(max_tokens)}",
                max_tokens_name,
            )
        temperature = body.get("temperature")
        if temperature is not None and (not _is_number(temperature) or not 0 <= temperature <= 2):
            raise _BadRequest(f"`temperature` must be a number in [0, 2], got {_shown(temperature)}", "temperature")
        top_p = body.get("top_p")
        if top_p is not None and (not _is_number(top_p) or not 0 < top_p <= 1):
            raise _BadRequest(f"`top_p` must be a number in (0, 1], got {_shown(top_p)}", "top_p")
        seed = _optional_int(body, "seed", minimum=-(2**63), maximum=2**63 - 1)  # OpenAI's int64
        n = _optional_int(body, "n", minimum=1, maximum=MAX_N)
        stops = body.get("stop_token_ids")
        return _Sampling(
            int(max_tokens),
            temperature == 0,
            seed,
            1 if n is None else n,
            tuple(self._token_ids([] if stops is None else stops, "stop_token_ids", allow_empty=True)),
        )

    def _check_context(self, prompt_ids: list[int], sampling: _Sampling, max_tokens_name: str) -> None:
        """A prompt and its ``max_tokens`` fit the model's context (``max_model_len``), as OpenAI's servers check."""
        if self.max_model_len is not None and len(prompt_ids) + sampling.max_tokens > self.max_model_len:
            raise _BadRequest(
                f"This model's maximum context length is {self.max_model_len} tokens; the prompt has "
                f"{len(prompt_ids)} and `{max_tokens_name}` asks for {sampling.max_tokens}",
                max_tokens_name,
                code="context_length_exceeded",
            )

    def _prompts(self, prompt: Any) -> list[list[int]]:
        """``prompt`` as token-id lists: a string, a list of ids, or a list of strings or of id lists."""
        if prompt is None:
            raise _BadRequest("`prompt` is required", "prompt")
        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt)):
            prompt = [prompt]
        if not isinstance(prompt, list) or not prompt:
            raise _BadRequest("`prompt` must be a string, a list of token ids, or a non-empty list of either", "prompt")
        return [self._encode(p) if isinstance(p, str) else self._token_ids(p, "prompt") for p in prompt]

    def _render(self, body: dict[str, Any]) -> list[int]:
        """The chat template's tokens for ``messages`` (and ``tools``), ending in the assistant's generation prompt."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise _BadRequest("`messages` must be a non-empty list of messages", "messages")
        messages = [_message(m, i) for i, m in enumerate(messages)]
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise _BadRequest("`tools` must be a list", "tools")
        try:
            text = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        except Exception as exc:  # a template's own error (no template, a role it rejects) is the request's fault
            raise _BadRequest(f"the chat template could not render the messages: {exc}", "messages") from None
        return self._encode(text)

    def _encode(self, text: str) -> list[int]:
        """Called in a worker thread: tokenizing a 0.9 MB prompt held the server's loop (and ``/health``) 1.3 s."""
        # the chat template (or the caller) already wrote any BOS; adding special tokens would double it
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if not ids:
            raise _BadRequest("the prompt has no tokens", "prompt")
        return ids

    def _token_ids(self, value: Any, name: str, *, allow_empty: bool = False) -> list[int]:
        if not isinstance(value, list) or not all(_is_int(t) for t in value) or (not value and not allow_empty):
            raise _BadRequest(f"`{name}` must be a {'' if allow_empty else 'non-empty '}list of token ids", name)
        if any(not 0 <= t < self.vocab_size for t in value):
            raise _BadRequest(f"`{name}` has token ids outside the vocabulary [0, {self.vocab_size})", name)
        return [int(t) for t in value]

    # ------------------------------------------------------------ responses
    def _text(self, completion: Completion) -> str:
        return self.tokenizer.decode(completion.token_ids, skip_special_tokens=True)

    def _token_strings(self, token_ids: list[int]) -> list[str]:
        return [self.tokenizer.decode([t]) for t in token_ids]

    def _response(
        self, prefix: str, kind: str, choices: list[dict], prompts: list[list[int]], results: list[list[Completion]]
    ) -> dict[str, Any]:
        prompt_tokens = sum(len(p) for p in prompts)
        completion_tokens = sum(len(c.token_ids) for group in results for c in group)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        return {
            "id": f"{prefix}-{uuid.uuid4().hex}",
            "object": kind,
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": usage,
        }


# ---------------------------------------------------------------- helpers
@web.middleware
async def _openai_errors(request: web.Request, handler: Callable) -> web.StreamResponse:
    """Every error as OpenAI's body: 400 for bad input, aiohttp's status for a bad route, 500 otherwise."""
    try:
        return await handler(request)
    except _BadRequest as exc:
        return _error(exc.status, str(exc), "invalid_request_error", exc.param, exc.code)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _error(exc.status, f"{exc.reason}: {request.method} {request.path}", "invalid_request_error")
    except Exception as exc:  # a failed generate call: the client gets the reason, the log the traceback
        logger.exception("policy server: %s %s failed", request.method, request.path)
        return _error(500, f"{type(exc).__name__}: {exc}", "server_error")


def _error(status: int, message: str, kind: str, param: str | None = None, code: str | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": code}}, status=status)


def _reject_unsupported(body: dict[str, Any], *names: str) -> None:
    for name in names:
        if body.get(name):  # absent, null, false, "" and [] ask for nothing
            hint = "; use stop_token_ids" if name == "stop" else ""
            raise _BadRequest(f"`{name}` is not supported by this server{hint}", name)


def _message(message: Any, index: int) -> dict[str, Any]:
    """One chat message with its content as a string (text parts joined)."""
    where = f"messages[{index}]"
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise _BadRequest(f"`{where}` must be an object with a string `role`", "messages")
    content = message.get("content")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise _BadRequest(f"`{where}.content`: only text parts are supported", "messages")
        content = "".join(p["text"] for p in content)
    elif content is not None and not isinstance(content, str):
        raise _BadRequest(f"`{where}.content` must be a string, a list of text parts or null", "messages")
    return {**message, "content": content}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _optional_int(
    body: dict[str, Any], name: str, minimum: int | None = None, maximum: int | None = None
) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value) or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bound = {
            (True, True): f" in [{minimum}, {maximum}]",
            (True, False): f" >= {minimum}",
            (False, True): f" <= {maximum}",
            (False, False): "",
        }[minimum is not None, maximum is not None]
        raise _BadRequest(f"`{name}` must be an integer{bound}, got {_shown(value)}", name)
    return value


def _shown(value: Any) -> str:
    """``value`` for an error message, at most 40 characters (a 4,000-digit integer would be the whole message)."""
    text = repr(value) if not _is_int(value) or abs(value) < 10**30 else f"an integer of {len(str(abs(value)))} digits"
    return text if len(text) <= 40 else text[:37] + "..."


def _no_constant(name: str) -> Any:
    """``NaN``, ``Infinity`` and ``-Infinity`` are not JSON (Python's parser takes them by default)."""
    raise ValueError(f"{name} is not a JSON value")


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _BadRequest(f"`{name}` must be true or false, got {value!r}", name)
    return value

"""A :class:`~hybridflow.agents.client.PolicyClient` over HTTP: OpenAI's ``/v1/completions`` with token-id prompts.

Each :meth:`CompletionsClient.generate` is one POST::

    {"model": ..., "prompt": [token ids], "max_tokens": ..., "stop_token_ids": [...],
     "temperature": 0 (greedy) | 1.0, "seed": ... (when set), "logprobs": 1, "return_token_ids": true}

and the :class:`Completion` is ``choices[0].token_ids`` with
``choices[0].logprobs.token_logprobs``: token ids in, token ids out, so a
trajectory holds exactly the tokens that were scored. The field names are
vLLM's (``stop_token_ids``, ``return_token_ids``: vLLM >= 0.10.2), so the
same client talks to :class:`hybridflow.agents.server.PolicyServer` and to
``vllm serve``. Against vLLM it is unrun here (no vLLM server on the test
machines); there, temperature 1.0 makes vLLM's default (raw) log-probs the
sampling distribution's, and a fixed ``seed`` seeds every request alike, so
equal prompts sample equal tokens: leave it None for training rollouts.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import aiohttp

from hybridflow.agents.client import Completion

__all__ = ["CompletionsClient"]


class CompletionsClient:
    """Samples continuations from an OpenAI-compatible completions server (module docstring).

    :param base_url: the server's API root, e.g. ``http://127.0.0.1:8000/v1``.
    :param greedy: argmax decoding (``temperature: 0``) for every request.
    :param seed: sent with every request; :class:`~hybridflow.agents.server.PolicyServer` takes it as the
        stream its calls are seeded from (call ``k``: ``seed + k``, as the direct batcher does).
    :param model: the served model's name; None asks ``GET /models`` once and takes the first.
    :param timeout_s: the longest one request may take, queueing on the server included.
    :param max_connections: concurrent HTTP connections (one per request in flight): enough for every agent loop
        of a rollout to be waiting at once, so the server can batch them all.
    """

    def __init__(
        self,
        base_url: str,
        *,
        greedy: bool = False,
        seed: int | None = None,
        model: str | None = None,
        timeout_s: float = 600.0,
        max_connections: int = 1024,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.greedy, self.seed, self.model = greedy, seed, model
        self.timeout_s, self.max_connections = timeout_s, max_connections
        self._session: aiohttp.ClientSession | None = None
        self._model_lookup: asyncio.Lock | None = None

    async def generate(
        self, prompt_ids: Sequence[int], *, max_tokens: int, stop_token_ids: Sequence[int] = ()
    ) -> Completion:
        """See :meth:`hybridflow.agents.client.PolicyClient.generate`."""
        payload: dict[str, Any] = {
            "model": await self._model_name(),
            "prompt": [int(t) for t in prompt_ids],
            "max_tokens": int(max_tokens),
            "stop_token_ids": [int(t) for t in stop_token_ids],
            "temperature": 0.0 if self.greedy else 1.0,
            "logprobs": 1,  # vLLM: the sampled token's log-prob (and its top 1, unused)
            "return_token_ids": True,
            "n": 1,
        }
        if self.seed is not None:
            payload["seed"] = int(self.seed)
        body = await self._request("POST", "/completions", payload)
        try:
            choice = body["choices"][0]
            token_ids = [int(t) for t in choice["token_ids"]]
            log_probs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
            return Completion(token_ids, log_probs, choice["finish_reason"], choice.get("weight_version"))
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise RuntimeError(
                f"{self.base_url}/completions answered without token ids and log-probs: {exc!r}"
            ) from exc

    async def close(self) -> None:
        """Close the HTTP session (a later request opens a new one)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _model_name(self) -> str:
        if self.model is None:
            if self._model_lookup is None:
                self._model_lookup = asyncio.Lock()
            async with self._model_lookup:  # the first of many concurrent loops asks, the others wait for it
                if self.model is None:
                    models = (await self._request("GET", "/models", None))["data"]
                    if not models:
                        raise RuntimeError(f"{self.base_url}/models lists no model")
                    self.model = str(models[0]["id"])
        return self.model

    async def _request(self, method: str, path: str, payload: dict[str, Any] | None) -> dict[str, Any]:
        if self._session is None or self._session.closed:  # made in the running loop, which the session is bound to
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                connector=aiohttp.TCPConnector(limit=self.max_connections),
            )
        async with self._session.request(method, self.base_url + path, json=payload) as response:
            if response.status != 200:
                text = await response.text()
                try:
                    text = json.loads(text)["error"]["message"]
                except (ValueError, KeyError, TypeError):  # not OpenAI's error body: keep the raw text
                    pass
                raise RuntimeError(f"{method} {self.base_url}{path} failed with HTTP {response.status}: {text}")
            return await response.json()

"""vLLM's own continuous batching as the decoder of a rollout stream (``workers/rollout/stream.py``).

With ``trainer.placement=split``, a pipelined ``trainer.rollout_mode`` and ``rollout.name=vllm``, the
rollout ranks' :class:`~hybridflow.workers.rollout.stream.RolloutStream` steps vLLM's engine instead of the
built-in :class:`~hybridflow.workers.rollout.continuous.SlotDecoder`: every sample is one vLLM request
(prompt ``i`` of a request seeded ``seed + i*n``, its sample ``j`` ``+ j``: the seeds a ``generate`` call
gives them), added as it arrives, and ``LLMEngine.step()`` schedules them together, a batch's tail beside
the next batches' first tokens. New weights arrive between two steps (the stream's ``paused``); the
decoder notes, for every sample in flight, how many tokens it had then, so each token is stamped with the
version whose weights sampled it (``rollout_versions``). The push resets vLLM's prefix cache with the
running requests preempted (``reset_prefix_cache(reset_running_requests=True)``): they resume with their
KV recomputed under the new weights, and no new request reads KV of the old ones.

Validation and agent turns go through the same loop with their own options (:class:`StreamCall`): one
engine serves every call, as vLLM's ``LLM.generate`` would collect the stream's requests as its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hybridflow.core.data_proto import DataProto
from hybridflow.core.keys import ATTENTION_MASK, INPUT_IDS
from hybridflow.core.sampling import SamplingParams
from hybridflow.workers.rollout.continuous import FinishedRows
from hybridflow.workers.rollout.stream import StreamCall
from hybridflow.workers.rollout.vllm_engine import completion_arrays

__all__ = ["VLLMDecoder"]


@dataclass
class _Sample:
    """One vLLM request in flight: the stream's tag, which samples it answers (several when greedy), the token
    count it had at each weight version that arrived while it decoded, and its response length cap."""

    tag: Any
    samples: tuple[int, ...]
    width: int
    versions: list[tuple[int, int]] = field(default_factory=list)  # (first token index, version)
    generated: int = 0


class VLLMDecoder:
    """A stream decoder over a :class:`~hybridflow.workers.rollout.vllm_engine.VLLMRolloutEngine`.

    :param engine: the rollout rank's vLLM engine (its ``llm.llm_engine`` is stepped here, in the stream's
        thread; every other use of the engine waits in the stream's ``paused``).
    :param n: samples per prompt of the training rollout.
    :param sampling: the training rollout's sampling.
    """

    def __init__(self, engine: Any, n: int, sampling: SamplingParams) -> None:
        self.engine, self.n, self.sampling = engine, n, sampling
        self.llm_engine = engine.llm.llm_engine
        self.live: dict[str, _Sample] = {}
        self._version = 0
        self._next_id = 0
        self.live_row_steps = self.decode_steps = 0
        self.slots = max(int(self.llm_engine.vllm_config.scheduler_config.max_num_seqs), 1)

    @property
    def version(self) -> int:
        """The weight version the engine samples with."""
        return self._version

    @version.setter
    def version(self, version: int) -> None:
        """New weights are in (between two steps): tokens from here on carry ``version``."""
        for sample in self.live.values():
            sample.versions.append((sample.generated, version))
        self._version = version

    @property
    def busy(self) -> bool:
        """Whether a request decodes or waits in vLLM."""
        return bool(self.live)

    def add(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        positions: torch.Tensor,
        tags: list[Any],
        *,
        seed: int | None = None,
        n: int | None = None,
        call: StreamCall | None = None,
    ) -> None:
        """Add prompt rows (B, P) left-padded as vLLM requests, each row with its tag; positions are vLLM's own."""
        n = self.n if n is None else n
        call = call or StreamCall()
        sampling = call.sampling or self.sampling
        prompts = self.engine.token_prompts(DataProto.from_dict({INPUT_IDS: input_ids, ATTENTION_MASK: attention_mask}))
        if call.greedy:  # decoded once, repeated n times
            params = self.engine.request_params(len(prompts), 1, sampling, True, None, call.stop_token_ids)
            jobs = [(i, tuple(range(n)), p) for i, p in enumerate(params)]
        else:  # one request per sample: sample j of prompt i seeded seed + i*n + j, as vLLM seeds a request's children
            base = self.engine.request_params(len(prompts) * n, 1, sampling, False, seed, call.stop_token_ids)
            jobs = [(k // n, (k % n,), p) for k, p in enumerate(base)]
        for row, samples, params in jobs:
            request_id = f"hybridflow-{self._next_id}"
            self._next_id += 1
            self.llm_engine.add_request(request_id, prompts[row], params)
            self.live[request_id] = _Sample(tags[row], samples, sampling.max_new_tokens, [(0, self._version)])

    def step(self) -> FinishedRows | None:
        """One engine step; the samples that ended in it (None: none did)."""
        outputs = self.llm_engine.step()
        self.live_row_steps += len(self.live)
        self.decode_steps += 1
        done = []
        for output in outputs:
            sample = self.live.get(output.request_id)
            if sample is None:
                continue
            completion = output.outputs[0]
            sample.generated = len(completion.token_ids)
            if output.finished:
                done.append((self.live.pop(output.request_id), completion))
        return _finished_rows(done, self.engine.pad_token_id) if done else None

    def slot_utilization(self) -> float:
        """Requests in flight per step over vLLM's ``max_num_seqs``, averaged over the steps so far."""
        return self.live_row_steps / max(self.decode_steps * self.slots, 1)


def _finished_rows(done: list[tuple[_Sample, Any]], pad_token_id: int) -> FinishedRows:
    """Finished samples as :class:`FinishedRows` (a greedy request as one row per sample it answers)."""
    tags, samples, tokens, log_probs, versions, lengths = [], [], [], [], [], []
    for sample, completion in done:
        ids, lps = completion_arrays(completion, sample.width, f"vLLM request for {sample.tag}")
        row_tokens = torch.full((sample.width,), pad_token_id, dtype=torch.long)
        row_lps = torch.zeros(sample.width, dtype=torch.float32)
        row_versions = torch.zeros(sample.width, dtype=torch.long)
        row_tokens[: len(ids)] = torch.tensor(ids, dtype=torch.long)
        row_lps[: len(ids)] = torch.tensor(lps, dtype=torch.float32)
        for start, version in sample.versions:  # later segments overwrite earlier ones from their first token
            row_versions[start:] = version
        for j in sample.samples:
            tags.append(sample.tag)
            samples.append(j)
            tokens.append(row_tokens)
            log_probs.append(row_lps)
            versions.append(row_versions)
            lengths.append(len(ids))
    return FinishedRows(
        tags,
        torch.tensor(samples),
        torch.stack(tokens),
        torch.stack(log_probs),
        torch.stack(versions),
        torch.tensor(lengths),
    )

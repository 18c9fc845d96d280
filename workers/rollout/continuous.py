"""Continuous batching for the built-in engine: a finished row's slot is refilled with a waiting prompt.

When one ``generate`` call has more rows than the engine decodes at once
(``EngineConfig.max_num_seqs``, or the rows whose KV cache fits
``max_kv_cache_bytes``), the static engine decodes them in consecutive chunks,
and every chunk runs until its longest row ends: with heavy-tailed response
lengths most of a chunk's steps run a nearly empty batch. Here the engine holds
``S`` row slots instead::

    slots  0 1 2 3 4 5 6 7          waiting prompts: p4 p5 p6 ...   (n = 2 samples each)
    step t  [p0 p0 p1 p1 p2 p2 p3 p3]   rows 2 and 3 hit EOS
    step t+1[p0 p0 p4 p4 p2 p2 p3 p3]   p4 is prefilled alone and written into slots 2, 3

Every row lives in one KV cache of shared length ``W``; a row admitted at
length ``W`` has its prompt's keys and values right-aligned in columns
``W - p .. W`` and zeros (masked out) before, so the model's 2-D attention
mask and per-row position ids work as in the static engine. A prompt is
admitted once ``n`` slots are free (its samples share one prefill, as in the
static engine). When the cache would outgrow its ``P + 2T`` positions, the
leading columns no live row attends to are dropped (``trim_left``: at most once
per ``T`` steps). Once no prompt waits, finished rows are compacted away as in
the static engine.

The loop is :class:`SlotDecoder`, stepped by :func:`decode_continuous` for
one engine call, and by the streaming rollout (``workers/rollout/stream.py``)
across calls: prompts may be added while rows decode (a longer prompt widens
the cache on the left, ``grow_left``), slots compacted in a tail come back
for them, and each token is stamped with the weight version that sampled it.

Each row gives what the static engine gives it for the same seed: its numbers
depend only on its own tokens (the padding differs, which moves float rounding
only), and a sample's randomness is its own (keyed by the call's seed, its
prompt and sample index: ``workers/rollout/sampling.py``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, fields
from typing import Any

import torch

from hybridflow.core.sampling import SamplingParams
from hybridflow.workers.rollout.kv_cache import make_generation_cache
from hybridflow.workers.rollout.sampling import prompt_keys, sample_next_tokens, sample_uniforms

__all__ = ["FinishedRows", "SlotDecoder", "decode_continuous"]


@dataclass
class _Slots:
    """Per slot: the prompt it decodes (-1: free) and which of its samples, that sample's key (its randomness),
    whether it still generates, its tokens so far, their log-probs and weight versions, the mask over the cached
    columns, the next position id and its next-token logits."""

    prompt: torch.Tensor  # (S,) long: index into SlotDecoder's tag table
    sample: torch.Tensor  # (S,) long
    key: torch.Tensor  # (S,) long
    live: torch.Tensor  # (S,) bool
    generated: torch.Tensor  # (S,) long
    tokens: torch.Tensor  # (S, T) long
    log_probs: torch.Tensor  # (S, T) float32
    versions: torch.Tensor  # (S, T) long
    attention_mask: torch.Tensor  # (S, W)
    next_position: torch.Tensor  # (S,) long
    logits: torch.Tensor  # (S, V)
    logit_version: torch.Tensor  # (S,) long: the weight version of the forward that gave ``logits``

    def keep(self, index: torch.Tensor) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name)[index])

    def extend(self, free: int) -> None:
        """``free`` more slots at the end: no prompt (-1), not live, zeros."""
        for f in fields(self):
            value = getattr(self, f.name)
            setattr(
                self,
                f.name,
                torch.cat([value, value.new_full((free, *value.shape[1:]), -1 if f.name == "prompt" else 0)]),
            )


@dataclass(frozen=True)
class FinishedRows:
    """Rows that ended in one :meth:`SlotDecoder.step`: each one's prompt tag and sample index, its tokens,
    their log-probs and the weight version that produced each (k, T; valid up to ``lengths``)."""

    tags: list[Any]
    samples: torch.Tensor  # (k,)
    tokens: torch.Tensor
    log_probs: torch.Tensor
    versions: torch.Tensor
    lengths: torch.Tensor  # (k,)


class SlotDecoder:
    """``slots`` row slots over one KV cache, fed prompts (:meth:`add`) and stepped one token at a time
    (:meth:`step`); see the module docstring. ``version`` is the weight version of the model's current
    weights (a streaming rollout sets it when new weights arrive between two steps): each token is stamped
    with the version of the forward whose logits it was sampled from. Once nothing waits, finished rows are
    compacted away; prompts that arrive after that get the slots back."""

    def __init__(self, engine, slots: int, n: int, sampling: SamplingParams, greedy: bool, stops: tuple[int, ...]):
        self.engine, self.slots, self.n = engine, slots, n
        self.sampling, self.greedy = sampling, greedy
        self.steps, self.pad = sampling.max_new_tokens, engine.pad_token_id
        self.device = engine.device
        self.eos = torch.tensor(stops, device=self.device)
        self.version = 0
        self.waiting: deque[int] = deque()  # indices into _prompts, in arrival order
        self._prompts: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any, int]] = {}  # until admitted
        self._tags: dict[int, list] = {}  # admitted prompt -> [tag, samples still decoding]
        self._next_prompt = 0
        self.cache = None  # made by the first admission, for the width of the prompts then waiting
        self.length = self.width = 0
        self.live_slot_steps, self.decode_steps = torch.zeros((), device=self.device), 0  # summed on the device

    # ------------------------------------------------------------ prompts
    def add(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        positions: torch.Tensor,
        tags: list[Any],
        keys: list[int],
    ) -> None:
        """Queue prompt rows (B, P) left-padded, each with a tag its finished samples carry and the key of its
        sample 0 (sample ``j``'s is ``key + j``)."""
        real = attention_mask.sum(-1).tolist()
        for row, tag in enumerate(tags):
            width = max(int(real[row]), 1)
            self._prompts[self._next_prompt] = (
                input_ids[row, -width:],
                attention_mask[row, -width:],
                positions[row, -width:],
                tag,
                int(keys[row]),
            )
            self.waiting.append(self._next_prompt)
            self._next_prompt += 1

    @property
    def busy(self) -> bool:
        """Whether a row decodes or a prompt waits."""
        return bool(self.waiting) or (self.cache is not None and bool(self.state.live.any()))

    def _start(self) -> None:
        """A fresh cache of ``P + 2T`` positions for the waiting prompts' width P (also after the decoder ran dry)."""
        self.width = self.length = max(len(self._prompts[i][0]) for i in self.waiting)
        engine, slots, device = self.engine, self.slots, self.device
        self.cache = make_generation_cache(engine.model.config, capacity=self.width + 2 * self.steps, row_slots=slots)
        vocab = engine.model.config.get_text_config().vocab_size
        long = lambda *shape, fill=0: torch.full(shape, fill, dtype=torch.long, device=device)  # noqa: E731
        self.state = _Slots(
            prompt=long(slots, fill=-1),
            sample=long(slots),
            key=long(slots),
            live=torch.zeros(slots, dtype=torch.bool, device=device),
            generated=long(slots),
            tokens=long(slots, self.steps, fill=self.pad),
            log_probs=torch.zeros((slots, self.steps), dtype=torch.float32, device=device),
            versions=long(slots, self.steps),
            attention_mask=long(slots, self.width),
            next_position=long(slots),
            logits=torch.zeros((slots, vocab), device=device),
            logit_version=long(slots),
        )

    def admit(self) -> None:
        """Prefill as many waiting prompts as there are ``n`` free slots for, and place them."""
        if not self.waiting:
            return
        if self.cache is None or not bool(self.state.live.any()):  # nothing resident: a fresh cache, as a new call
            self._start()
        if len(self.state.live) < self.slots:  # compacted in a tail, and prompts arrived after it
            self._restore_slots()
        state, n = self.state, self.n
        free = (~state.live).nonzero().squeeze(-1)
        count = min(len(self.waiting), len(free) // n)
        if count == 0:
            return
        chosen = [self.waiting.popleft() for _ in range(count)]
        ids, mask, pos = self._stack(chosen)
        first_keys = torch.tensor([self._prompts[i][4] for i in chosen], device=self.device)
        for i in chosen:
            self._tags[i] = [self._prompts.pop(i)[3], n]
        real = ids.shape[1]
        if real > self.length:  # a later, longer prompt: room on the left for it
            self._grow(real - self.length)
        prefill = make_generation_cache(self.engine.model.config, capacity=real)
        logits = self.engine._forward(ids, mask, pos, prefill)
        into = free[: count * n]
        for layer, small in zip(self.cache.layers, prefill.layers):
            layer.write_rows(
                into, small.keys.repeat_interleave(n, 0), small.values.repeat_interleave(n, 0), self.length
            )
        rep = lambda x: x.repeat_interleave(n, dim=0)  # noqa: E731
        state.prompt[into] = rep(torch.tensor(chosen, device=self.device))
        state.sample[into] = torch.arange(n, device=self.device).repeat(count)
        state.key[into] = rep(first_keys) + state.sample[into]
        state.live[into], state.generated[into] = True, 0
        state.tokens[into], state.log_probs[into], state.versions[into] = self.pad, 0.0, 0
        state.attention_mask[into] = 0
        state.attention_mask[into, self.length - real :] = rep(mask)
        state.next_position[into] = rep(pos[:, -1]) + 1
        state.logits[into] = rep(logits).to(state.logits.dtype)
        state.logit_version[into] = self.version

    def _stack(self, chosen: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The chosen prompts left-padded to the longest of them (pad id, mask 0, position 0)."""
        width = max(len(self._prompts[i][0]) for i in chosen)  # stacked before they leave _prompts
        ids = torch.full((len(chosen), width), self.pad, dtype=torch.long, device=self.device)
        mask = torch.zeros((len(chosen), width), dtype=self._prompts[chosen[0]][1].dtype, device=self.device)
        pos = torch.zeros((len(chosen), width), dtype=torch.long, device=self.device)
        for row, i in enumerate(chosen):
            p_ids, p_mask, p_pos = self._prompts[i][:3]
            ids[row, width - len(p_ids) :], mask[row, width - len(p_ids) :], pos[row, width - len(p_ids) :] = (
                p_ids,
                p_mask,
                p_pos,
            )
        return ids, mask, pos

    def _restore_slots(self) -> None:
        """Back to ``slots`` rows after a compaction: the resident rows first, then free slots."""
        for layer in self.cache.layers:
            layer.restore_slots()
        self.state.extend(self.slots - len(self.state.live))

    def _grow(self, columns: int) -> None:
        for layer in self.cache.layers:
            layer.grow_left(columns)
        self.state.attention_mask = torch.cat(
            [self.state.attention_mask.new_zeros((self.slots, columns)), self.state.attention_mask], 1
        )
        self.length += columns
        self.width = max(self.width, self.length)

    # -------------------------------------------------------------- decode
    def step(self) -> FinishedRows | None:
        """Admit waiting prompts if slots are free, then sample one token for every live row and run the
        forward that gives the next logits; the rows that ended (EOS, a stop token or ``T`` tokens), or None."""
        if self.cache is None or not bool(self.state.live.any()):
            self.admit()
            if self.cache is None or not bool(self.state.live.any()):
                return None
        elif self.waiting:  # prompts that arrived while slots were free
            self.admit()
        state, steps = self.state, self.steps
        self.live_slot_steps += state.live.sum()
        self.decode_steps += 1
        uniforms = None if self.greedy else sample_uniforms(state.key, state.generated)
        tokens, token_log_probs = sample_next_tokens(state.logits, self.sampling, greedy=self.greedy, uniforms=uniforms)
        tokens = tokens.masked_fill(~state.live, self.pad)  # free and finished slots feed pad, ignored
        slots = state.live.nonzero().squeeze(-1)
        at = state.generated[slots]
        state.tokens[slots, at] = tokens[slots]
        state.log_probs[slots, at] = token_log_probs[slots]
        state.versions[slots, at] = state.logit_version[slots]
        state.generated = state.generated + state.live.long()
        done = state.live & (torch.isin(tokens, self.eos) | (state.generated == steps))
        finished = None
        if bool(done.any()):
            finished = self._finish(done)
            state.live = state.live & ~done
            if self.waiting:
                self.admit()
                state = self.state  # a fresh cache when every row had ended
            elif not bool(state.live.any()):
                return finished
            elif float((~state.live).float().mean()) >= self.engine.config.compact_fraction:
                keep = state.live.nonzero().squeeze(-1)  # nothing waits: drop the finished rows, as the static loop
                self.cache.batch_select_indices(keep)
                state.keep(keep)
                tokens = tokens[keep]
            if not bool(state.live.any()):
                return finished
        if self.length + 1 > self.cache.layers[0].capacity:
            self._trim()
        # a slot admitted in this step samples from its prompt's logits next: it feeds nothing now, and the
        # column this forward adds is masked out for it
        fresh = state.live & (state.generated == 0)
        if len(tokens) != len(fresh):  # a fresh cache after a compaction: every slot is back, the live ones all fresh
            tokens = torch.full_like(fresh, self.pad, dtype=torch.long)
        state.attention_mask = torch.cat([state.attention_mask, (~fresh).to(state.attention_mask.dtype)[:, None]], 1)
        logits = self.engine._forward(
            tokens.masked_fill(fresh, self.pad)[:, None], state.attention_mask, state.next_position[:, None], self.cache
        )
        state.logits = torch.where(fresh[:, None], state.logits, logits.to(state.logits.dtype))
        state.logit_version = torch.where(fresh, state.logit_version, self.version)
        state.next_position = state.next_position + (~fresh).long()
        self.length += 1
        return finished

    def _finish(self, done: torch.Tensor) -> FinishedRows:
        state = self.state
        prompts = state.prompt[done].tolist()
        tags = []
        for i in prompts:
            entry = self._tags[i]
            tags.append(entry[0])
            entry[1] -= 1
            if entry[1] == 0:
                del self._tags[i]
        return FinishedRows(
            tags,
            state.sample[done],
            state.tokens[done],
            state.log_probs[done],
            state.versions[done],
            state.generated[done],
        )

    def _trim(self) -> None:
        """Drop the leading cache columns no live row attends to (keeping at least the prompt width)."""
        state = self.state
        used = state.attention_mask[state.live].bool().any(0).nonzero()
        first = int(used[0]) if len(used) else self.length
        columns = min(first, self.length - self.width)
        for layer in self.cache.layers:
            layer.trim_left(columns)
        state.attention_mask = state.attention_mask[:, columns:]
        self.length -= columns

    def slot_utilization(self) -> float:
        """The mean share of the slots that were live, over the steps so far."""
        return float(self.live_slot_steps) / (self.decode_steps * self.slots) if self.decode_steps else 0.0


def decode_continuous(
    engine,
    input_ids,
    attention_mask,
    positions,
    n: int,
    sampling: SamplingParams,
    greedy: bool,
    seed: int,
    stops: tuple[int, ...],
    slots: int,
):
    """Decode ``n`` samples of every prompt row in ``slots`` row slots (prompt ``i``'s sample ``j`` keyed
    ``seed + i*n + j``); returns responses, log-probs
    (B*n, T) and lengths (B*n,), as the static decode loop does, and the mean share of slots that were live."""
    prompts, steps = input_ids.shape[0], sampling.max_new_tokens
    total, device = prompts * n, input_ids.device
    responses = torch.full((total, steps), engine.pad_token_id, dtype=torch.long, device=device)
    log_probs = torch.zeros((total, steps), dtype=torch.float32, device=device)
    lengths = torch.full((total,), steps, dtype=torch.long, device=device)
    decoder = SlotDecoder(engine, slots, n, sampling, greedy, stops)
    decoder.add(input_ids, attention_mask, positions, list(range(prompts)), prompt_keys(seed, prompts, n))
    while decoder.busy:
        finished = decoder.step()
        if finished is not None:
            rows = torch.tensor(finished.tags, device=device) * n + finished.samples
            responses[rows], log_probs[rows], lengths[rows] = finished.tokens, finished.log_probs, finished.lengths
    return responses, log_probs, lengths, decoder.slot_utilization()

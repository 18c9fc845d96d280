"""Continuous batching for the built-in engine: a finished row's slot is refilled with a waiting prompt.

When one ``generate`` call has more rows than the engine decodes at once
(``RolloutConfig.max_num_seqs``, or the rows whose KV cache fits
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

Greedy decoding gives each row what the static engine gives it (each row's
numbers depend only on its own tokens; the padding differs, which moves float
rounding only). Sampled rows draw from one generator in a different order than
the static engine's, so equal seeds give other (equally distributed) samples.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from hybridflow.workers.rollout.kv_cache import PreallocatedLayer, make_generation_cache
from hybridflow.workers.rollout.sampling import SamplingParams, sample_next_tokens

__all__ = ["decode_continuous"]


@dataclass
class _Slots:
    """Per slot: the output row it decodes (-1: free), whether it still generates, its tokens so far, the
    mask over the cached columns, the next position id and its next-token logits."""

    row: torch.Tensor  # (S,) long
    live: torch.Tensor  # (S,) bool
    generated: torch.Tensor  # (S,) long
    attention_mask: torch.Tensor  # (S, W)
    next_position: torch.Tensor  # (S,) long
    logits: torch.Tensor  # (S, V)

    def keep(self, index: torch.Tensor) -> None:
        for name in ("row", "live", "generated", "attention_mask", "next_position", "logits"):
            setattr(self, name, getattr(self, name)[index])


def decode_continuous(engine, input_ids, attention_mask, positions, n: int, sampling: SamplingParams, greedy: bool,
                      generator, stops: tuple[int, ...], slots: int):
    """Decode ``n`` samples of every prompt row in ``slots`` row slots; returns responses, log-probs
    (B*n, T) and lengths (B*n,), as the static decode loop does, and the mean share of slots that were live."""
    prompts, width = input_ids.shape
    steps, device, pad = sampling.max_new_tokens, input_ids.device, engine.pad_token_id
    total = prompts * n
    responses = torch.full((total, steps), pad, dtype=torch.long, device=device)
    log_probs = torch.zeros((total, steps), dtype=torch.float32, device=device)
    lengths = torch.full((total,), steps, dtype=torch.long, device=device)
    eos = torch.tensor(stops, device=device)
    cache = make_generation_cache(engine.model.config, capacity=width + 2 * steps, row_slots=slots)
    layers = cache.layers
    vocab = engine.model.config.get_text_config().vocab_size
    state = _Slots(
        row=torch.full((slots,), -1, dtype=torch.long, device=device),
        live=torch.zeros(slots, dtype=torch.bool, device=device),
        generated=torch.zeros(slots, dtype=torch.long, device=device),
        attention_mask=torch.zeros((slots, width), dtype=attention_mask.dtype, device=device),
        next_position=torch.zeros(slots, dtype=torch.long, device=device),
        logits=torch.zeros((slots, vocab), device=device),
    )
    waiting = deque(range(prompts))
    live_slot_steps, decode_steps = torch.zeros((), device=device), 0  # summed on the device: no sync a step
    length = width  # the cache's shared length W (never below the longest prompt)

    def admit() -> None:
        free = (~state.live).nonzero().squeeze(-1)
        count = min(len(waiting), len(free) // n)
        if count == 0:
            return
        chosen = torch.tensor([waiting.popleft() for _ in range(count)], device=device)
        real = int(attention_mask[chosen].sum(-1).max())  # the admitted prompts' own padded width
        ids, mask, pos = input_ids[chosen, -real:], attention_mask[chosen, -real:], positions[chosen, -real:]
        prefill = make_generation_cache(engine.model.config, capacity=real)
        logits = engine._forward(ids, mask, pos, prefill)
        into = free[: count * n]
        for layer, small in zip(layers, prefill.layers):
            layer.write_rows(into, small.keys.repeat_interleave(n, 0), small.values.repeat_interleave(n, 0), length)
        rep = lambda x: x.repeat_interleave(n, dim=0)  # noqa: E731
        state.row[into] = (rep(chosen) * n + torch.arange(n, device=device).repeat(count))
        state.live[into], state.generated[into] = True, 0
        state.attention_mask[into] = 0
        state.attention_mask[into, length - real :] = rep(mask)
        state.next_position[into] = rep(pos[:, -1]) + 1
        state.logits[into] = rep(logits).to(state.logits.dtype)

    admit()
    while bool(state.live.any()):
        live_slot_steps += state.live.sum()
        decode_steps += 1
        tokens, token_log_probs = sample_next_tokens(state.logits, sampling, greedy=greedy, generator=generator)
        tokens = tokens.masked_fill(~state.live, pad)  # free and finished slots feed pad, ignored
        rows, at = state.row[state.live], state.generated[state.live]
        responses[rows, at] = tokens[state.live]
        log_probs[rows, at] = token_log_probs[state.live]
        state.generated = state.generated + state.live.long()
        done = state.live & (torch.isin(tokens, eos) | (state.generated == steps))
        if bool(done.any()):
            lengths[state.row[done]] = state.generated[done]
            state.live = state.live & ~done
            if waiting:
                admit()
            elif not bool(state.live.any()):
                break
            elif float((~state.live).float().mean()) >= engine.config.compact_fraction:
                keep = state.live.nonzero().squeeze(-1)  # nothing waits: drop the finished rows, as the static loop
                cache.batch_select_indices(keep)
                state.keep(keep)
                tokens = tokens[keep]
        if length + 1 > layers[0].capacity:
            length = _trim(layers, state, length, width)
        # a slot admitted in this step samples from its prompt's logits next: it feeds nothing now, and the
        # column this forward adds is masked out for it
        fresh = state.live & (state.generated == 0)
        state.attention_mask = torch.cat([state.attention_mask, (~fresh).to(state.attention_mask.dtype)[:, None]], 1)
        logits = engine._forward(tokens.masked_fill(fresh, pad)[:, None], state.attention_mask,
                                 state.next_position[:, None], cache)
        state.logits = torch.where(fresh[:, None], state.logits, logits.to(state.logits.dtype))
        state.next_position = state.next_position + (~fresh).long()
        length += 1
    share = float(live_slot_steps) / (decode_steps * slots) if decode_steps else 0.0
    return responses, log_probs, lengths, share


def _trim(layers: list[PreallocatedLayer], state: _Slots, length: int, width: int) -> int:
    """Drop the leading cache columns no live row attends to (keeping at least the prompt width); the new length."""
    used = state.attention_mask[state.live].bool().any(0).nonzero()
    first = int(used[0]) if len(used) else length
    columns = min(first, length - width)
    for layer in layers:
        layer.trim_left(columns)
    state.attention_mask = state.attention_mask[:, columns:]
    return length - columns

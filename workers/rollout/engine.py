"""The built-in rollout engine: batched sampling from an HF causal LM with a KV cache.

How one ``generate`` call runs::

    prompts (B, P), left-padded
        |  prefill: one forward over the B prompts (not B*n), logits of the last position
        v
    KV cache (B rows) --expand x n, interleaved--> (B*n rows): a prompt's samples share its prefill
        |
        |  decode loop, one token per step for the rows resident in the cache:
        |    sample -> write into responses[rows, t] -> rows that hit EOS are marked done;
        |    once done rows are >= compact_fraction of the resident ones, they are dropped
        |    from the cache, the mask and the positions (they stop costing compute)
        v
    responses (B*n, T) right-padded, log-probs, lengths -> one DataProto

The cache (:mod:`hybridflow.workers.rollout.kv_cache`) is allocated once for
prompt + response length; dropping rows compacts it in place. Prompts are
left-padded, so every resident row has the same cache length and
the model's own 2-D attention mask handling applies; position ids count real
tokens only (``cumsum(mask) - 1``, pads at 0, as HF ``generate`` does) and
continue after the prompt. Greedy decoding equals HF ``generate`` token for
token; log-probs follow :mod:`hybridflow.workers.rollout.sampling`. On a
CPU, the decode steps' attention runs as two ``bmm``
(:mod:`hybridflow.workers.decode_attention`, through the attention wrapper the
engine installs on its model: :mod:`hybridflow.workers.attention`).
"""

from __future__ import annotations

import inspect
import logging
import time
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import Cache

from hybridflow.core.data_proto import DataProto
from hybridflow.core.keys import (
    ATTENTION_MASK,
    INPUT_IDS,
    METRICS,
    POSITION_IDS,
    PROMPTS,
    RESPONSE_MASK,
    RESPONSES,
    ROLLOUT_LOG_PROBS,
)
from hybridflow.core.rollout_batch import positions_from_mask
from hybridflow.core.sampling import SamplingParams
from hybridflow.workers import attention
from hybridflow.workers.rollout.base import special_token_ids
from hybridflow.workers.rollout.continuous import decode_continuous
from hybridflow.workers.rollout.kv_cache import make_generation_cache, preallocatable
from hybridflow.workers.rollout.sampling import sample_keys, sample_next_tokens, sample_uniforms

__all__ = ["EngineConfig", "BuiltinEngine", "assemble_rollout", "positions_from_mask"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    """Engine settings that do not change from call to call."""

    eos_token_ids: tuple[int, ...] | None = None
    """Token ids that end a response; None: the tokenizer's EOS plus the model's generation_config EOS ids."""
    pad_token_id: int | None = None
    """Fills responses after EOS; None: the tokenizer's pad token (its EOS when it has none)."""
    compact_fraction: float = 0.25
    """Finished rows leave the batch (and the KV cache) once they are at least this fraction of
    the resident rows; until then they ride along (fed pad tokens, outputs ignored). 0: at every
    step where a row finishes. Larger values trade wasted rows for fewer cache copies; 0.125 to
    0.25 measured fastest on CPU (docs/benchmarks.md), 0 and 0.5 about 8% slower."""

    max_kv_cache_bytes: int | None = None
    """The most memory the KV cache of one decode may take; a batch whose cache would be larger shares the
    row slots that fit (``refill``) or is decoded in consecutive chunks of prompts that fit (same outputs
    for greedy decoding either way). None: no bound. The actor sets it from ``rollout.gpu_memory_utilization``
    on CUDA."""

    max_num_seqs: int | None = None
    """Rows decoded at once (vLLM's name); a call with more rows shares that many row slots. None: every row
    of the call at once (within ``max_kv_cache_bytes``)."""
    refill: bool = True
    """When a call has more rows than are decoded at once (``max_num_seqs``, ``max_kv_cache_bytes``): refill a
    finished row's slot with a waiting prompt (continuous batching, :mod:`hybridflow.workers.rollout.continuous`);
    False: decode consecutive chunks of prompts, each until its longest row ends."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.compact_fraction <= 1.0:
            raise ValueError(f"compact_fraction must be in [0, 1], got {self.compact_fraction}")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1 or None, got {self.max_num_seqs}")


@dataclass
class _DecodeState:
    """The rows resident in the KV cache, in cache order."""

    rows: torch.Tensor  # (A,) index of each resident row in the (B*n) output
    live: torch.Tensor  # (A,) bool: still generating (False: finished, awaiting compaction)
    attention_mask: torch.Tensor  # (A, P + t) mask over the cached tokens plus the next one
    next_position: torch.Tensor  # (A,) position id of the next token fed to the model
    logits: torch.Tensor  # (A, V) next-token logits

    def keep(self, index: torch.Tensor) -> None:
        """Keep only resident rows ``index`` (the cache is compacted by the caller)."""
        self.rows, self.live = self.rows[index], self.live[index]
        self.attention_mask, self.next_position = self.attention_mask[index], self.next_position[index]


class BuiltinEngine:
    """Samples ``n`` responses per prompt from ``model`` (see the module docstring)."""

    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, config: EngineConfig | None = None
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or EngineConfig()
        self.pad_token_id, self.eos_token_ids = special_token_ids(
            tokenizer,
            getattr(getattr(model, "generation_config", None), "eos_token_id", None),
            eos=self.config.eos_token_ids,
            pad=self.config.pad_token_id,
        )
        params = inspect.signature(model.forward).parameters
        # transformers 5 names the cache argument ``cache``; 4.x calls it ``past_key_values``.
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._has_logits_to_keep = "logits_to_keep" in params
        try:  # on a CPU, decode steps of plain softmax attention as two bmm (workers/decode_attention.py)
            attention.install(model)
        except ValueError:  # an attention transformers does not register: decode with it as it is
            pass

    @property
    def device(self) -> torch.device:
        """Where the model's parameters (and so the decode loop) live."""
        return next(self.model.parameters()).device

    def generate(
        self,
        prompts: DataProto,
        *,
        n: int = 1,
        sampling: SamplingParams | None = None,
        greedy: bool = False,
        seed: int | None = None,
        stop_token_ids: tuple[int, ...] = (),
    ) -> DataProto:
        """Generate ``n`` responses for each prompt row.

        :param prompts: ``input_ids`` and ``attention_mask`` (B, P), left-padded;
            optionally ``position_ids``; any other columns ride along.
        :param n: samples per prompt; output rows ``i*n .. i*n+n-1`` belong to
            prompt ``i`` (every input column is repeated, interleaved).
        :param sampling: temperature, top-p, top-k, ``max_new_tokens`` (T).
        :param greedy: argmax decoding (validation); sampling settings other
            than ``max_new_tokens`` are ignored and the n samples are equal.
        :param seed: the sampling seed: equal seeds, equal outputs (prompt ``i``'s sample ``j`` draws from
            key ``seed + i*n + j``, ``workers/rollout/sampling.py``); None: a random one.
        :param stop_token_ids: more tokens that end a response in this call,
            kept in it like EOS (an agent loop's end-of-tool-call token).
        :returns: B*n rows with ``prompts`` (P), ``responses``,
            ``response_mask`` (1 up to and including EOS), ``rollout_log_probs``
            (T, zero past the end), ``input_ids``, ``attention_mask`` and
            ``position_ids`` (P + T), plus the input's other columns.
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        sampling = sampling or SamplingParams()
        device = self.device
        input_ids = prompts.batch[INPUT_IDS].to(device)
        attention_mask = prompts.batch[ATTENTION_MASK].to(device)
        positions = prompts.batch.get(POSITION_IDS)
        positions = positions_from_mask(attention_mask) if positions is None else positions.to(device)
        if seed is None:
            seed = int(torch.randint(0, 2**62, ()))
        stops = sampling.stop_ids(self.eos_token_ids, stop_token_ids, greedy=greedy)
        # Greedy samples of one prompt are identical: decode each prompt once.
        expand = 1 if greedy else n
        keys = sample_keys(seed, input_ids.shape[0] * expand, device)
        start = time.perf_counter()
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                slots = self._continuous_slots(input_ids.shape, expand, sampling.max_new_tokens)
                if slots is not None:
                    responses, log_probs, lengths, slot_share = decode_continuous(
                        self, input_ids, attention_mask, positions, expand, sampling, greedy, seed, stops, slots
                    )
                else:
                    chunks = [
                        self._decode(
                            input_ids[rows],
                            attention_mask[rows],
                            positions[rows],
                            expand,
                            sampling,
                            greedy,
                            keys[rows.start * expand : rows.stop * expand],
                            stops,
                        )
                        for rows in self._prompt_chunks(input_ids.shape, expand, sampling.max_new_tokens)
                    ]
                    responses, log_probs, lengths = (torch.cat(parts) for parts in zip(*chunks))
        finally:
            self.model.train(was_training)
        elapsed = time.perf_counter() - start
        if expand != n:
            responses, log_probs, lengths = (x.repeat_interleave(n, dim=0) for x in (responses, log_probs, lengths))
        out = self._assemble(prompts, n, input_ids, attention_mask, positions, responses, log_probs, lengths)
        tokens = int(lengths.sum()) // (n // expand)
        metrics = dict(out.meta_info.get(METRICS, {}))
        metrics.update({"rollout/generated_tokens": tokens, "rollout/generate_s": elapsed})
        if slots is not None:
            metrics["rollout/slot_utilization"] = slot_share  # mean share of the row slots decoding
        out.meta_info[METRICS] = metrics
        logger.debug("generated %d tokens for %d rows in %.3f s", tokens, len(out), elapsed)
        return out

    def kv_cache_bytes_per_row(self, capacity: int) -> int:
        """Bytes of keys and values one row holds at ``capacity`` positions (all layers, this rank's model)."""
        config = self.model.config.get_text_config(decoder=True)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        element = next(self.model.parameters()).element_size()
        return 2 * config.num_hidden_layers * kv_heads * head_dim * capacity * element

    def rows_at_once(self, capacity: int) -> int | None:
        """The most rows decoded together (``max_num_seqs``, and the rows whose ``capacity``-position caches
        fit ``max_kv_cache_bytes``); None: no bound."""
        bounds = [self.config.max_num_seqs]
        if self.config.max_kv_cache_bytes is not None:
            bounds.append(self.config.max_kv_cache_bytes // self.kv_cache_bytes_per_row(capacity))
        bounds = [b for b in bounds if b is not None]
        return min(bounds) if bounds else None

    def _prompt_chunks(self, shape: torch.Size, n: int, steps: int) -> list[slice]:
        """Consecutive prompt ranges that are decoded together (one range when nothing bounds the rows)."""
        prompts, width = shape
        rows = self.rows_at_once(width + steps)
        size = prompts if rows is None else max(1, min(prompts, rows // n))
        return [slice(i, i + size) for i in range(0, prompts, size)]

    def _continuous_slots(self, shape: torch.Size, n: int, steps: int) -> int | None:
        """Row slots for continuous batching when this call has more rows than are decoded at once (and
        ``refill`` is on and the model's cache can hold slots); None: decode statically."""
        prompts, width = shape
        if not self.config.refill or not preallocatable(self.model.config):
            return None
        rows = self.rows_at_once(width + 2 * steps)  # continuous caches hold P + 2T positions
        if rows is None or rows >= prompts * n:
            return None
        return max(rows, n)  # a prompt's samples are admitted together

    # ------------------------------------------------------------ decode loop
    def _forward(self, input_ids, attention_mask, position_ids, cache) -> torch.Tensor:
        """Next-token logits (N, V) at the last position of ``input_ids``."""
        kwargs = {self._cache_kwarg: cache, "use_cache": True}
        if self._has_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
        return out.logits[:, -1, :]

    def _prefill(self, input_ids, attention_mask, positions, n: int, steps: int) -> tuple[Cache, _DecodeState]:
        cache = make_generation_cache(self.model.config, capacity=input_ids.shape[1] + steps)
        logits = self._forward(input_ids, attention_mask, positions, cache)
        if n > 1:
            cache.batch_repeat_interleave(n)
        rep = lambda x: x.repeat_interleave(n, dim=0) if n > 1 else x  # noqa: E731
        total = input_ids.shape[0] * n
        rows = torch.arange(total, device=input_ids.device)
        live = torch.ones(total, dtype=torch.bool, device=input_ids.device)
        return cache, _DecodeState(rows, live, rep(attention_mask), rep(positions[:, -1]) + 1, rep(logits))

    def _decode(self, input_ids, attention_mask, positions, n, sampling, greedy, keys, stops):
        """Run prefill and the decode loop over rows of sample ``keys`` (B*n,); returns responses, log-probs
        (B*n, T) and lengths (B*n,)."""
        total, steps, device = input_ids.shape[0] * n, sampling.max_new_tokens, input_ids.device
        responses = torch.full((total, steps), self.pad_token_id, dtype=torch.long, device=device)
        log_probs = torch.zeros((total, steps), dtype=torch.float32, device=device)
        lengths = torch.full((total,), steps, dtype=torch.long, device=device)
        eos = torch.tensor(stops, device=device)
        cache, state = self._prefill(input_ids, attention_mask, positions, n, steps)
        finished_resident = 0  # finished rows still in the cache
        for t in range(steps):
            uniforms = None if greedy else sample_uniforms(keys[state.rows], torch.full_like(state.rows, t))
            tokens, token_log_probs = sample_next_tokens(state.logits, sampling, greedy=greedy, uniforms=uniforms)
            tokens = tokens.masked_fill(~state.live, self.pad_token_id)  # finished rows feed pad, ignored
            live_rows = state.rows[state.live]
            responses[live_rows, t] = tokens[state.live]
            log_probs[live_rows, t] = token_log_probs[state.live]
            if t == steps - 1:
                break
            done = torch.isin(tokens, eos) & state.live
            newly_done = int(done.sum())
            if newly_done:
                lengths[state.rows[done]] = t + 1
                state.live = state.live & ~done
                finished_resident += newly_done
                if finished_resident == len(state.rows):
                    break
                if finished_resident >= self.config.compact_fraction * len(state.rows):
                    keep = state.live.nonzero().squeeze(-1)
                    cache.batch_select_indices(keep)
                    state.keep(keep)
                    tokens, finished_resident = tokens[keep], 0
            state.attention_mask = torch.cat([state.attention_mask, state.attention_mask.new_ones((len(tokens), 1))], 1)
            state.logits = self._forward(tokens[:, None], state.attention_mask, state.next_position[:, None], cache)
            state.next_position = state.next_position + 1
        return responses, log_probs, lengths

    # ---------------------------------------------------------------- output
    def _assemble(self, prompts, n, input_ids, attention_mask, positions, responses, log_probs, lengths) -> DataProto:
        return assemble_rollout(prompts, n, input_ids, attention_mask, positions, responses, log_probs, lengths)


def assemble_rollout(
    prompts: DataProto,
    n: int,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    positions: torch.Tensor,
    responses: torch.Tensor,
    log_probs: torch.Tensor,
    lengths: torch.Tensor,
) -> DataProto:
    """The rollout DataProto every engine returns (the columns :meth:`BuiltinEngine.generate` lists).

    ``input_ids`` / ``attention_mask`` / ``positions`` are the (B, P) prompts
    on the decode device; ``responses`` / ``log_probs`` (B*n, T) and
    ``lengths`` (B*n,) the decoded rows, ``i*n + j`` being prompt ``i``'s
    sample ``j``. Results go back to the device the prompts came from.
    """
    steps = responses.shape[1]
    rep = lambda x: x.repeat_interleave(n, dim=0)  # noqa: E731
    prompt_ids, prompt_mask, prompt_pos = rep(input_ids), rep(attention_mask), rep(positions)
    arange = torch.arange(steps, device=responses.device)
    response_mask = (arange[None, :] < lengths[:, None]).to(prompt_mask.dtype)
    response_pos = prompt_pos[:, -1:] + 1 + arange[None, :]
    out = prompts.repeat(n, interleave=True)
    home = prompts.batch[INPUT_IDS].device
    out.batch.update(
        {
            PROMPTS: prompt_ids,
            RESPONSES: responses,
            RESPONSE_MASK: response_mask,
            ROLLOUT_LOG_PROBS: log_probs * response_mask,
            INPUT_IDS: torch.cat([prompt_ids, responses], dim=1),
            ATTENTION_MASK: torch.cat([prompt_mask, response_mask], dim=1),
            POSITION_IDS: torch.cat([prompt_pos, response_pos], dim=1),
        }
    )
    out.batch.update({k: v.to(home) for k, v in out.batch.items()})
    return out

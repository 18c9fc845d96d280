"""A KV cache sized once for the whole generation, for the built-in rollout engine.

transformers' ``DynamicCache`` grows every layer with ``torch.cat`` at each
step, copying the whole cache per token. Here each layer's keys and values
live in a buffer of ``capacity`` positions (prompt + response length),
allocated on the first write; a step writes one slice in place and hands the
attention a view of the filled part. Dropping finished rows
(:meth:`PreallocatedLayer.batch_select_indices`) moves the kept rows to the
front of the same buffers, copying only their filled part.

For continuous batching (``workers/rollout/continuous.py``) the buffers are
allocated for a fixed number of row slots, zero-filled (a slot's unused
columns are masked out, and must be finite); :meth:`PreallocatedLayer.write_rows`
puts a newly prefilled prompt's keys and values into free slots, right-aligned
at the current length, and :meth:`PreallocatedLayer.trim_left` drops leading
columns no resident row attends to any more.
"""

from __future__ import annotations

import torch
from transformers import PretrainedConfig
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

__all__ = ["PreallocatedLayer", "make_generation_cache", "preallocatable"]


class PreallocatedLayer(DynamicLayer):
    """One attention layer's keys and values in buffers of shape (B, heads, capacity, head_dim)."""

    def __init__(self, capacity: int, row_slots: int | None = None) -> None:
        super().__init__()
        self.capacity = capacity
        self.row_slots = row_slots  # None: as many rows as the first write (the static batch)
        self.length = 0
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        rows = key_states.shape[0] if self.row_slots is None else self.row_slots
        self._key_buffer = self._allocate(key_states, rows)
        self._value_buffer = self._allocate(value_states, rows)
        self._all_slots = (self._key_buffer, self._value_buffer)  # compaction keeps a prefix of these
        self.is_initialized = True

    def _allocate(self, like: torch.Tensor, rows: int) -> torch.Tensor:
        shape = (rows, like.shape[1], self.capacity, like.shape[3])
        return like.new_empty(shape) if self.row_slots is None else like.new_zeros(shape)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write the new positions in place; return views of all filled positions."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"KV cache capacity {self.capacity} exceeded (needs {end} positions)")
        self._key_buffer[:, :, self.length : end] = key_states
        self._value_buffer[:, :, self.length : end] = value_states
        self.length = end
        self._refresh_views()
        return self.keys, self.values

    def _refresh_views(self) -> None:
        self.keys = self._key_buffer[:, :, : self.length]
        self.values = self._value_buffer[:, :, : self.length]

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_max_length(self) -> int:
        return self.capacity

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            keys = self._allocate(self._key_buffer, self._key_buffer.shape[0] * repeats)
            values = self._allocate(self._value_buffer, self._value_buffer.shape[0] * repeats)
            keys[:, :, : self.length] = self.keys.repeat_interleave(repeats, dim=0)
            values[:, :, : self.length] = self.values.repeat_interleave(repeats, dim=0)
            self._key_buffer, self._value_buffer = keys, values
            self._refresh_views()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep rows ``indices`` (ascending, as when dropping finished rows), compacted in place
        to the front of the buffers: no new allocation, only the filled part is copied."""
        if self.is_initialized:
            indices = indices.to(self.device)
            kept = len(indices)
            for name in ("_key_buffer", "_value_buffer"):
                buffer = getattr(self, name)
                buffer[:kept, :, : self.length] = buffer[indices, :, : self.length]
                setattr(self, name, buffer[:kept])
            self._refresh_views()

    def write_rows(self, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        """Put ``keys``/``values`` (k, heads, p, head_dim) of k new rows into row ``slots``, right-aligned at
        ``length`` positions (columns ``length - p`` to ``length``; the columns before are zeroed)."""
        if not self.is_initialized:
            self.lazy_initialization(keys, values)
        width = keys.shape[2]
        if width > length or length > self.capacity:
            raise RuntimeError(f"cannot place {width} positions at length {length} (capacity {self.capacity})")
        slots = slots.to(self.device)
        for buffer, new in ((self._key_buffer, keys), (self._value_buffer, values)):
            buffer[slots, :, : length - width] = 0
            buffer[slots, :, length - width : length] = new
        self.length = length
        self._refresh_views()

    def restore_slots(self) -> None:
        """Every row slot back after :meth:`batch_select_indices` compacted them (slots with row slots only):
        the kept rows stay first, the others are free slots for :meth:`write_rows`."""
        if self.is_initialized and self.row_slots is not None:
            self._key_buffer, self._value_buffer = self._all_slots
            self._refresh_views()

    def grow_left(self, columns: int) -> None:
        """Insert ``columns`` zeroed positions before every row's (masked out by the caller), growing the capacity."""
        if columns <= 0 or not self.is_initialized:
            return
        for name in ("_key_buffer", "_value_buffer"):
            old = getattr(self, name)
            shape = (old.shape[0], old.shape[1], self.capacity + columns, old.shape[3])
            new = old.new_zeros(shape)
            new[:, :, columns : columns + self.length] = old[:, :, : self.length]
            setattr(self, name, new)
        self._all_slots = (self._key_buffer, self._value_buffer)
        self.capacity += columns
        self.length += columns
        self._refresh_views()

    def trim_left(self, columns: int) -> None:
        """Drop the first ``columns`` positions of every row (no resident row attends to them)."""
        if columns <= 0:
            return
        for buffer in (self._key_buffer, self._value_buffer):
            buffer[:, :, : self.length - columns] = buffer[:, :, columns : self.length].clone()
        self.length -= columns
        self._refresh_views()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of positions to remove")
        self.length = max(0, self.length + tokens_to_remove)
        if self.is_initialized:
            self._refresh_views()

    def reset(self) -> None:
        self.length = 0
        self.keys = self.values = self._key_buffer = self._value_buffer = None
        self.is_initialized = False


def preallocatable(config: PretrainedConfig) -> bool:
    """Whether every decoder layer is full attention (the layers :class:`PreallocatedLayer` serves)."""
    text_config = config.get_text_config(decoder=True)
    layer_types = getattr(text_config, "layer_types", None) or ["full_attention"] * text_config.num_hidden_layers
    return all(kind == "full_attention" for kind in layer_types)


def make_generation_cache(config: PretrainedConfig, capacity: int, row_slots: int | None = None) -> Cache:
    """A cache for ``capacity`` positions (and ``row_slots`` rows, for continuous batching): preallocated
    layers when every layer is full attention, else transformers' ``DynamicCache`` (sliding-window and
    linear-attention layers keep their own cache classes; no row slots)."""
    if not preallocatable(config):
        if row_slots is not None:
            raise ValueError("row slots need a cache of full-attention layers")
        return DynamicCache(config=config)
    layers = config.get_text_config(decoder=True).num_hidden_layers
    return Cache(layers=[PreallocatedLayer(capacity, row_slots) for _ in range(layers)])

"""The preallocated KV cache behaves like transformers' DynamicCache, without per-step copies."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, Qwen2Config

from hybridflow.workers.models import load_model_and_tokenizer
from hybridflow.workers.rollout.kv_cache import PreallocatedLayer, make_generation_cache


def _kv(rows, length, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 2, length, 4, generator=gen), torch.randn(rows, 2, length, 4, generator=gen)


def test_layer_matches_concatenation_through_repeat_and_select():
    layer = PreallocatedLayer(capacity=10)
    k0, v0 = _kv(3, 4, 0)
    keys, values = layer.update(k0, v0)
    assert torch.equal(keys, k0) and torch.equal(values, v0)
    buffer = layer._key_buffer
    layer.batch_repeat_interleave(2)  # rows a a b b c c
    ref_k, ref_v = k0.repeat_interleave(2, 0), v0.repeat_interleave(2, 0)
    for step in range(3):
        k, v = _kv(6 if step == 0 else 4, 1, step + 1)
        if step == 1:  # drop rows 1 and 4
            keep = torch.tensor([0, 2, 3, 5])
            layer.batch_select_indices(keep)
            ref_k, ref_v = ref_k[keep], ref_v[keep]
        ref_k, ref_v = torch.cat([ref_k, k], 2), torch.cat([ref_v, v], 2)
        keys, values = layer.update(k, v)
        assert torch.equal(keys, ref_k) and torch.equal(values, ref_v)
    assert layer.get_seq_length() == 7 and layer.get_mask_sizes(1) == (8, 0)
    buffer = layer._key_buffer
    layer.batch_select_indices(torch.tensor([1, 3]))
    assert layer._key_buffer.data_ptr() == buffer.data_ptr()  # compacted in place, no new buffer


def test_capacity_is_enforced():
    layer = PreallocatedLayer(capacity=3)
    layer.update(*_kv(1, 3, 0))
    with pytest.raises(RuntimeError, match="capacity 3 exceeded"):
        layer.update(*_kv(1, 1, 1))


def test_model_logits_equal_with_either_cache():
    model, _ = load_model_and_tokenizer("builtin:tiny-llama", seed=0)
    ids = torch.randint(4, 32, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    logits = {}
    caches = {"dynamic": DynamicCache(config=model.config), "prealloc": make_generation_cache(model.config, 9)}
    for name, cache in caches.items():
        with torch.no_grad():
            first = model(input_ids=ids[:, :6], attention_mask=mask[:, :6], cache=cache).logits
            second = model(input_ids=ids[:, 6:], attention_mask=mask, cache=cache).logits
        logits[name] = torch.cat([first, second], 1)
    torch.testing.assert_close(logits["prealloc"], logits["dynamic"], rtol=0, atol=1e-6)
    assert isinstance(make_generation_cache(model.config, 9).layers[0], PreallocatedLayer)


def test_sliding_window_models_keep_transformers_cache():
    config = Qwen2Config(num_hidden_layers=2, use_sliding_window=True, sliding_window=4, max_window_layers=1)
    cache = make_generation_cache(config, 9)
    assert isinstance(cache, DynamicCache)
    assert not any(isinstance(layer, PreallocatedLayer) for layer in cache.layers)

"""The CPU decode kernel computes the attention SDPA computes, and the engine's generation does not change by it."""

import copy

import pytest
import torch
import torch.nn.functional as F
from support import spiky_model

from hybridflow.core import DataProto
from hybridflow.workers import attention
from hybridflow.workers.decode_attention import decode_attention, takes
from hybridflow.workers.rollout import BuiltinEngine, EngineConfig, SamplingParams


@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (4, 4), (6, 1)])
@pytest.mark.parametrize("masked", [True, False])
def test_decode_attention_equals_sdpa(heads, kv_heads, masked):
    gen = torch.Generator().manual_seed(heads * 10 + kv_heads)
    rows, length, dim = 5, 9, 8
    query = torch.randn(rows, heads, 1, dim, generator=gen)
    key, value = (torch.randn(rows, kv_heads, length, dim, generator=gen) for _ in range(2))
    mask = None
    if masked:  # left padding: row r's first r keys are pads
        mask = (torch.arange(length)[None, :] >= torch.arange(rows)[:, None])[:, None, None, :]
    expected = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, scale=0.3, enable_gqa=heads != kv_heads
    ).transpose(1, 2)
    assert takes(query, key, mask, 0.0)
    out = decode_attention(query, key, value, mask, 0.3)
    assert out.shape == (rows, 1, heads, dim)
    assert torch.allclose(out, expected, atol=1e-6)


def test_decode_attention_takes_only_cpu_decode_steps_without_dropout():
    query, key = torch.zeros(2, 4, 1, 8), torch.zeros(2, 2, 5, 8)
    assert not takes(torch.zeros(2, 4, 3, 8), key, None, 0.0)  # a prefill: several queries a row
    assert not takes(query, key, None, 0.1)
    assert not takes(query, key, torch.zeros(2, 1, 1, 5), 0.0)  # an additive float mask
    assert not takes(query, torch.zeros(2, 3, 5, 8), None, 0.0)  # heads not a multiple of kv heads


def test_the_engine_generates_what_the_models_own_attention_generates():
    """The engine installs the wrapper; a deep copy given its plain sdpa back samples the same tokens with the
    same log-probs from the same seed, over left-padded prompts of several lengths."""
    model, tokenizer = spiky_model()
    plain = copy.deepcopy(model)
    wrapped_engine = BuiltinEngine(model, tokenizer, EngineConfig())
    assert model.config._attn_implementation == attention.PREFIX + "sdpa"
    engine = BuiltinEngine(plain, tokenizer, EngineConfig())
    attention.uninstall(plain)
    assert plain.config._attn_implementation == "sdpa"
    prompts = tokenizer(["1+2=", "12+30=", "7="], padding=True, padding_side="left", return_tensors="pt")
    batch = DataProto.from_dict({"input_ids": prompts["input_ids"], "attention_mask": prompts["attention_mask"]})
    sampling = SamplingParams(max_new_tokens=12)
    a, b = (e.generate(batch, n=3, seed=7, sampling=sampling) for e in (wrapped_engine, engine))
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    assert torch.allclose(a.batch["rollout_log_probs"], b.batch["rollout_log_probs"], atol=1e-5)
    assert int(a.batch["response_mask"].sum()) > 9  # it generated


def test_a_cpu_computes_half_precision_attention_over_query_blocks_in_fp32():
    """bf16 inputs on a CPU, several queries a row (training, prefill): the wrapper's output is the fp32 attention
    of the same values, rounded to bf16 once (a CPU's fused bf16 kernel is slower than its fp32 one), and
    gradients come back in bf16. A decode step (one query a row) stays in bf16: it is as fast there."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    model, _ = spiky_model()
    attention.install(model)
    module = model.model.layers[0].self_attn
    wrapped, own = ALL_ATTENTION_FUNCTIONS[attention.PREFIX + "sdpa"], ALL_ATTENTION_FUNCTIONS["sdpa"]
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, dim = model.config.num_attention_heads, model.config.num_key_value_heads, module.head_dim
    query = torch.randn(3, heads, 6, dim, generator=gen).bfloat16().requires_grad_()
    key, value = (torch.randn(3, kv_heads, 7, dim, generator=gen).bfloat16().requires_grad_() for _ in range(2))
    out, _ = wrapped(module, query, key, value, None, scaling=0.3)
    expected, _ = own(module, query.float(), key.float(), value.float(), None, scaling=0.3)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, expected.bfloat16())
    out.float().sum().backward()
    assert query.grad.dtype == key.grad.dtype == torch.bfloat16 and query.grad.abs().sum() > 0
    step = query[:, :, :1].detach()
    assert torch.equal(
        wrapped(module, step, key, value, None, scaling=0.3)[0], decode_attention(step, key, value, None, 0.3)
    )

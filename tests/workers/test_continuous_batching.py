"""Continuous batching in the built-in engine: refilled slots decode what the static engine decodes.

The engine holds 3 row slots for 42 prompts whose greedy responses end at very
different steps (1 to 24 tokens, a long tail), so prompts are admitted into freed slots
while others are mid-response, and the shared cache outgrows its P + 2T
positions and is trimmed. Checked against the static engine (every row at
once) and against a teacher-forced forward over each output row (the
log-probs the engine reports are those of the row's own tokens and context).
"""

from __future__ import annotations

import pytest
import torch
from support import spiky_model

from hybridflow.core.data_proto import DataProto
from hybridflow.core.keys import ATTENTION_MASK, INPUT_IDS, METRICS, RESPONSE_MASK, RESPONSES, ROLLOUT_LOG_PROBS
from hybridflow.workers.log_probs import response_log_probs
from hybridflow.workers.rollout import BuiltinEngine, EngineConfig, SamplingParams
from hybridflow.workers.rollout.kv_cache import PreallocatedLayer

BASE = [
    "max(1,2)=",
    "7",
    "max(3,8,1,5)=",
    "(12+4)*3=",
    "99",
    "1+1=",
    "min(4,2)=",
    "3*3*3=",
    "8",
    "max(9,9)=",
    "42+1=",
    "(1+2)*(3+4)=",
    "5",
    "min(7,1,3)=",
]
TEXTS = BASE + [t + "1" for t in BASE] + ["(" + t for t in BASE]
STEPS = 24


@pytest.fixture(scope="module")
def engine_parts():
    """The tiny Qwen2 with large random weights (varied greedy tokens), its EOS made likely enough that
    responses end anywhere from the first steps to the last."""
    model, tokenizer = spiky_model()
    with torch.no_grad():
        model.get_output_embeddings().weight[tokenizer.eos_token_id] *= 1.3
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    prompts = DataProto.from_dict({INPUT_IDS: batch["input_ids"], ATTENTION_MASK: batch["attention_mask"]})
    return model, tokenizer, prompts


def generate(model, tokenizer, prompts, *, n=1, greedy=True, seed=None, **config):
    engine = BuiltinEngine(model, tokenizer, EngineConfig(**config))
    return engine.generate(prompts, n=n, greedy=greedy, seed=seed, sampling=SamplingParams(max_new_tokens=STEPS))


def test_refilled_slots_give_the_static_engines_greedy_outputs(engine_parts, monkeypatch):
    model, tokenizer, prompts = engine_parts
    trims = []
    trim_left = PreallocatedLayer.trim_left
    monkeypatch.setattr(PreallocatedLayer, "trim_left", lambda self, c: (trims.append(c), trim_left(self, c)))
    static = generate(model, tokenizer, prompts)
    lengths = static.batch[RESPONSE_MASK].sum(-1)
    assert lengths.min() == 1 and lengths.max() == STEPS and float(lengths.float().median()) <= 5  # a long tail
    refilled = generate(model, tokenizer, prompts, max_num_seqs=3)
    chunked = generate(model, tokenizer, prompts, max_num_seqs=3, refill=False)
    for out in (refilled, chunked):
        for key in (RESPONSES, RESPONSE_MASK):
            assert torch.equal(out.batch[key], static.batch[key]), key
        # float noise only: other batch shapes take other CPU kernels (AVX-512 ones sum differently, ~1e-5
        # relative at this spiky model's large logits); a wrong context is off by far more
        torch.testing.assert_close(out.batch[ROLLOUT_LOG_PROBS], static.batch[ROLLOUT_LOG_PROBS], rtol=1e-5, atol=1e-5)
    assert sum(c > 0 for c in trims) >= 1  # the shared cache outgrew P + 2T and dropped columns no row used
    assert 0.8 < refilled.meta_info[METRICS]["rollout/slot_utilization"] <= 1.0
    assert "rollout/slot_utilization" not in chunked.meta_info[METRICS]


def test_sampled_rows_in_refilled_slots_report_their_own_log_probs(engine_parts):
    """n=3 samples of each prompt in 7 slots (two prompts at a time, admitted together): each row's reported
    log-probs equal a teacher-forced forward over its own prompt and response."""
    model, tokenizer, prompts = engine_parts
    out = generate(model, tokenizer, prompts, n=3, greedy=False, seed=0, max_num_seqs=7)
    assert len(out) == 3 * len(TEXTS)
    real = out.batch[RESPONSE_MASK].bool()
    with torch.no_grad():
        forced = response_log_probs(model, out).log_probs
    torch.testing.assert_close(out.batch[ROLLOUT_LOG_PROBS][real], forced[real], rtol=1e-5, atol=1e-5)
    again = generate(model, tokenizer, prompts, n=3, greedy=False, seed=0, max_num_seqs=7)
    assert torch.equal(again.batch[RESPONSES], out.batch[RESPONSES])  # equal seeds, equal samples


def test_a_kv_budget_for_fewer_rows_than_the_call_refills_slots(engine_parts):
    model, tokenizer, prompts = engine_parts
    engine = BuiltinEngine(model, tokenizer)
    width = prompts.batch[INPUT_IDS].shape[1]
    budget = 4 * engine.kv_cache_bytes_per_row(width + 2 * STEPS)  # four slots of P + 2T positions
    bounded = BuiltinEngine(model, tokenizer, EngineConfig(max_kv_cache_bytes=budget))
    assert bounded._continuous_slots(prompts.batch[INPUT_IDS].shape, 1, STEPS) == 4
    static = generate(model, tokenizer, prompts)
    out = bounded.generate(prompts, greedy=True, sampling=SamplingParams(max_new_tokens=STEPS))
    assert torch.equal(out.batch[RESPONSES], static.batch[RESPONSES])


def test_write_rows_right_aligns_a_prompt_and_trim_left_drops_leading_columns():
    layer = PreallocatedLayer(capacity=6, row_slots=3)
    keys = torch.arange(1.0, 5.0).view(1, 1, 4, 1).expand(2, 1, 4, 1).clone()  # two rows of 4 positions: 1 2 3 4
    layer.write_rows(torch.tensor([0, 2]), keys, -keys, length=4)
    short = torch.tensor([[[[7.0], [8.0]]]])  # one row of 2 positions, admitted at length 4
    layer.write_rows(torch.tensor([1]), short, -short, length=4)
    assert layer.keys[..., 0].squeeze(1).tolist() == [[1, 2, 3, 4], [0, 0, 7, 8], [1, 2, 3, 4]]
    assert torch.equal(layer.values, -layer.keys)
    layer.trim_left(2)
    assert layer.length == 2 and layer.keys[..., 0].squeeze(1).tolist() == [[3, 4], [7, 8], [3, 4]]

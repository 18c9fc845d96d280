"""The built-in rollout engine against HF ``generate`` and a teacher-forced forward pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import spiky_model

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
from hybridflow.workers.rollout import BuiltinEngine, EngineConfig, SamplingParams

PROMPT_TEXTS = ["max(1,2)=", "7", "max(3,8,1,5)=", "(12+4)*3=", "99"]


def _prompts(tokenizer, texts=PROMPT_TEXTS, **non_tensors) -> DataProto:
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    return DataProto.from_dict(
        {INPUT_IDS: batch["input_ids"], ATTENTION_MASK: batch["attention_mask"]},
        {"text": texts, **non_tensors},
    )


def _hf_responses(model, prompts: DataProto, max_new_tokens: int, eos: int, pad: int) -> torch.Tensor:
    ids = prompts.batch[INPUT_IDS]
    out = model.generate(
        ids,
        attention_mask=prompts.batch[ATTENTION_MASK],
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    responses = out[:, ids.shape[1] :]
    return torch.nn.functional.pad(responses, (0, max_new_tokens - responses.shape[1]), value=pad)


def _teacher_forced_log_probs(model, out: DataProto, temperature: float) -> torch.Tensor:
    prompt_len = out.batch[PROMPTS].shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=out.batch[INPUT_IDS],
            attention_mask=out.batch[ATTENTION_MASK],
            position_ids=out.batch[POSITION_IDS],
        ).logits
    logits = logits[:, prompt_len - 1 : -1] / temperature
    picked = logits.log_softmax(-1).gather(-1, out.batch[RESPONSES].unsqueeze(-1)).squeeze(-1)
    return picked * out.batch[RESPONSE_MASK]


def _lengths(out: DataProto) -> torch.Tensor:
    return out.batch[RESPONSE_MASK].sum(-1)


@pytest.fixture(scope="module")
def qwen():
    return spiky_model("tiny-qwen2")


def _frequent_mid_token(responses: torch.Tensor) -> int:
    """A token that greedy decoding emits mid-response in some rows but not all: as EOS it ends
    rows at different steps."""
    first_hits = {}
    for tok in torch.unique(responses).tolist():
        hit = (responses == tok).any(-1)
        if 0 < hit.sum() < len(responses) and not (responses[:, 0] == tok).all():
            first_hits[tok] = int(hit.sum())
    return max(first_hits, key=first_hits.get)


@pytest.mark.parametrize("fraction", [0.0, 0.25])
@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-llama"])
def test_greedy_equals_hf_generate_with_left_padding_and_eos(name, fraction):
    model, tokenizer = spiky_model(name)
    prompts = _prompts(tokenizer)
    steps = 12
    plain = _hf_responses(model, prompts, steps, eos=tokenizer.eos_token_id, pad=tokenizer.pad_token_id)
    eos = _frequent_mid_token(plain)
    expected = _hf_responses(model, prompts, steps, eos=eos, pad=tokenizer.pad_token_id)
    engine = BuiltinEngine(model, tokenizer, EngineConfig(eos_token_ids=(eos,), compact_fraction=fraction))
    out = engine.generate(prompts, sampling=SamplingParams(max_new_tokens=steps), greedy=True)
    assert torch.equal(out.batch[RESPONSES], expected)
    lengths = _lengths(out)
    assert 1 <= lengths.min() < lengths.max()  # rows really ended at different steps
    # the response mask covers exactly up to and including the first EOS
    for row, length in zip(out.batch[RESPONSES], lengths.tolist()):
        hits = (row == eos).nonzero().flatten().tolist()
        assert length == (hits[0] + 1 if hits else steps)


def test_sampled_log_probs_equal_teacher_forcing(qwen):
    model, tokenizer = qwen
    engine = BuiltinEngine(model, tokenizer)
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=10)
    out = engine.generate(_prompts(tokenizer), n=4, sampling=params, seed=0)
    expected = _teacher_forced_log_probs(model, out, temperature=0.7)
    torch.testing.assert_close(out.batch[ROLLOUT_LOG_PROBS], expected, rtol=0, atol=1e-4)
    assert (out.batch[ROLLOUT_LOG_PROBS] < 0).sum() == out.batch[RESPONSE_MASK].sum()


def test_output_layout(qwen):
    model, tokenizer = qwen
    engine = BuiltinEngine(model, tokenizer)
    prompts = _prompts(tokenizer, uid=["a", "b", "c", "d", "e"])
    n, steps = 3, 9
    out = engine.generate(prompts, n=n, sampling=SamplingParams(max_new_tokens=steps), seed=1)
    p_ids, p_mask = prompts.batch[INPUT_IDS], prompts.batch[ATTENTION_MASK]
    assert len(out) == len(prompts) * n
    # a prompt's samples are adjacent, every column repeated alongside
    assert torch.equal(out.batch[PROMPTS], p_ids.repeat_interleave(n, 0))
    assert list(out.non_tensor_batch["uid"]) == [u for u in "abcde" for _ in range(n)]
    assert list(out.non_tensor_batch["text"]) == [t for t in PROMPT_TEXTS for _ in range(n)]
    responses, mask = out.batch[RESPONSES], out.batch[RESPONSE_MASK]
    assert responses.shape == (15, steps)
    assert torch.equal(out.batch[INPUT_IDS], torch.cat([out.batch[PROMPTS], responses], 1))
    assert torch.equal(out.batch[ATTENTION_MASK], torch.cat([p_mask.repeat_interleave(n, 0), mask], 1))
    # padding after the end; EOS is the last counted token of rows that stopped early
    assert (responses[mask == 0] == tokenizer.pad_token_id).all()
    lengths = _lengths(out)
    ended = lengths < steps
    assert ended.any() and (~ended).any()
    assert (responses[ended, lengths[ended] - 1] == tokenizer.eos_token_id).all()
    for row, length in zip(responses, lengths.tolist()):  # no EOS before the last counted token
        assert tokenizer.eos_token_id not in row[: length - 1].tolist()
    # positions: 0.. over real prompt tokens, then continuing by one per response slot
    real = p_mask.sum(-1).repeat_interleave(n)
    pos = out.batch[POSITION_IDS]
    for r in range(len(out)):
        prompt_len = p_ids.shape[1]
        assert pos[r, prompt_len - int(real[r]) : prompt_len].tolist() == list(range(int(real[r])))
        assert pos[r, prompt_len:].tolist() == list(range(int(real[r]), int(real[r]) + steps))
    assert out.meta_info[METRICS]["rollout/generated_tokens"] == int(mask.sum())


class _ForwardRecorder:
    """Records (batch, sequence) of every model forward, through a pre-forward hook."""

    def __init__(self, model):
        self.shapes: list[tuple[int, int]] = []
        self.handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.shapes.append(tuple(ids.shape))

    def close(self):
        self.handle.remove()


def _expected_decode_batches(lengths: torch.Tensor, steps: int, fraction: float) -> list[tuple[int, int]]:
    """Rows in each decode forward, simulated from the response lengths: after the token at step
    s - 1, rows of length s are done; they leave once done rows are >= fraction of the resident ones."""
    resident, batches = len(lengths), []
    for s in range(1, steps):
        live = int((lengths > s).sum())
        if live == 0:
            break
        if int((lengths == s).sum()) and resident - live >= fraction * resident:
            resident = live
        batches.append((resident, 1))
    return batches


@pytest.mark.parametrize("fraction", [0.0, 0.3])
def test_prefill_once_per_prompt_and_finished_rows_stop_costing_compute(qwen, fraction):
    model, tokenizer = qwen
    engine = BuiltinEngine(model, tokenizer, EngineConfig(compact_fraction=fraction))
    prompts = _prompts(tokenizer)
    n, steps = 6, 16
    recorder = _ForwardRecorder(model)
    try:
        out = engine.generate(prompts, n=n, sampling=SamplingParams(max_new_tokens=steps), seed=2)
    finally:
        recorder.close()
    prefill, *decode = recorder.shapes
    assert prefill == tuple(prompts.batch[INPUT_IDS].shape)  # 5 rows, not 30
    lengths = _lengths(out)
    assert decode == _expected_decode_batches(lengths, steps, fraction)
    if fraction == 0.0:  # every forward runs exactly the rows still going
        assert decode == [(int((lengths > s).sum()), 1) for s in range(1, steps) if (lengths > s).any()]
    assert decode[-1][0] < n * len(prompts)  # finished rows did leave the batch
    # rows riding along after they finished must not disturb the others
    expected = _teacher_forced_log_probs(model, out, temperature=1.0)
    torch.testing.assert_close(out.batch[ROLLOUT_LOG_PROBS], expected, rtol=0, atol=1e-4)


def test_seeded_sampling_is_reproducible(qwen):
    model, tokenizer = qwen
    engine = BuiltinEngine(model, tokenizer)
    prompts, params = _prompts(tokenizer), SamplingParams(max_new_tokens=8)
    a = engine.generate(prompts, n=4, sampling=params, seed=7)
    b = engine.generate(prompts, n=4, sampling=params, seed=7)
    c = engine.generate(prompts, n=4, sampling=params, seed=8)
    assert torch.equal(a.batch[RESPONSES], b.batch[RESPONSES])
    assert torch.equal(a.batch[ROLLOUT_LOG_PROBS], b.batch[ROLLOUT_LOG_PROBS])
    assert not torch.equal(a.batch[RESPONSES], c.batch[RESPONSES])


def test_first_token_frequencies_follow_the_model(qwen):
    """n samples share one prefill: their first tokens must still be draws from the prompt's
    next-token distribution (here at temperature 1.5, no filtering)."""
    model, tokenizer = qwen
    engine = BuiltinEngine(model, tokenizer)
    prompts = _prompts(tokenizer, texts=["max(3,8,1,5)=", "12"])
    n = 3000
    out = engine.generate(prompts, n=n, sampling=SamplingParams(temperature=1.5, max_new_tokens=1), seed=3)
    with torch.no_grad():
        logits = model(**{k: prompts.batch[k] for k in (INPUT_IDS, ATTENTION_MASK)}).logits[:, -1]
    expected = (logits / 1.5).softmax(-1)
    for i in range(2):
        first = out.batch[RESPONSES][i * n : (i + 1) * n, 0]
        freq = torch.bincount(first, minlength=expected.shape[-1]).float() / n
        assert 0.5 * (freq - expected[i]).abs().sum() < 0.06  # total variation distance


def test_greedy_samples_of_a_prompt_are_equal_and_top_k_one_is_greedy(qwen):
    model, tokenizer = qwen
    engine = BuiltinEngine(model, tokenizer)
    prompts = _prompts(tokenizer)
    greedy = engine.generate(prompts, n=3, sampling=SamplingParams(max_new_tokens=6), greedy=True)
    single = engine.generate(prompts, sampling=SamplingParams(max_new_tokens=6), greedy=True)
    assert torch.equal(greedy.batch[RESPONSES], single.batch[RESPONSES].repeat_interleave(3, 0))
    top1 = engine.generate(prompts, n=3, sampling=SamplingParams(top_k=1, max_new_tokens=6), seed=0)
    assert torch.equal(top1.batch[RESPONSES], greedy.batch[RESPONSES])


def test_given_position_ids_are_used(qwen):
    """Position ids in the input replace the ones derived from the mask (shifting them by 5 changes
    a RoPE model's outputs; the engine must continue from the given last position)."""
    model, tokenizer = qwen
    engine = BuiltinEngine(model, tokenizer)
    prompts = _prompts(tokenizer)
    shifted = prompts.select()
    mask = prompts.batch[ATTENTION_MASK]
    shifted.batch[POSITION_IDS] = (mask.cumsum(-1) - 1).clamp(min=0) + 5 * mask
    out = engine.generate(shifted, sampling=SamplingParams(max_new_tokens=4), greedy=True)
    assert out.batch[POSITION_IDS][:, -4:].tolist() == [list(range(int(m.sum()) + 5, int(m.sum()) + 9)) for m in mask]
    expected = _teacher_forced_log_probs(model, out, temperature=1.0)
    torch.testing.assert_close(out.batch[ROLLOUT_LOG_PROBS], expected, rtol=0, atol=1e-4)


def test_rejects_bad_n_and_bad_compact_fraction(qwen):
    model, tokenizer = qwen
    with pytest.raises(ValueError, match="n must be"):
        BuiltinEngine(model, tokenizer).generate(_prompts(tokenizer), n=0)
    with pytest.raises(ValueError, match="compact_fraction"):
        EngineConfig(compact_fraction=1.5)


def test_training_mode_is_restored(qwen):
    model, tokenizer = qwen
    model.train()
    try:
        BuiltinEngine(model, tokenizer).generate(_prompts(tokenizer), sampling=SamplingParams(max_new_tokens=2))
        assert model.training
    finally:
        model.eval()


def test_non_tensor_columns_survive_as_object_arrays(qwen):
    model, tokenizer = qwen
    extra = [{"index": i} for i in range(len(PROMPT_TEXTS))]
    out = BuiltinEngine(model, tokenizer).generate(
        _prompts(tokenizer, extra_info=extra), n=2, sampling=SamplingParams(max_new_tokens=2), seed=0
    )
    assert isinstance(out.non_tensor_batch["extra_info"], np.ndarray)
    assert [e["index"] for e in out.non_tensor_batch["extra_info"]] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_a_kv_cache_bound_decodes_in_chunks_with_the_same_greedy_outputs(qwen):
    model, tokenizer = qwen
    prompts = _prompts(tokenizer)
    sampling = SamplingParams(max_new_tokens=6)
    whole = BuiltinEngine(model, tokenizer).generate(prompts, n=2, sampling=sampling, greedy=True)
    # room for one prompt at a time; refill=False: chunks (tests/workers/test_continuous_batching.py refills)
    bounded = BuiltinEngine(model, tokenizer, EngineConfig(max_kv_cache_bytes=1, refill=False))
    width = prompts.batch["input_ids"].shape[1]
    assert len(bounded._prompt_chunks(prompts.batch["input_ids"].shape, 1, 6)) == len(prompts)
    per_row = bounded.kv_cache_bytes_per_row(width + 6)
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    assert per_row == 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * (width + 6) * 4  # fp32
    chunked = bounded.generate(prompts, n=2, sampling=sampling, greedy=True)
    for key in ("responses", "response_mask"):
        assert torch.equal(chunked.batch[key], whole.batch[key]), key
    # smaller batches, other kernels: the same log-probs up to float noise
    torch.testing.assert_close(chunked.batch["rollout_log_probs"], whole.batch["rollout_log_probs"], rtol=0, atol=1e-5)


def test_ignore_eos_samples_every_response_to_its_length_and_greedy_still_stops(qwen):
    """``ignore_eos`` (veRL's key): equal work per response. The same seed samples the same tokens up to each
    row's first EOS (a sample's randomness is keyed by row and position), then goes on past it."""
    model, tokenizer = qwen
    engine = BuiltinEngine(model, tokenizer)
    prompts, eos = _prompts(tokenizer), tokenizer.eos_token_id
    stopping = engine.generate(prompts, n=4, sampling=SamplingParams(max_new_tokens=12), seed=5)
    running = engine.generate(prompts, n=4, sampling=SamplingParams(max_new_tokens=12, ignore_eos=True), seed=5)
    lengths = _lengths(stopping)
    assert lengths.min() < 12  # some rows did sample EOS early
    assert (_lengths(running) == 12).all() and running.batch[RESPONSE_MASK].bool().all()
    for row, length in enumerate(lengths.tolist()):  # the stopped rows are prefixes of the running ones
        assert torch.equal(running.batch[RESPONSES][row, :length], stopping.batch[RESPONSES][row, :length])
    assert (running.batch[RESPONSES] == eos).any()  # an EOS sampled inside a response, kept as a token
    greedy = SamplingParams(max_new_tokens=12, ignore_eos=True)
    assert torch.equal(
        engine.generate(prompts, sampling=greedy, greedy=True).batch[RESPONSES],
        engine.generate(prompts, sampling=SamplingParams(max_new_tokens=12), greedy=True).batch[RESPONSES],
    )

"""The streaming rollout (workers/rollout/stream.py): requests decode in one loop, weights swap in flight.

The tiny Qwen2 with large random weights (responses end anywhere from the
first step to the last) decodes in 5 row slots; requests of 6 prompts x 2
samples are submitted one at a time or several at once, with prompts of
other widths, and new weights arrive between steps.
"""

from __future__ import annotations

import copy
import threading
import time

import pytest
import torch
from support import spiky_model

from hybridflow.core.data_proto import DataProto
from hybridflow.core.keys import (
    ATTENTION_MASK,
    INPUT_IDS,
    RESPONSE_MASK,
    RESPONSES,
    ROLLOUT_LOG_PROBS,
    ROLLOUT_VERSIONS,
)
from hybridflow.workers.log_probs import response_log_probs
from hybridflow.workers.rollout import BuiltinEngine, EngineConfig, SamplingParams
from hybridflow.workers.rollout.stream import RolloutStream

TEXTS = [
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
    "(1+2)*(3+4)=((5))",
    "5",
    "min(7,1,3)=",
    "1",
    "22",
    "(1+2)*(3+4)*(5+6)=",
    "0",
]
STEPS, SLOTS, N = 20, 5, 2
SEED = 40


@pytest.fixture(scope="module")
def parts():
    model, tokenizer = spiky_model()
    with torch.no_grad():
        model.get_output_embeddings().weight[tokenizer.eos_token_id] *= 1.3
    return model, tokenizer


def prompts_of(tokenizer, texts):
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    return DataProto.from_dict({INPUT_IDS: batch["input_ids"], ATTENTION_MASK: batch["attention_mask"]})


def stream_of(model, tokenizer, swap="step"):
    engine = BuiltinEngine(model, tokenizer, EngineConfig(max_num_seqs=SLOTS))
    return engine, RolloutStream.builtin(engine, SLOTS, N, SamplingParams(max_new_tokens=STEPS), swap)


@pytest.mark.parametrize("together", [False, True], ids=["one-at-a-time", "together"])
def test_a_request_samples_what_a_generate_call_samples(parts, together):
    """Each sample's randomness is its own: requests decoded one at a time or in the slots together sample what
    the engine's own refilling call gives each (the same tokens; log-probs up to the rounding of other shapes)."""
    model, tokenizer = parts
    engine, stream = stream_of(model, tokenizer)
    chunks = [prompts_of(tokenizer, texts) for texts in (TEXTS[:6], TEXTS[6:12], TEXTS[12:])]
    try:
        got = []
        for request, prompts in enumerate(chunks):
            stream.submit(request, prompts, seed=SEED + request)
            if not together:
                got.append(stream.take(request, timeout_s=60))
        got = got or [stream.take(request, timeout_s=60) for request in range(len(chunks))]
    finally:
        stream.close()
    for request, prompts in enumerate(chunks):
        want = engine.generate(prompts, n=N, seed=SEED + request, sampling=SamplingParams(max_new_tokens=STEPS))
        for key in (RESPONSES, RESPONSE_MASK):
            assert torch.equal(got[request].batch[key], want.batch[key]), key
        atol = 1e-5 if together else 1e-6
        torch.testing.assert_close(
            got[request].batch[ROLLOUT_LOG_PROBS], want.batch[ROLLOUT_LOG_PROBS], rtol=0, atol=atol
        )
        lengths = want.batch[RESPONSE_MASK].sum(-1)
        assert lengths.min() < 5 and lengths.max() == STEPS  # long and short rows: slots were refilled


def test_requests_in_flight_together_report_their_own_tokens_log_probs(parts):
    """Three requests (prompts of other widths than the first: the cache grows on the left) share the slots;
    every row's log-probs equal a teacher-forced forward over its own prompt and response."""
    model, tokenizer = parts
    _, stream = stream_of(model, tokenizer)
    try:
        chunks = (TEXTS[:6], TEXTS[6:12], TEXTS[12:])  # the last holds the longest prompt
        for request, texts in enumerate(chunks):
            stream.submit(request, prompts_of(tokenizer, texts), seed=request)
        outs = [stream.take(request, timeout_s=60) for request in range(3)]
    finally:
        stream.close()
    for out, texts in zip(outs, chunks):
        assert len(out) == N * len(texts)
        real = out.batch[RESPONSE_MASK].bool()
        with torch.no_grad():
            forced = response_log_probs(model, out).log_probs
        torch.testing.assert_close(out.batch[ROLLOUT_LOG_PROBS][real], forced[real], rtol=1e-5, atol=1e-5)
        assert torch.equal(out.batch[ROLLOUT_VERSIONS] >= 0, real)  # versions on the response tokens only


def test_new_weights_enter_between_steps_and_stamp_later_tokens(parts):
    """A weight swap while rows decode (swap="step"): tokens sampled after it carry the new version, and no
    token of a row is older than one before it."""
    model, tokenizer = parts
    model = type(model)(model.config)
    model.load_state_dict(parts[0].state_dict())
    _, stream = stream_of(model, tokenizer)
    steps_seen = threading.Event()
    step = stream.decoder.step

    def counting_step():
        if stream.decoder.decode_steps >= 8:
            steps_seen.set()
        return step()

    stream.decoder.step = counting_step
    try:
        stream.submit(0, prompts_of(tokenizer, TEXTS), seed=0)
        assert steps_seen.wait(30)
        with stream.paused():
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(0.9)
            stream.set_version(1)
        out = stream.take(0, timeout_s=60)
    finally:
        stream.close()
    versions, real = out.batch[ROLLOUT_VERSIONS], out.batch[RESPONSE_MASK].bool()
    assert set(versions[real].tolist()) == {0, 1}
    mixed = [(row[m] == 0).any() and (row[m] == 1).any() for row, m in zip(versions, real)]
    assert any(mixed)  # a sample in flight continued under the new weights
    assert all(bool((row[m][1:] >= row[m][:-1]).all()) for row, m in zip(versions, real))


def test_a_drained_swap_waits_until_nothing_decodes(parts):
    """swap="drained" (one_step_off): the weights enter only once every submitted row has ended."""
    model, tokenizer = parts
    _, stream = stream_of(model, tokenizer, swap="drained")
    try:
        stream.submit(0, prompts_of(tokenizer, TEXTS[:6]), seed=0)
        with stream.paused():
            assert not stream.decoder.busy
            stream.set_version(1)
        out = stream.take(0, timeout_s=60)
    finally:
        stream.close()
    real = out.batch[RESPONSE_MASK].bool()
    assert set(out.batch[ROLLOUT_VERSIONS][real].tolist()) == {0}


def drive(model, tokenizer, swap: str, ahead: int, delay_s: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The pipelined driver's calls on one stream: batch j submitted once version j - ahead exists and named with
    it (the first ``ahead + 1`` together), batch j holding version j; new weights (each version scales the model)
    after every take. ``delay_s``: the driver's pause before each call (an update's time), so that the decoder
    reaches its swap points first; 0: the weights wait for the decoder. Each batch's responses and versions."""
    model = copy.deepcopy(model)  # the weights it writes are its own
    _, stream = stream_of(model, tokenizer, swap=swap)
    batches, out = [prompts_of(tokenizer, TEXTS[i : i + 4]) for i in range(0, 16, 4)], []

    def submit(j: int) -> None:
        time.sleep(delay_s)
        stream.submit(j, batches[j], seed=SEED + j, named=True, holds_version=j)

    def new_weights(version: int, admit: list[int]) -> None:
        time.sleep(delay_s)
        with stream.paused(weights=True), torch.no_grad():
            for p in model.parameters():
                p.mul_(0.97)
            stream.set_version(version, admit)

    try:
        for j in range(ahead + 1):
            submit(j)
        stream.admit(list(range(ahead + 1)))
        for version in range(1, len(batches) + 1):
            out.append(stream.take(version - 1, timeout_s=60))
            due = [j for j in [version + ahead] if j < len(batches)]
            for j in due:
                submit(j)
            new_weights(version, due)
    finally:
        stream.close()
    return [(o.batch[RESPONSES], o.batch[ROLLOUT_VERSIONS]) for o in out]


@pytest.mark.parametrize("swap, ahead", [("batch", 2), ("drained", 1)])
def test_a_reproducible_swap_decodes_alike_however_the_calls_are_timed(parts, swap, ahead):
    """With the ``batch`` swap (async, reproducible) or the ``drained`` one (one step off), named admission makes
    the decoder's steps a function of the requests: a driver that waits 30 ms before every call and one that
    waits for nothing get the same tokens from the same weight versions. The ``batch`` swap lets a sample in
    flight continue under the next version (mixed versions: the fence is mid-batch, not only at drained points)."""
    fast = drive(*parts, swap, ahead, 0.0)
    slow = drive(*parts, swap, ahead, 0.03)
    for (tokens, versions), (tokens_slow, versions_slow) in zip(fast, slow, strict=True):
        assert torch.equal(tokens, tokens_slow) and torch.equal(versions, versions_slow)
    versions = torch.cat([v for _, v in fast])
    assert set(versions[versions >= 0].tolist()) == {0, 1, 2}  # the last batch enters with version 4 - 2
    rows = [row[row >= 0] for _, v in fast for row in v]
    assert any(len(set(row.tolist())) > 1 for row in rows) == (swap == "batch")

"""Token choice of the rollout engine: top-k / top-p filtering, log-probs, sampling frequencies."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.core.sampling import SamplingParams
from hybridflow.workers.rollout.sampling import (
    filter_top_k_top_p,
    prompt_keys,
    sample_keys,
    sample_next_tokens,
    sample_uniforms,
)

NEG = float("-inf")


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([[1.0, 4.0, 2.0, 3.0], [0.0, -1.0, 5.0, 5.0]])
    out = filter_top_k_top_p(logits, top_k=2, top_p=1.0)
    assert out.tolist() == [[NEG, 4.0, NEG, 3.0], [NEG, NEG, 5.0, 5.0]]


def test_top_p_keeps_the_smallest_nucleus_reaching_p():
    # probabilities 0.5, 0.25, 0.125, 0.125 (in shuffled order)
    probs = torch.tensor([[0.125, 0.5, 0.125, 0.25]])
    logits = probs.log()
    # 0.5 alone < 0.6, 0.5 + 0.25 reaches it: keep two
    assert filter_top_k_top_p(logits, 0, 0.6).isfinite().tolist() == [[False, True, False, True]]
    # p = 0.5 is reached by the top token alone
    assert filter_top_k_top_p(logits, 0, 0.5).isfinite().tolist() == [[False, True, False, False]]
    # a tiny p still keeps the most likely token
    assert filter_top_k_top_p(logits, 0, 1e-6).isfinite().tolist() == [[False, True, False, False]]
    assert torch.equal(filter_top_k_top_p(logits, 0, 1.0), logits)


def test_log_probs_are_of_logits_over_temperature_before_filtering():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    params = SamplingParams(temperature=0.5, top_k=1)  # top_k=1: the argmax is the only choice
    tokens, log_probs = sample_next_tokens(logits, params, greedy=False, uniforms=torch.tensor([0.99]))
    assert tokens.tolist() == [0]
    scaled = [x / 0.5 for x in (2.0, 1.0, 0.0, -1.0)]
    expected = scaled[0] - math.log(sum(math.exp(s) for s in scaled))
    assert log_probs.item() == pytest.approx(expected, abs=1e-6)


def test_greedy_uses_temperature_one():
    logits = torch.tensor([[0.0, 3.0, 1.0]])
    tokens, log_probs = sample_next_tokens(logits, SamplingParams(temperature=0.1), greedy=True, uniforms=None)
    assert tokens.tolist() == [1]
    assert log_probs.item() == pytest.approx(3.0 - math.log(1 + math.exp(3.0) + math.exp(1.0)), abs=1e-6)


def test_sampling_frequencies_match_the_filtered_distribution():
    logits = torch.tensor([1.0, 0.5, 0.0, -0.5, -3.0]).log_softmax(-1)
    params = SamplingParams(temperature=0.8, top_k=4, top_p=0.9)
    draws = 40_000
    uniforms = sample_uniforms(sample_keys(0, draws, "cpu"), torch.zeros(draws, dtype=torch.long))
    tokens, _ = sample_next_tokens(logits.expand(draws, -1), params, greedy=False, uniforms=uniforms)
    freq = torch.bincount(tokens, minlength=5).double() / draws
    # By hand: probabilities of logits / 0.8; top_k=4 drops token 4; top-p then
    # keeps the shortest prefix of the rest (sorted: 0, 1, 2, 3) whose mass,
    # renormalized after top-k (as HF's warpers do), reaches 0.9.
    p = (logits / 0.8).softmax(-1).double()
    p[4] = 0
    p = p / p.sum()
    cum, keep = 0.0, []
    for i in range(4):
        keep.append(i)
        cum += p[i].item()
        if cum >= 0.9:
            break
    expected = torch.zeros(5, dtype=torch.float64)
    expected[keep] = p[keep] / p[keep].sum()
    assert (freq - expected).abs().max() < 0.01
    assert freq[4] == 0


def test_a_uniform_number_picks_the_token_whose_cdf_interval_holds_it():
    logits = torch.tensor([0.5, 0.0, 0.25, 0.25]).log().expand(5, -1)  # token 1 has probability 0
    uniforms = torch.tensor([0.0, 0.49, 0.5, 0.74, 0.76])  # CDF: 0.5, 0.5, 0.75, 1.0
    tokens, _ = sample_next_tokens(logits, SamplingParams(temperature=1.0), greedy=False, uniforms=uniforms)
    assert tokens.tolist() == [0, 0, 2, 2, 3]


def test_a_samples_numbers_depend_on_its_key_and_token_index_only():
    keys, steps = torch.tensor([7, 8, 9]), torch.tensor([0, 3, 5])
    alone = [float(sample_uniforms(keys[i : i + 1], steps[i : i + 1])) for i in range(3)]
    assert sample_uniforms(keys, steps).tolist() == alone  # beside others, the same numbers
    assert sample_uniforms(keys.flip(0), steps.flip(0)).tolist() == alone[::-1]  # in any order
    assert len(set(sample_uniforms(torch.full((3,), 7), torch.arange(3)).tolist())) == 3  # a new number per token
    many = sample_uniforms(torch.arange(200_000), torch.zeros(200_000, dtype=torch.long))
    assert 0.0 <= float(many.min()) and float(many.max()) < 1.0
    # uniform on [0, 1): mean 1/2, variance 1/12, adjacent keys uncorrelated (200k draws: sd of the mean ~0.0006)
    assert abs(float(many.mean()) - 0.5) < 0.003 and abs(float(many.var()) - 1 / 12) < 0.002
    assert abs(float(torch.corrcoef(torch.stack([many[:-1], many[1:]]))[0, 1])) < 0.01


class SplitMix64:
    """The reference generator in plain Python integers (Vigna's splitmix64: add the golden gamma, then mix)."""

    MASK = 2**64 - 1

    def __init__(self, state: int) -> None:
        self.state = state & self.MASK

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & self.MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & self.MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & self.MASK
        return z ^ (z >> 31)


def reference_uniform(key: int, step: int) -> float:
    """Token ``step`` of sample ``key``: output ``step + 1`` of a splitmix64 seeded with the key's own mix (the
    first output of a generator at ``key - gamma``), its top 53 bits as a fraction."""
    generator = SplitMix64(SplitMix64(key - 0x9E3779B97F4A7C15).next())
    for _ in range(step + 1):
        out = generator.next()
    return (out >> 11) * 2.0**-53


def test_splitmix64_s_known_first_output():
    # splitmix64 seeded 0 first gives 0xE220A8397B1DCDAF (the published test value); key 0 mixes to 0, so its token 0
    # draws exactly that output's top 53 bits
    assert SplitMix64(0).next() == 0xE220A8397B1DCDAF
    assert sample_uniforms(torch.tensor([0]), torch.tensor([0])).item() == (0xE220A8397B1DCDAF >> 11) * 2.0**-53


def test_a_samples_numbers_are_splitmix64_s_outputs_bit_for_bit():
    keys = [0, 1, 7, 12_345, 2**62 + 5, 2**31 - 1]
    steps = [0, 1, 2, 5, 127, 511]
    pairs = [(k, t) for k in keys for t in steps]
    got = sample_uniforms(torch.tensor([k for k, _ in pairs]), torch.tensor([t for _, t in pairs])).tolist()
    assert got == [reference_uniform(k, t) for k, t in pairs]


def test_keys_of_a_call_s_rows_are_the_seed_plus_the_row_and_a_prompt_s_sample_0_leads_its_group():
    assert sample_keys(100, 6, "cpu").tolist() == [100, 101, 102, 103, 104, 105]
    assert prompt_keys(100, 3, 2) == [100, 102, 104]
    # vLLM's request seeds (prompt_keys) plus the sample index are the built-in engine's row keys
    rows = sample_keys(7, 4 * 3, "cpu").view(4, 3)
    assert rows[:, 0].tolist() == prompt_keys(7, 4, 3)
    assert (rows - rows[:, :1]).tolist() == [[0, 1, 2]] * 4


def test_each_row_gets_the_log_prob_of_its_own_token():
    # two rows over four tokens (more tokens than rows: an index taken from the wrong dimension shows)
    logits = torch.tensor([[0.0, 1.0, 2.0, 0.5], [3.0, 0.0, 1.0, 2.5]])
    uniforms = (0.2, 0.99)  # row 0 lands in token 1's CDF interval, row 1 in its last token's
    tokens, log_probs = sample_next_tokens(
        logits, SamplingParams(temperature=2.0), greedy=False, uniforms=torch.tensor(uniforms)
    )
    scaled = logits / 2.0
    expected_tokens = [int((row.softmax(-1).double().cumsum(-1) <= u).sum()) for row, u in zip(scaled, uniforms)]
    assert expected_tokens == [1, 3]
    assert tokens.tolist() == expected_tokens
    expected = [
        scaled[i, t].item() - math.log(sum(math.exp(x) for x in scaled[i].tolist()))
        for i, t in enumerate(expected_tokens)
    ]
    assert log_probs.tolist() == pytest.approx(expected, abs=1e-6)


def test_top_k_beyond_the_vocabulary_keeps_every_token():
    logits = torch.tensor([[1.0, 4.0, 2.0, 3.0]])
    assert torch.equal(filter_top_k_top_p(logits, top_k=10, top_p=1.0), logits)
    assert torch.equal(filter_top_k_top_p(logits, top_k=4, top_p=1.0), logits)
    assert torch.equal(filter_top_k_top_p(logits, top_k=-1, top_p=1.0), logits)  # vLLM's "off"


def test_top_p_of_one_keeps_a_token_the_float32_sum_before_it_already_rounds_to_one():
    logits = torch.tensor([[0.0, -30.0]])  # probabilities 1 - 9e-14 and 9e-14: the first alone sums to 1.0 in fp32
    assert torch.equal(filter_top_k_top_p(logits, top_k=0, top_p=1.0), logits)


@pytest.mark.parametrize(
    "kwargs", [{"temperature": 0.0}, {"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"max_new_tokens": 0}]
)
def test_invalid_sampling_params(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)

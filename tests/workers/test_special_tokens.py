"""The one pad/EOS rule of every rollout engine and the rollout server (workers/rollout/base.py)."""

from types import SimpleNamespace

import pytest

from hybridflow.workers.rollout.base import special_token_ids


def tokenizer(eos, pad):
    return SimpleNamespace(eos_token_id=eos, pad_token_id=pad)


def test_the_tokenizers_eos_comes_first_then_the_generation_configs_without_repeats():
    assert special_token_ids(tokenizer(2, 0), [5, 2, 7]) == (0, (2, 5, 7))
    assert special_token_ids(tokenizer(2, 0), 9) == (0, (2, 9))
    assert special_token_ids(tokenizer(2, 0), None) == (0, (2,))


def test_without_a_pad_token_the_first_eos_pads():
    assert special_token_ids(tokenizer(None, None), [4, 3]) == (4, (4, 3))


def test_given_ids_replace_the_tokenizers():
    assert special_token_ids(tokenizer(2, None), [5], eos=[8, 8, 6], pad=1) == (1, (8, 6))


def test_no_eos_at_all_is_refused():
    with pytest.raises(ValueError, match="no EOS token id"):
        special_token_ids(tokenizer(None, 0), [])

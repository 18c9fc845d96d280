"""A reward model in the loop: real runs (Ray, FSDP2, the built-in policy) whose reward comes from the
``reward_model`` worker group, alone (veRL's rule for an enabled RM) and declared beside the verifier.

The validation generations written to ``val_generations.jsonl`` are rescored here with transformers' own
sequence classifier on the text's tokens: the trainer's rewards must be those numbers.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from support import local_reward_model, read_metrics, small_config
from transformers import AutoModelForSequenceClassification

from hybridflow.rewards.arithmetic import compute_score
from hybridflow.rewards.sources import normalize
from hybridflow.trainer.main import build_and_fit
from hybridflow.workers.models import build_char_tokenizer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def rm_path(tmp_path_factory):
    return local_reward_model(tmp_path_factory.mktemp("rm") / "rm", build_char_tokenizer(), seed=3)


def by_hand(path: str, prompt_text: str, response: str) -> float:
    """The classifier's score of the rendered prompt + the response as generated, as a finished turn: its special
    tokens dropped, one EOS at the end."""
    tok = build_char_tokenizer()
    response = re.sub(r"<[^<>]*>", "", response) + tok.eos_token
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    ids = tok(prompt_text + response, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        return float(model(input_ids=torch.tensor([ids])).logits[0, 0])


def test_the_reward_model_alone_is_the_reward(ray_session, tmp_path, rm_path):
    config = small_config(
        tmp_path,
        **{
            "reward_model.enable": True,
            "reward_model.model.path": rm_path,
            "reward_model.micro_batch_size_per_gpu": 5,
            "trainer.total_training_steps": 2,
            "trainer.test_freq": 2,
            "trainer.log_val_generations": 4,
            "trainer.logger": ["jsonl"],
            "trainer.n_gpus_per_node": 2,
        },
    )
    run = tmp_path / "run"
    build_and_fit(config, run)
    steps = [m for m in read_metrics(run) if "score/mean" in m]
    assert len(steps) == 2
    for m in steps:
        assert m["score/mean"] == pytest.approx(m["reward/reward_model/mean"], abs=1e-5)  # the RM's raw score, alone
        assert "reward/verifier/mean" not in m and "reward/errors" not in m  # no verifier ran for the reward
        assert m["timing_s/rm"] > 0 and m["memory/rm/peak_gb"] > 0  # a stage of its own
    rows = [json.loads(line) for line in (run / "val_generations.jsonl").read_text().splitlines()]
    assert len(rows) == 8  # before training and at step 2
    for row in rows:
        assert row["score"] == pytest.approx(by_hand(rm_path, row["prompt"], row["response"]), abs=1e-5)
    last = read_metrics(run)[-1]
    assert "val/accuracy" in last  # the verifier still measures the task in validation
    assert last["val/reward_model/score"] == pytest.approx(last["val/score"], abs=1e-6)


def test_declared_sources_sum_the_verifier_and_the_normalized_reward_model(ray_session, tmp_path, rm_path):
    config = small_config(
        tmp_path,
        **{
            "reward_model.enable": True,
            "reward_model.model.path": rm_path,
            "reward.sources": {"verifier": {"weight": 1.0}, "reward_model": {"weight": 0.5, "normalize": "sigmoid"}},
            "trainer.total_training_steps": 1,
            "trainer.test_freq": 1,
            "trainer.log_val_generations": 4,
            "trainer.logger": ["jsonl"],
        },
    )
    run = tmp_path / "run"
    build_and_fit(config, run)
    step = read_metrics(run)[-1]
    assert step["reward/verifier/mean"] >= 0.0 and "reward/errors" in step  # the verifier scored for the reward
    rows = [json.loads(line) for line in (run / "val_generations.jsonl").read_text().splitlines()]
    for row in rows:
        text = re.sub(r"<[^<>]*>", "", row["response"])  # what the verifier reads: special tokens dropped
        verifier = compute_score("synthetic/arithmetic", text, row["ground_truth"])
        rm = by_hand(rm_path, row["prompt"], row["response"])
        expected = verifier + 0.5 * float(normalize(torch.tensor([rm]), "sigmoid"))
        assert row["score"] == pytest.approx(expected, abs=1e-5)

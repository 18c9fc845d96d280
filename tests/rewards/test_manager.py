"""The batch reward manager: timeouts, errors, placement, overlong penalty, threads and Ray actors."""

import threading
import time

import pytest
import torch

from hybridflow.core.data_proto import DataProto
from hybridflow.core.keys import DATA_SOURCE, EXTRA_INFO, GROUND_TRUTH, RESPONSE_MASK, RESPONSES
from hybridflow.plugins import UnknownNameError
from hybridflow.rewards.manager import RewardManager, overlong_penalty
from hybridflow.rewards.routing import UnroutedDataSourceError

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 2.0

# A user's reward file with a verifier that hangs, one that raises and one that
# kills its own process, mixed with an exact-match verifier.
HOSTILE_REWARD = """
import os, time

def compute_score(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "hang":
        time.sleep(10**6)
    if solution_str == "boom":
        raise RuntimeError("verifier exploded")
    if solution_str == "die":
        os._exit(3)
    return {"score": float(solution_str == ground_truth), "length": float(len(solution_str))}
"""


def char_tokenizer():
    """A character-level tokenizer built in code: ids 0 pad, 1 eos, 2 unk, then printable ASCII and newline."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(i) for i in range(32, 127)] + ["\n"]
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(".|\n"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def make_batch(tokenizer, responses, data_sources, ground_truths, width=None, eos=True):
    """Right-padded responses (an eos token after each, masked in) as a DataProto."""
    ids = [tokenizer.encode(r, add_special_tokens=False) + ([tokenizer.eos_token_id] if eos else []) for r in responses]
    width = width or max(len(i) for i in ids)
    tensor = torch.zeros(len(ids), width, dtype=torch.long)
    mask = torch.zeros(len(ids), width, dtype=torch.long)
    for row, seq in enumerate(ids):
        seq = seq[:width]
        tensor[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
    return DataProto.from_dict(
        {RESPONSES: tensor, RESPONSE_MASK: mask},
        {DATA_SOURCE: data_sources, GROUND_TRUTH: ground_truths, EXTRA_INFO: [{"index": i} for i in range(len(ids))]},
    )


@pytest.fixture(scope="module")
def tokenizer():
    return char_tokenizer()


@pytest.fixture(scope="module")
def hostile_manager(tmp_path_factory):
    path = tmp_path_factory.mktemp("reward") / "hostile_reward.py"
    path.write_text(HOSTILE_REWARD)
    manager = RewardManager(
        num_workers=2,
        timeout_s=TIMEOUT_S,
        timeout_score=-1.0,
        custom_reward_function={"path": str(path)},
        worker_preload=(),
    )
    manager.score_texts(["warm"] * 2, ["a", "b"], ["a", "a"])  # start the workers outside the timed part
    yield manager
    manager.close()


def test_hang_and_raise_in_a_batch_of_good_ones(hostile_manager, tokenizer, caplog):
    responses = ["12", "hang", "7", "x", "boom", "3", "die", "5", "5"]
    truths = ["12", "0", "7", "y", "0", "4", "0", "5", "6"]
    expected = [1.0, -1.0, 1.0, 0.0, -1.0, 0.0, -1.0, 1.0, 0.0]
    batch = make_batch(tokenizer, responses, ["custom/data"] * len(responses), truths)
    start = time.monotonic()
    out = hostile_manager.score_batch(batch, tokenizer)
    scores, metrics = out.token_level_scores, out.metrics
    elapsed = time.monotonic() - start
    # one hang costs one timeout on one worker; the others keep scoring meanwhile. The
    # margin covers starting two replacement workers (the hang's and the dead one's).
    assert elapsed < TIMEOUT_S + 10.0
    assert scores.sum(dim=-1).tolist() == expected
    assert metrics["reward/timeouts"] == 1.0
    assert metrics["reward/errors"] == 2.0  # the raise and the dead worker
    # the hang, the raise and the dead worker are failures (reward.on_failure), not the wrong answers "x", "3", "5"
    assert out.failed == (False, True, False, False, True, False, True, False, False)
    assert metrics["reward/score/mean"] == pytest.approx(sum(expected) / len(expected))
    good = [len(r) for r in responses if r not in ("hang", "boom", "die")]
    assert metrics["reward/length/mean"] == pytest.approx(sum(good) / len(good))
    assert "reward sample 1" in caplog.text and "timed out" in caplog.text and "'hang'" in caplog.text
    assert "RuntimeError: verifier exploded" in caplog.text
    # the pool recovered: the next batch scores normally
    again, metrics = hostile_manager(make_batch(tokenizer, ["9"], ["custom/data"], ["9"]), tokenizer)
    assert again.sum().item() == 1.0 and metrics["reward/timeouts"] == 0.0


def test_score_sits_at_the_last_valid_token(hostile_manager, tokenizer):
    batch = make_batch(tokenizer, ["abc", "a", ""], ["d"] * 3, ["abc", "a", "zz"], width=6, eos=False)
    batch.batch[RESPONSE_MASK][0] = torch.tensor([1, 1, 0, 1, 0, 0])  # a hole: the last valid token is 3
    batch.batch[RESPONSES][0, 3] = tokenizer.convert_tokens_to_ids("c")  # decodes to "abc"
    batch.batch[RESPONSES][0, 2] = tokenizer.convert_tokens_to_ids("x")  # masked out: not decoded
    scores, _ = hostile_manager(batch, tokenizer)
    expected = torch.zeros(3, 6)
    expected[0, 3] = 1.0  # "abc" == "abc"
    expected[1, 0] = 1.0  # "a" == "a", one token
    expected[2, 0] = 0.0  # empty response: column 0, score 0
    assert torch.equal(scores, expected)


def test_overlong_penalty_formula():
    # max 20, buffer 8: free up to 12 tokens, then -factor * (L - 12) / 8
    assert overlong_penalty(12, 20, 8, 1.0) == 0.0
    assert overlong_penalty(16, 20, 8, 1.0) == -0.5
    assert overlong_penalty(20, 20, 8, 0.5) == -0.5
    assert overlong_penalty(5, 20, 8, 1.0) == 0.0


def test_overlong_penalty_in_the_manager(tmp_path, tokenizer):
    path = tmp_path / "r.py"
    path.write_text(HOSTILE_REWARD)
    responses = ["a" * 4, "a" * 9, "a" * 11]  # +1 eos token each: lengths 5, 10, 12
    with RewardManager(
        num_workers=1, timeout_s=30, custom_reward_function={"path": str(path)}, worker_preload=(),
        overlong_buffer={"enable": True, "len": 4, "penalty_factor": 2.0}, max_response_length=12,
    ) as manager:  # fmt: skip
        scores, metrics = manager(make_batch(tokenizer, responses, ["d"] * 3, responses, width=12), tokenizer)
    # free up to 8 tokens: penalties 0, -2 * 2/4 = -1, -2 * 4/4 = -2; all answers correct (1.0)
    assert scores.sum(dim=-1).tolist() == [1.0, 0.0, -1.0]
    assert metrics["reward/overlong_penalty/mean"] == pytest.approx(-1.0)
    assert metrics["reward/overlong/frac"] == pytest.approx(2 / 3)


def test_configuration_errors_raise():
    with pytest.raises(UnknownNameError, match="no_such_verifier"):
        RewardManager(route={"x": "no_such_verifier"}, num_workers=1)
    with RewardManager(route={"x": "gsm8k"}, num_workers=1, worker_preload=()) as manager:
        with pytest.raises(UnroutedDataSourceError, match="nowhere"):
            manager.score_texts(["nowhere"], ["1"], ["1"])


def test_builtin_verifiers_through_the_pool():
    with RewardManager(num_workers=2, timeout_s=20, route={"mixed": {"format": 0.5, "gsm8k": 0.5}}) as manager:
        scores, extras, outcomes = manager.score_texts(
            ["openai/gsm8k", "lighteval/MATH", "lighteval/MATH", "mixed", "mixed"],
            ["#### 72", r"\boxed{\frac{1}{2}}", r"\boxed{3}", "<think>r</think> #### 4", "#### 4"],
            ["72", "0.5", "4", "4", "4"],
        )
    assert scores == [1.0, 1.0, 0.0, 1.0, 0.5]
    assert [o.status for o in outcomes] == ["ok"] * 5
    assert extras[1] == {"too_complex": 0.0} and extras[4]["format/score"] == 0.0


def test_a_missing_ground_truth_scores_the_failure_score_and_is_counted():
    """``None`` must not become the text "None": ``\\boxed{None}`` would then be right."""
    with RewardManager(num_workers=1, timeout_s=20) as manager:
        scores, _, outcomes = manager.score_texts(
            ["lighteval/MATH", "lighteval/MATH"], [r"\boxed{None}", r"\boxed{2}"], [None, "2"]
        )
    assert scores == [0.0, 1.0]
    assert outcomes[0].status == "error" and "ground truth must be text or a number" in outcomes[0].error


def _expected_and_inputs():
    sources = ["lighteval/MATH", "openai/gsm8k", "lighteval/MATH", "openai/gsm8k"]
    responses = [r"\boxed{\sqrt{8}}", "#### 1,000", r"\boxed{0.3}", "#### 5"]
    truths = [r"2\sqrt{2}", "1000", r"\frac{1}{3}", "4"]
    return sources, responses, truths, [1.0, 1.0, 0.0, 0.0]


def test_math_verify_directly_in_a_thread():
    from hybridflow.rewards.math_answer import math_answer_score

    results = []
    thread = threading.Thread(
        target=lambda: results.append(math_answer_score("m", r"\boxed{0.5}", r"\frac{1}{2}", None))
    )
    thread.start()
    thread.join(60)
    assert results == [{"score": 1.0, "too_complex": 0.0}]


def test_manager_from_a_thread():
    sources, responses, truths, expected = _expected_and_inputs()
    results = []

    def work():
        with RewardManager(num_workers=1, timeout_s=20) as manager:
            results.append(manager.score_texts(sources, responses, truths)[0])

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(100)
    assert results == [expected]


class _Scorer:
    def __init__(self):
        self.manager = RewardManager(num_workers=1, timeout_s=20)

    def score(self, sources, responses, truths):
        return self.manager.score_texts(sources, responses, truths)[0]

    def close(self):
        self.manager.close()


class _AsyncScorer(_Scorer):
    async def score(self, sources, responses, truths):  # an async actor runs methods on an event loop thread
        return self.manager.score_texts(sources, responses, truths)[0]


@pytest.mark.parametrize("actor_class", [_Scorer, _AsyncScorer], ids=["sync", "async"])
def test_manager_inside_a_ray_actor(ray_session, actor_class):
    sources, responses, truths, expected = _expected_and_inputs()
    actor = ray_session.remote(num_cpus=0.25)(actor_class).remote()
    try:
        assert ray_session.get(actor.score.remote(sources, responses, truths), timeout=100) == expected
        ray_session.get(actor.close.remote(), timeout=30)
    finally:
        ray_session.kill(actor)

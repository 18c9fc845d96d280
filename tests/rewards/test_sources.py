"""Reward sources by declaration (rewards/sources.py): weights, normalization and fallback against numbers worked
out by hand, the defaults, abstaining verifiers in the real manager, and the config rules."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from omegaconf import OmegaConf

from hybridflow.configs.schema import PPOConfig, RewardConfig, RewardSourceConfig
from hybridflow.core import DataProto
from hybridflow.core.keys import DATA_SOURCE, EXTRA_INFO, GROUND_TRUTH, RESPONSE_MASK, RESPONSES
from hybridflow.rewards.manager import RewardManager, RewardOutput
from hybridflow.rewards.sources import REWARD_MODEL, VERIFIER, RewardSources, Source, normalize
from hybridflow.trainer.config_checks import config_problems

V = torch.tensor([1.0, 0.0, 1.0, 0.0])
RM = torch.tensor([2.0, -1.0, 0.5, 0.5])


def test_normalizations_by_hand():
    # RM: mean 0.5, population variance ((1.5)^2 + (1.5)^2 + 0 + 0) / 4 = 1.125
    std = math.sqrt(1.125)
    expected = [(2.0 - 0.5) / (std + 1e-6), (-1.0 - 0.5) / (std + 1e-6), 0.0, 0.0]
    torch.testing.assert_close(normalize(RM, "batch"), torch.tensor(expected), atol=1e-6, rtol=0)
    torch.testing.assert_close(normalize(RM, "sigmoid"), torch.tensor([1 / (1 + math.exp(-x)) for x in RM.tolist()]))
    torch.testing.assert_close(normalize(RM, "none"), RM)


def test_batch_normalization_leaves_the_failed_samples_out_of_its_statistics_under_exclude():
    # V with its last sample failed: the statistics of 1, 0, 1 (mean 2/3, population std sqrt(2/9)), applied to all
    std = math.sqrt(2 / 9) + 1e-6
    expected = torch.tensor([(1 - 2 / 3) / std, (0 - 2 / 3) / std, (1 - 2 / 3) / std, (0 - 2 / 3) / std])
    failed = torch.tensor([False, False, False, True])
    torch.testing.assert_close(normalize(V, "batch", ~failed), expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(normalize(V, "batch", torch.zeros(4, dtype=torch.bool)), normalize(V, "batch"))
    # through combine: the failure comes from the verifiers' output; under on_failure=score it counts (0.5, 0.5)
    mask = torch.ones(4, 2, dtype=torch.long)
    verified = RewardOutput(V, mask, {}, [{} for _ in range(4)], [True] * 4, (), tuple(failed.tolist()))
    for exclude, want in ((True, expected), (False, (V - 0.5) / (0.5 + 1e-6))):
        sources = RewardSources((Source(VERIFIER, 1.0, "batch"),), exclude_failed=exclude)
        torch.testing.assert_close(sources.combine(verified, None, mask).scores, want, atol=1e-6, rtol=0)


def test_weighted_sum_of_normalized_sources():
    sources = RewardSources((Source(VERIFIER, 1.0), Source(REWARD_MODEL, 0.5, "sigmoid")), "sum")
    scores, metrics = sources.scores(V, None, RM)
    sig = [1 / (1 + math.exp(-x)) for x in RM.tolist()]
    torch.testing.assert_close(scores, torch.tensor([1 + 0.5 * sig[0], 0.5 * sig[1], 1 + 0.5 * sig[2], 0.5 * sig[3]]))
    assert metrics["reward/verifier/mean"] == pytest.approx(0.5)
    assert metrics["reward/reward_model/mean"] == pytest.approx(0.5)  # raw: (2 - 1 + 0.5 + 0.5) / 4
    assert metrics["reward/verifier/abstained"] == 0.0


def test_fallback_takes_the_verifier_where_it_decides_else_the_reward_model():
    sources = RewardSources((Source(VERIFIER, 2.0), Source(REWARD_MODEL, 3.0)), "fallback")
    decided = torch.tensor([True, False, False, True])
    scores, metrics = sources.scores(V, decided, RM)
    torch.testing.assert_close(scores, torch.tensor([2.0, -3.0, 1.5, 0.0]))
    assert metrics["reward/fallback/frac"] == pytest.approx(0.5)
    assert metrics["reward/verifier/abstained"] == 2.0


def test_undeclared_sources_are_the_verifier_or_else_the_reward_model_alone():
    assert RewardSources.from_config(RewardConfig(), False).sources == (Source(VERIFIER),)
    only_rm = RewardSources.from_config(RewardConfig(), True)
    assert only_rm.sources == (Source(REWARD_MODEL),)
    scores, _ = only_rm.scores(None, None, RM)
    torch.testing.assert_close(scores, RM)
    declared = RewardConfig(
        sources={"reward_model": RewardSourceConfig(0.5, "batch"), "verifier": RewardSourceConfig()}, combine="fallback"
    )
    assert RewardSources.from_config(declared, True).sources == (Source(VERIFIER), Source(REWARD_MODEL, 0.5, "batch"))


def test_combine_puts_the_score_at_the_last_response_token_and_keeps_the_fields():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1]])
    fields = [{"score": s, "acc": s} for s in V.tolist()]
    failed = (False, True, False, False)  # a verifier's failure stays one with the reward model's score added
    verified = RewardOutput(V, mask, {"reward/errors": 0.0}, fields, [True] * 4, (), failed)
    sources = RewardSources((Source(VERIFIER, 1.0), Source(REWARD_MODEL, 1.0)), "sum")
    out = sources.combine(verified, RM, mask)
    total = (V + RM).tolist()
    expected = torch.zeros(4, 3)
    expected[0, 1], expected[1, 0], expected[2, 0], expected[3, 2] = total
    torch.testing.assert_close(out.token_level_scores, expected)
    assert [f["score"] for f in out.fields] == pytest.approx(total)
    assert [f["reward_model"] for f in out.fields] == pytest.approx(RM.tolist())
    assert [f["acc"] for f in out.fields] == V.tolist() and "reward/errors" in out.metrics
    assert verified.fields[0]["score"] == 1.0  # the verifiers' own output is left as it was
    assert out.failed == failed


def fresh(text: str) -> str:
    """``text`` as a string built at run time: equal to the literal, not the same object (``is`` tells them apart)."""
    return "".join(list(text))


@pytest.mark.parametrize("how", ["", "aaa", "bogus", "sigmoidal", "zzz", "Batch"])
def test_an_unknown_normalization_is_refused_whatever_its_spelling_sorts_beside(how):
    with pytest.raises(ValueError, match="unknown reward normalization"):
        normalize(RM, how)


def test_settings_read_from_a_config_are_compared_by_value():
    # a value from a file or the command line is a new string object, equal to the literal but not identical
    torch.testing.assert_close(normalize(RM, fresh("sigmoid")), torch.sigmoid(RM))
    torch.testing.assert_close(normalize(RM, fresh("none")), RM)
    torch.testing.assert_close(normalize(RM, fresh("batch")), normalize(RM, "batch"))
    fallback = RewardSources((Source(VERIFIER, 2.0), Source(REWARD_MODEL, 3.0)), fresh("fallback"))
    scores, _ = fallback.scores(V, torch.tensor([True, False, False, True]), RM)
    torch.testing.assert_close(scores, torch.tensor([2.0, -3.0, 1.5, 0.0]))
    only_rm = RewardSources((Source(REWARD_MODEL),))
    assert only_rm.uses(fresh(REWARD_MODEL)) and not only_rm.uses(VERIFIER) and not only_rm.uses("zzz")
    only_verifier = RewardSources((Source(VERIFIER),))
    assert only_verifier.uses(fresh(VERIFIER)) and not only_verifier.uses(REWARD_MODEL)


def test_combine_without_verifiers_decides_every_row_and_keeps_the_verifiers_abstentions_otherwise():
    mask = torch.ones(4, 2, dtype=torch.long)
    out = RewardSources((Source(REWARD_MODEL),)).combine(None, RM, mask)
    assert out.decided == [True] * 4
    torch.testing.assert_close(out.scores, RM)
    assert [f["score"] for f in out.fields] == pytest.approx(RM.tolist())
    decided = [True, False, True, False]
    verified = RewardOutput(V, mask, {}, [{"score": s} for s in V.tolist()], decided)
    out = RewardSources((Source(VERIFIER), Source(REWARD_MODEL)), "fallback").combine(verified, RM, mask)
    assert out.decided == decided
    torch.testing.assert_close(out.scores, torch.tensor([1.0, -1.0, 1.0, 0.5]))


ABSTAINER = """
def compute_score(data_source, solution_str, ground_truth, extra_info):
    # cannot decide responses that start with x
    return None if solution_str.startswith("x") else float(solution_str == ground_truth)
"""


def test_the_manager_counts_verifiers_that_abstain_and_unrouted_sources_when_allowed(tmp_path):
    path = tmp_path / "abstainer.py"
    path.write_text(ABSTAINER)
    custom = {"path": str(path), "name": "compute_score"}
    with RewardManager(
        route={"a": "custom"}, num_workers=1, custom_reward_function=custom, abstain_unrouted=True
    ) as manager:
        scores, _, outcomes = manager.score_texts(
            ["a", "a", "a", "elsewhere"], ["1", "x1", "2", "1"], ["1", "1", "1", "1"]
        )
    assert scores == [1.0, 0.0, 0.0, 0.0]
    assert [o.status for o in outcomes] == ["ok", "abstained", "ok", "abstained"]
    with RewardManager(route={"a": "custom"}, num_workers=1, custom_reward_function=custom) as manager:
        with pytest.raises(KeyError, match="elsewhere"):
            manager.score_texts(["elsewhere"], ["1"], ["1"])


def test_score_batch_reports_which_samples_were_decided():
    tok_ids = torch.tensor([[5, 6], [7, 0]])
    batch = DataProto.from_dict(
        {RESPONSES: tok_ids, RESPONSE_MASK: torch.tensor([[1, 1], [1, 0]])},
        {DATA_SOURCE: ["synthetic/arithmetic", "chat"], GROUND_TRUTH: ["7", None], EXTRA_INFO: [{}, {}]},
    )

    class Chars:
        def decode(self, ids, skip_special_tokens=True):
            return "".join(str(i) for i in ids)

    with RewardManager(num_workers=1, abstain_unrouted=True) as manager:
        out = manager.score_batch(batch, Chars())
    assert out.decided == [True, False]
    assert out.metrics["reward/abstained"] == 1.0


def problems(**overrides) -> list[str]:
    cfg = OmegaConf.structured(PPOConfig)
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return config_problems(OmegaConf.to_object(cfg))


def test_config_rules_name_the_keys(tmp_path):
    assert any("reward.sources has 'judge'" in p for p in problems(**{"reward.sources": {"judge": {"weight": 1.0}}}))
    assert any("reward_model.enable=false" in p for p in problems(**{"reward.sources": {"reward_model": {}}}))
    assert any(
        "combine=fallback needs both sources" in p
        for p in problems(**{"reward.combine": "fallback", "reward.sources": {"verifier": {}}})
    )
    assert any(
        "sources.verifier.normalize='zscore'" in p
        for p in problems(**{"reward.sources": {"verifier": {"normalize": "zscore"}}})
    )
    assert any("reward_model.model.path is not set" in p for p in problems(**{"reward_model.enable": True}))
    missing = str(tmp_path / "nowhere")
    assert any(
        "is not a directory" in p for p in problems(**{"reward_model.enable": True, "reward_model.model.path": missing})
    )
    assert any(
        "does not use it" in p
        for p in problems(
            **{
                "reward_model.enable": True,
                "reward_model.model.path": str(tmp_path),
                "reward.sources": {"verifier": {}},
            }
        )
    )
    assert not [
        p for p in problems(**{"reward_model.enable": True, "reward_model.model.path": str(tmp_path)}) if "reward" in p
    ]


def test_fallback_reports_the_share_of_rows_the_reward_model_scored():
    sources = RewardSources((Source(VERIFIER), Source(REWARD_MODEL)), "fallback")
    _, metrics = sources.scores(V, torch.tensor([True, False, True, True]), RM)
    assert metrics["reward/fallback/frac"] == pytest.approx(0.25)  # one row of four undecided


def test_sources_cannot_be_changed_once_built():
    for record in (Source(VERIFIER), RewardSources((Source(VERIFIER),))):
        with pytest.raises(dataclasses.FrozenInstanceError):
            record.__setattr__("mode" if isinstance(record, RewardSources) else "weight", 2.0)

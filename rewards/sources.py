"""One score per response from the declared reward sources: the verifiers and the reward model.

``reward.sources`` names the sources with a weight and a normalization each;
``reward.combine`` says how they make one score. For response ``i``, with
``v_i`` the verifiers' score, ``r_i`` the reward model's and ``N`` a source's
normalization::

    sum:       s_i = w_v * N_v(v)_i + w_rm * N_rm(r)_i       (a source that is not declared adds nothing)
    fallback:  s_i = w_v * N_v(v)_i      if the verifier decided row i
                     w_rm * N_rm(r)_i    otherwise

    N = none:     s
        batch:    (s - mean(s)) / (std(s) + 1e-6)   over the batch's responses, std without Bessel's correction
                                                    under ``reward.on_failure=exclude``: over the samples
                                                    whose verifier did not fail (those that can be trained on)
        sigmoid:  1 / (1 + exp(-s))

A verifier *decides* a row unless it abstained: it returned None, or (when a
reward model is a source) no route covers the row's data_source. An
abstaining row's verifier score is 0 before normalization, so ``sum`` adds
nothing for it beyond what ``batch`` normalization makes of a 0. The
verifier's own failure policy stands: a sample that timed out or raised
scores ``reward.timeout_score``, decided, is counted as before, and stays failed
(``RewardOutput.failed``: training leaves it out under ``reward.on_failure=exclude``).

Undeclared sources (the default, ``reward.sources: {}``): the verifier alone,
or, with ``reward_model.enable``, the reward model alone, as veRL does (its
``rm_scores`` replace the rule-based reward).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from hybridflow.rewards.manager import RewardOutput

__all__ = ["REWARD_MODEL", "VERIFIER", "RewardSources", "Source", "normalize"]

VERIFIER = "verifier"
REWARD_MODEL = "reward_model"
_EPS = 1e-6


@dataclass(frozen=True)
class Source:
    """One declared source: its name, weight and normalization."""

    name: str
    weight: float = 1.0
    normalize: str = "none"


def normalize(scores: torch.Tensor, how: str, counted: torch.Tensor | None = None) -> torch.Tensor:
    """``scores`` (B,) normalized as the module docstring's ``N``; ``counted`` (B,) bool: the rows whose scores make
    the batch's statistics (None, or no row: every row)."""
    scores = scores.to(torch.float32)
    if how == "none":
        return scores
    if how == "batch":
        sample = scores[counted] if counted is not None and bool(counted.any()) else scores
        return (scores - sample.mean()) / (sample.std(correction=0) + _EPS)
    if how == "sigmoid":
        return torch.sigmoid(scores)
    raise ValueError(f"unknown reward normalization {how!r}; allowed: none, batch, sigmoid")


@dataclass(frozen=True)
class RewardSources:
    """The run's reward sources and how they combine (module docstring)."""

    sources: tuple[Source, ...]
    mode: str = "sum"
    """``reward.combine``: ``sum`` or ``fallback``."""
    exclude_failed: bool = True
    """``reward.on_failure=exclude``: a sample whose verifier failed is left out of the batch statistics."""

    @classmethod
    def from_config(cls, reward: Any, reward_model_enabled: bool) -> RewardSources:
        """From ``reward.sources`` / ``reward.combine``; undeclared: the verifier, or the reward model when enabled."""
        declared: Mapping[str, Any] = reward.sources
        exclude = reward.on_failure == "exclude"
        if not declared:
            return cls((Source(REWARD_MODEL if reward_model_enabled else VERIFIER),), exclude_failed=exclude)
        order = [name for name in (VERIFIER, REWARD_MODEL) if name in declared]  # the verifier first: fallback's order
        sources = tuple(Source(n, float(declared[n].weight), declared[n].normalize) for n in order)
        return cls(sources, reward.combine, exclude)

    def uses(self, name: str) -> bool:
        """Whether ``name`` is a source of the reward."""
        return any(s.name == name for s in self.sources)

    def scores(
        self,
        verifier: torch.Tensor | None,
        decided: torch.Tensor | None,
        reward_model: torch.Tensor | None,
        failed: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``(scores (B,), metrics)``: the combined score of each response and ``reward/<source>/mean`` (raw),
        ``reward/verifier/abstained`` and, under ``fallback``, ``reward/fallback/frac``.

        :param verifier: (B,) the verifiers' scores (0 where they abstained), when the verifier is a source.
        :param decided: (B,) bool, where the verifier decided (None: everywhere).
        :param reward_model: (B,) the reward model's scores, when it is a source.
        :param failed: (B,) bool, the samples whose verifier failed (None: none); left out of ``batch``
            normalization's statistics unless ``exclude_failed`` is off.
        """
        raw = {VERIFIER: verifier, REWARD_MODEL: reward_model}
        missing = [s.name for s in self.sources if raw[s.name] is None]
        if missing:
            raise ValueError(f"reward sources {missing} are declared but were not scored")
        counted = ~failed.bool() if failed is not None and self.exclude_failed else None
        parts = {s.name: s.weight * normalize(raw[s.name], s.normalize, counted) for s in self.sources}
        metrics = {f"reward/{name}/mean": raw[name].float().mean().item() for name in parts}
        if verifier is not None:
            decided = torch.ones(len(verifier), dtype=torch.bool) if decided is None else decided.bool()
            metrics["reward/verifier/abstained"] = float((~decided).sum())
        if self.mode == "fallback":
            metrics["reward/fallback/frac"] = (~decided).float().mean().item()
            return torch.where(decided, parts[VERIFIER], parts[REWARD_MODEL]), metrics
        return torch.stack(list(parts.values())).sum(0), metrics

    def combine(
        self, verified: RewardOutput | None, rm_scores: torch.Tensor | None, response_mask: torch.Tensor
    ) -> RewardOutput:
        """The reward as a :class:`RewardOutput`: the combined score of each row (put on its last valid token by
        :attr:`RewardOutput.token_level_scores`), the verifiers' metrics with the sources', and each sample's
        fields (the verifiers', ``score`` the combined one, ``reward_model`` the model's raw score)."""
        verifier = decided = failed = None
        if verified is not None:
            verifier = verified.scores
            decided = torch.tensor(verified.decided, dtype=torch.bool)
            failed = torch.tensor(verified.failed, dtype=torch.bool) if verified.failed else None
        scores, metrics = self.scores(
            verifier if self.uses(VERIFIER) else None, decided, rm_scores if self.uses(REWARD_MODEL) else None, failed
        )
        fields = [dict(f) for f in verified.fields] if verified is not None else [{} for _ in range(len(scores))]
        for i, field in enumerate(fields):
            field["score"] = float(scores[i])
            if rm_scores is not None:
                field[REWARD_MODEL] = float(rm_scores[i])
        all_metrics = {**(verified.metrics if verified is not None else {}), **metrics}
        decided_list = verified.decided if verified is not None else [True] * len(scores)
        failed = verified.failed if verified is not None else ()
        return RewardOutput(scores.to(torch.float32), response_mask, all_metrics, fields, decided_list, (), failed)

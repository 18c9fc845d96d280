"""The batch reward manager: a DataProto in, token-level scores and metrics out.

::

    manager = RewardManager(route={"my_data": "math"}, num_workers=2, timeout_s=10)
    token_level_scores, metrics = manager(batch, tokenizer)   # (B, T) float32, dict
    batch.batch[TOKEN_LEVEL_SCORES] = token_level_scores

For every row it decodes the valid response tokens (``response_mask``),
routes its ``data_source`` to verifiers (:mod:`~hybridflow.rewards.routing`)
and scores it in a :class:`~hybridflow.rewards.pool.ScoringPool`. The score
sits at the row's last valid response token (column 0 for an empty
response); every other entry is 0.

Failures never fail the batch: a sample that passes ``timeout_s`` (its
worker is killed) or whose verifier raises gets ``timeout_score``, is
counted in ``reward/timeouts`` or ``reward/errors`` and logged with its
index and the start of its response. Configuration mistakes do raise, before
anything is scored: an unknown verifier name (at construction) or a
data_source no route covers.

Verifier functions are resolved by name in the driver, through the plugin
manager, and sent to the pool's workers by reference (module and name), so
they must be module-level functions of installed modules; a one-off function
in a file goes through ``custom_reward_function``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import torch

from hybridflow.core.data_proto import DataProto
from hybridflow.core.keys import DATA_SOURCE, EXTRA_INFO, GROUND_TRUTH, RESPONSE_MASK, RESPONSES
from hybridflow.plugins import get_reward_verifier
from hybridflow.rewards.pool import Outcome, ScoringPool
from hybridflow.rewards.routing import Router, UnroutedDataSourceError
from hybridflow.rewards.scoring import ResolvedCall, score_sample

logger = logging.getLogger(__name__)

ABSTAINED = "abstained"
"""The outcome status of a sample the verifiers did not decide (see :class:`RewardOutput`'s ``decided``)."""
FAILED = ("timeout", "error")
"""The outcome statuses of a sample whose score could not be computed (see :class:`RewardOutput`'s ``failed``)."""


def overlong_penalty(length: int, max_length: int, buffer_len: int, penalty_factor: float) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13).

    0 up to ``max_length - buffer_len`` tokens, then falling linearly to
    ``-penalty_factor`` at ``max_length``: ``min(0, -(L - (Lmax - Lbuf)) / Lbuf * factor)``.
    """
    exceed = length - (max_length - buffer_len)
    return min(0.0, -exceed / buffer_len * penalty_factor)


def last_token_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) float32: each row's score at its last valid response token (column 0 for an empty one), 0 elsewhere.

    The index of the last 1 in the mask, not the count of ones: a multi-turn mask has holes."""
    mask = response_mask.bool()
    last = (torch.arange(mask.shape[1]) * mask).max(dim=-1).values
    out = torch.zeros(mask.shape, dtype=torch.float32)
    out[torch.arange(mask.shape[0]), last] = scores.to(torch.float32)
    return out


@dataclass(frozen=True)
class RewardOutput:
    """What :meth:`RewardManager.score_batch` and :meth:`~hybridflow.rewards.sources.RewardSources.combine`
    return: one score per response, placed on its tokens only when asked (:attr:`token_level_scores`)."""

    scores: torch.Tensor
    """(B,) float32: each response's score (after any overlong penalty)."""
    response_mask: torch.Tensor
    """(B, T): the responses' valid tokens, where :attr:`token_level_scores` puts each score."""
    metrics: dict[str, float]
    """``reward/*`` metrics of the batch."""
    fields: list[dict[str, Any]]
    """Per sample: ``score`` (after any overlong penalty) and the verifiers' extra fields (none for a failed sample)."""
    decided: list[bool]
    """Per sample: False where the verifiers abstained (returned None, or no route covers its data_source and
    the manager was built with ``abstain_unrouted``); such a sample scores 0."""
    errors: tuple[str, ...] = ()
    """The first line of the error of each sample whose verifier raised (none when every one returned)."""
    failed: tuple[bool, ...] = ()
    """Per sample: True where no score could be computed (the verifier timed out or raised; it scores
    ``timeout_score``); empty when no sample failed this way."""

    @cached_property
    def token_level_scores(self) -> torch.Tensor:
        """(B, T) float32: each row's score at its last valid response token, 0 elsewhere."""
        return last_token_scores(self.scores, self.response_mask)


class RewardManager:
    """Scores batches with the routed verifiers in a process pool.

    :param route: ``reward.route``: data_source (exact or glob) -> verifier
        name, or -> {verifier name: weight}; extends the defaults of
        :data:`~hybridflow.rewards.routing.DEFAULT_ROUTES`.
    :param num_workers: ``reward.num_workers``: worker processes of the pool.
    :param timeout_s: ``reward.timeout_s``: wall-clock seconds per sample.
    :param timeout_score: ``reward.timeout_score``: the score of a sample
        that timed out or whose verifier raised.
    :param custom_reward_function: ``reward.custom_reward_function``:
        ``{"path", "name", "kwargs"}`` of the user's function (verifier ``custom``).
    :param verifier_kwargs: ``reward.verifier_kwargs``: verifier name ->
        keyword arguments it is called with.
    :param overlong_buffer: ``reward.overlong_buffer``: ``{"enable", "len",
        "penalty_factor"}`` for :func:`overlong_penalty`; off by default.
    :param max_response_length: the response budget the overlong penalty
        counts from (``data.max_response_length``); default: the width of
        the batch's ``responses``.
    :param worker_memory_mb: ``reward.worker_memory_mb``: address-space limit
        of each pool worker (``None``: none), so a verifier's runaway
        allocation fails in its worker, not on the machine. Workers import
        torch (through the plugin package): a CUDA build alone maps about
        3.8 GB of address space at import (measured, torch 2.11+cu130), so
        keep this well above 4096 on GPU machines.
    :param abstain_unrouted: a data_source no route covers abstains (scores 0, not decided) instead of being
        an error: when a reward model scores what the verifiers cannot (``rewards/sources.py``).
    :param worker_preload: more modules every worker imports before it takes
        samples, besides each routed verifier's module and its declared
        ``RewardVerifier.preload``, so import time does not count against the
        first sample's timeout.
    """

    def __init__(
        self,
        route: Mapping[str, Any] | None = None,
        num_workers: int = 2,
        timeout_s: float = 10.0,
        timeout_score: float = 0.0,
        custom_reward_function: Mapping[str, Any] | None = None,
        verifier_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        overlong_buffer: Mapping[str, Any] | None = None,
        max_response_length: int | None = None,
        worker_memory_mb: int | None = 8192,
        worker_preload: Sequence[str] = (),
        abstain_unrouted: bool = False,
    ) -> None:
        self.router = Router(route, custom_reward_function, verifier_kwargs)
        self.abstain_unrouted = abstain_unrouted
        verifiers = [get_reward_verifier(name) for name in sorted(self.router.verifier_names())]
        self._functions = {entry.name: entry.fn for entry in verifiers}
        self.timeout_score = float(timeout_score)
        overlong = dict(overlong_buffer or {})
        self.overlong = overlong if overlong.get("enable") else None
        if self.overlong is not None and int(self.overlong.get("len", 0)) <= 0:
            raise ValueError(f"reward.overlong_buffer.len must be > 0 when enabled, got {self.overlong.get('len')}")
        self.max_response_length = max_response_length
        declared = [module for entry in verifiers for module in entry.preload]
        preload = list(dict.fromkeys([*worker_preload, *sorted({e.fn.__module__ for e in verifiers}), *declared]))
        self.pool = ScoringPool(num_workers, timeout_s, worker_memory_mb, preload)
        self._calls: dict[str, tuple[ResolvedCall, ...]] = {}

    def close(self) -> None:
        """Stop the pool's worker processes."""
        self.pool.close()

    def __enter__(self) -> RewardManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _calls_for(self, data_source: str) -> tuple[ResolvedCall, ...]:
        """The verifier calls of ``data_source``; () for one no route covers when unrouted sources abstain."""
        if data_source not in self._calls:
            try:
                routed = self.router.resolve(data_source)
            except UnroutedDataSourceError:
                if not self.abstain_unrouted:
                    raise
                routed = ()
            self._calls[data_source] = tuple(
                ResolvedCall(c.name, self._functions[c.name], c.weight, c.kwargs) for c in routed
            )
        return self._calls[data_source]

    def score_texts(
        self,
        data_sources: Sequence[str],
        responses: Sequence[str],
        ground_truths: Sequence[Any],
        extra_infos: Sequence[Any] | None = None,
    ) -> tuple[list[float], list[dict[str, Any]], list[Outcome]]:
        """Scores of decoded responses: ``(scores, extra fields per sample, outcomes)``.

        Failed samples get ``timeout_score`` and empty extras; ``outcomes``
        says what happened to each (status, seconds, error). A sample the
        verifiers abstain on scores 0 with status ``"abstained"``.
        """
        extra_infos = extra_infos if extra_infos is not None else [None] * len(responses)
        tasks = [
            (self._calls_for(str(ds)), str(ds), text, gt, extra)
            for ds, text, gt, extra in zip(data_sources, responses, ground_truths, extra_infos, strict=True)
        ]
        routed = [i for i, task in enumerate(tasks) if task[0]]  # an unrouted sample abstains unscored
        outcomes = [Outcome(ABSTAINED)] * len(tasks)
        for i, outcome in zip(routed, self.pool.run(score_sample, [tasks[i] for i in routed])):
            outcomes[i] = (
                Outcome(ABSTAINED, seconds=outcome.seconds)
                if outcome.status == "ok" and outcome.value is None
                else outcome
            )
        scores, extras = [], []
        for index, (outcome, task) in enumerate(zip(outcomes, tasks)):
            if outcome.status == ABSTAINED:
                scores.append(0.0)
                extras.append({})
                continue
            if outcome.status == "ok":
                fields = dict(outcome.value)
                scores.append(float(fields.pop("score")))
                extras.append(fields)
                continue
            scores.append(self.timeout_score)
            extras.append({})
            what = "timed out" if outcome.status == "timeout" else "failed"
            reason = _first_line(outcome.error)
            logger.warning(
                "reward sample %d (data_source %r) %s after %.2f s, scored %g: %s; response starts %r",
                index, task[1], what, outcome.seconds, self.timeout_score, reason, task[2][:200],
            )  # fmt: skip
        return scores, extras, outcomes

    def __call__(self, batch: DataProto, tokenizer: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """``(token_level_scores, metrics)`` of :meth:`score_batch`."""
        out = self.score_batch(batch, tokenizer)
        return out.token_level_scores, out.metrics

    def score_batch(self, batch: DataProto, tokenizer: Any) -> RewardOutput:
        """Scores, metrics and each sample's extra fields for a batch with ``responses`` and ``response_mask``.

        ``token_level_scores`` is (B, T) float32 like ``responses``; metrics
        are ``reward/score/{mean,max,min}``, ``reward/timeouts``,
        ``reward/errors``, ``reward/<field>/mean`` for each numeric extra
        field verifiers return, ``reward/sample_seconds/max``,
        ``reward/batch_seconds`` and, with the overlong buffer,
        ``reward/overlong_penalty/mean`` and ``reward/overlong/frac``.
        """
        start = time.monotonic()
        responses, mask = batch.batch[RESPONSES], batch.batch[RESPONSE_MASK].bool()
        lengths = mask.sum(dim=-1).tolist()
        texts = [tokenizer.decode(ids[m].tolist(), skip_special_tokens=True) for ids, m in zip(responses, mask)]
        extra = batch.non_tensor_batch.get(EXTRA_INFO)
        scores, extras, outcomes = self.score_texts(
            list(batch.non_tensor_batch[DATA_SOURCE]), texts, list(batch.non_tensor_batch[GROUND_TRUTH]),
            list(extra) if extra is not None else None,
        )  # fmt: skip
        metrics: dict[str, float] = {}
        if self.overlong is not None:
            max_len = self.max_response_length or responses.shape[1]
            penalties = [
                overlong_penalty(n, max_len, int(self.overlong["len"]), float(self.overlong.get("penalty_factor", 1.0)))
                for n in lengths
            ]
            scores = [s + p for s, p in zip(scores, penalties)]
            metrics["reward/overlong_penalty/mean"] = float(np.mean(penalties))
            metrics["reward/overlong/frac"] = float(np.mean([p < 0 for p in penalties]))
        metrics.update(_metrics(scores, extras, outcomes))
        metrics["reward/batch_seconds"] = time.monotonic() - start
        return RewardOutput(
            torch.tensor(scores, dtype=torch.float32),
            batch.batch[RESPONSE_MASK],
            metrics,
            [{"score": s, **e} for s, e in zip(scores, extras)],
            [o.status != ABSTAINED for o in outcomes],
            tuple(_first_line(o.error) for o in outcomes if o.status == "error"),
            tuple(o.status in FAILED for o in outcomes),
        )


def _first_line(error: str) -> str:
    return error.strip().splitlines()[0] if error.strip() else "?"


def _metrics(scores: list[float], extras: list[dict[str, Any]], outcomes: list[Outcome]) -> dict[str, float]:
    metrics = {
        "reward/score/mean": float(np.mean(scores)) if scores else 0.0,
        "reward/score/max": float(np.max(scores)) if scores else 0.0,
        "reward/score/min": float(np.min(scores)) if scores else 0.0,
        "reward/timeouts": float(sum(o.status == "timeout" for o in outcomes)),
        "reward/errors": float(sum(o.status == "error" for o in outcomes)),
        "reward/abstained": float(sum(o.status == ABSTAINED for o in outcomes)),
        "reward/sample_seconds/max": max((o.seconds for o in outcomes), default=0.0),
    }
    numeric: dict[str, list[float]] = {}
    for fields in extras:
        for key, value in fields.items():
            if isinstance(value, (bool, int, float, np.number)):
                numeric.setdefault(key, []).append(float(value))
    metrics.update({f"reward/{key}/mean": float(np.mean(values)) for key, values in numeric.items()})
    return metrics

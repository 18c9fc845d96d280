"""Per-step metrics computed on the driver from the logical batch, and stage timers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from hybridflow.core import DataProto
from hybridflow.core.keys import (
    ADVANTAGES,
    ATTENTION_MASK,
    RESPONSE_MASK,
    RETURNS,
    TOKEN_LEVEL_REWARDS,
    TOKEN_LEVEL_SCORES,
    VALUES,
)


def _masked_stats(name: str, values: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    valid = values[mask.bool()]
    if valid.numel() == 0:
        return {}
    return {f"{name}/mean": valid.mean().item(), f"{name}/max": valid.max().item(), f"{name}/min": valid.min().item()}


def compute_data_metrics(batch: DataProto) -> dict[str, float]:
    """Scores, rewards, advantages, returns, values and lengths of one training batch.

    ``score/accuracy`` is the share of responses whose verifier score is at
    least 1 (a fully verified answer). Response lengths count the tokens the
    policy sampled (``response_mask``); with an agent loop, the tool
    observations between its turns are in ``agent/observation_tokens/mean``.
    """
    mask = batch.batch[RESPONSE_MASK].float()
    scores = batch.batch[TOKEN_LEVEL_SCORES].sum(-1)
    response_length = mask.sum(-1)  # the policy's tokens: a multi-turn trajectory's observations are not counted
    max_length = mask.shape[1]
    prompt_length = batch.batch[ATTENTION_MASK][:, : batch.batch[ATTENTION_MASK].shape[1] - max_length].sum(-1)
    metrics = {
        "score/mean": scores.mean().item(),
        "score/accuracy": (scores >= 1.0).float().mean().item(),
        "response_length/mean": response_length.mean().item(),
        "response_length/max": response_length.max().item(),
        "response_length/clip_ratio": (response_length >= max_length).float().mean().item(),
        "prompt_length/mean": prompt_length.float().mean().item(),
    }
    if TOKEN_LEVEL_REWARDS in batch.batch:
        metrics["reward/mean"] = batch.batch[TOKEN_LEVEL_REWARDS].sum(-1).mean().item()
    for key in (ADVANTAGES, RETURNS, VALUES):
        if key in batch.batch:
            metrics.update(_masked_stats(key, batch.batch[key], mask))
    return metrics


class StageTimer:
    """Wall time of each named stage of one step: ``with timer("gen"): ...``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        """``timing_s/<stage>`` for every stage timed so far."""
        return {f"timing_s/{stage}": s for stage, s in self.seconds.items()}


def throughput_metrics(batch: DataProto, step_seconds: float, world_size: int) -> dict[str, float]:
    """Tokens (prompt + response) processed per second, in total and per rank; the step's wall time."""
    tokens = batch.batch[ATTENTION_MASK].sum().item()
    per_second = tokens / max(step_seconds, 1e-9)
    return {
        "timing_s/step": step_seconds,
        "perf/total_tokens": tokens,
        "perf/tokens_per_s": per_second,
        "perf/tokens_per_s_per_rank": per_second / world_size,
    }

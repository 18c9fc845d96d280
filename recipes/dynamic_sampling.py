"""Dynamic sampling (DAPO, Yu et al. 2025, arXiv:2503.14476, section 3.2): keep only informative groups.

A group whose n responses all score the same has zero group-relative
advantage: it costs a forward and backward pass and teaches nothing. After
scoring, this hook drops every such group::

    keep group g  iff  max_i s_{g,i} > min_i s_{g,i}        s = sum_t metric_{g,i,t}

``metric`` is ``score`` (the verifiers' scores, ``token_level_scores``) or
``reward`` (after any KL penalty, ``token_level_rewards``). The driver then
rolls out more prompts until the step has ``data.train_batch_size`` kept
prompts (at most ``algorithm.max_rollout_batches`` batches; see
:class:`hybridflow.plugins.BatchHook`), so every step trains on a full batch
of groups that carry signal. Metrics: ``kept_groups``, ``dropped_groups``.
"""

from __future__ import annotations

import numpy as np
import torch

from hybridflow.core import DataProto
from hybridflow.core.keys import TOKEN_LEVEL_REWARDS, TOKEN_LEVEL_SCORES, UID
from hybridflow.plugins import BatchHook, hookimpl

METRICS = {"score": TOKEN_LEVEL_SCORES, "reward": TOKEN_LEVEL_REWARDS}


def drop_uniform_groups(batch: DataProto, *, metric: str = "score") -> tuple[DataProto, dict[str, float]]:
    """The batch without the groups (rows sharing a uid) whose outcome ``metric`` is the same for every row."""
    if metric not in METRICS:
        raise ValueError(f"dynamic_sampling: metric {metric!r}; allowed: {', '.join(METRICS)}")
    outcome = batch.batch[METRICS[metric]].sum(-1)
    _, group = np.unique(np.asarray(batch.non_tensor_batch[UID], dtype=str), return_inverse=True)
    group = torch.from_numpy(group.reshape(-1).astype(np.int64))
    groups = int(group.max()) + 1 if len(group) else 0
    high = torch.full((groups,), -torch.inf, dtype=outcome.dtype).scatter_reduce(0, group, outcome, "amax")
    low = torch.full((groups,), torch.inf, dtype=outcome.dtype).scatter_reduce(0, group, outcome, "amin")
    informative = high > low
    kept = batch[informative[group]]
    return kept, {"kept_groups": float(informative.sum()), "dropped_groups": float((~informative).sum())}


@hookimpl
def hybridflow_register_batch_hooks(register):
    register(BatchHook(name="dynamic_sampling", fn=drop_uniform_groups, stage="after_reward"))

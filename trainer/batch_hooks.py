"""The batch hooks a run uses (``algorithm.batch_hooks``), resolved once and run at their stage.

Hooks are plugins (:class:`hybridflow.plugins.BatchHook`); this module looks
the configured names up, checks their options before anything starts, and
runs those of one stage in the configured order, checking what each may
change (see the ``BatchHook`` docstring).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hybridflow.core import DataProto
from hybridflow.core.keys import UID
from hybridflow.plugins import BatchHook, UnknownNameError, get_batch_hook
from hybridflow.plugins.options import option_problems


def hook_problems(names: list[str], options: dict[str, dict[str, Any]]) -> list[str]:
    """What is wrong with ``algorithm.batch_hooks`` / ``batch_hook_options``, one message each."""
    problems = []
    for name in names:
        try:
            hook = get_batch_hook(name)
        except UnknownNameError as err:
            problems.append(f"algorithm.batch_hooks: {err}")
            continue
        problems += option_problems(
            f"algorithm.batch_hook_options[{name!r}]", options.get(name, {}), hook.options, f"hook {name!r}"
        )
    stray = sorted(set(options) - set(names))
    if stray:
        problems.append(
            f"algorithm.batch_hook_options has options for {stray}, which algorithm.batch_hooks does not run"
        )
    return problems


class BatchHooks:
    """The configured hooks, by stage, with their options."""

    def __init__(self, names: list[str], options: dict[str, dict[str, Any]]) -> None:
        self.hooks: list[tuple[BatchHook, dict[str, Any]]] = [
            (get_batch_hook(n), dict(options.get(n, {}))) for n in names
        ]

    def stage(self, stage: str) -> bool:
        """Whether any hook runs at ``stage``."""
        return any(hook.stage == stage for hook, _ in self.hooks)

    def run(self, stage: str, batch: DataProto) -> tuple[DataProto, dict[str, float]]:
        """Run the hooks of ``stage`` in order; the batch they leave and their metrics (``batch_hooks/<name>/...``)."""
        metrics: dict[str, float] = {}
        for hook, options in self.hooks:
            if hook.stage != stage:
                continue
            before = batch
            batch, hook_metrics = hook.fn(batch, **options)
            _check_rows(hook, before, batch)
            metrics.update({f"batch_hooks/{hook.name}/{k}": float(v) for k, v in hook_metrics.items()})
        return batch, metrics


def _check_rows(hook: BatchHook, before: DataProto, after: DataProto) -> None:
    """``after_reward`` hooks may drop whole groups; ``before_update`` hooks keep every row in place."""
    old, new = np.asarray(before.non_tensor_batch[UID]), np.asarray(after.non_tensor_batch[UID])
    if hook.stage == "before_update":
        if len(new) != len(old) or not (new == old).all():
            raise RuntimeError(f"batch hook {hook.name!r} (before_update) changed the rows; it may change values only")
        return
    kept = set(new.tolist())
    partial = {uid for uid in kept if (old == uid).sum() != (new == uid).sum()}
    if partial or not kept <= set(old.tolist()):
        raise RuntimeError(
            f"batch hook {hook.name!r} (after_reward) must keep or drop whole groups; "
            f"groups it cut or added: {sorted(partial)[:3]}"
        )

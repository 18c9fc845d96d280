"""Batch hooks as the driver runs them: checked names and options, stages, and what each stage may change."""

from types import ModuleType

import numpy as np
import pytest
import torch

from hybridflow.core import DataProto
from hybridflow.plugins import BatchHook, get_plugin_manager, hookimpl, reset_plugin_manager
from hybridflow.plugins.manager import PluginSource
from hybridflow.trainer.batch_hooks import BatchHooks, hook_problems


def batch():
    return DataProto.from_dict(
        {"advantages": torch.arange(6.0)[:, None]}, {"uid": np.array(list("aabbcc"), dtype=object)}
    )


def cut_one_row(batch, *, keep: int = 5):
    return batch[:keep], {"rows": float(keep)}


def scale_advantages(batch, *, factor: float = 2.0):
    batch.batch["advantages"] = batch.batch["advantages"] * factor
    return batch, {}


def shuffle_rows(batch):
    return batch[torch.tensor([2, 3, 0, 1, 4, 5])], {}


@pytest.fixture
def test_hooks():
    plugin = ModuleType("test_hooks")

    @hookimpl
    def hybridflow_register_batch_hooks(register):
        register(BatchHook(name="cut", fn=cut_one_row, stage="after_reward"))
        register(BatchHook(name="scale", fn=scale_advantages, stage="before_update"))
        register(BatchHook(name="shuffle", fn=shuffle_rows, stage="before_update"))

    plugin.hybridflow_register_batch_hooks = hybridflow_register_batch_hooks
    get_plugin_manager().register(plugin, PluginSource("test_hooks", "tests", "0"))
    yield
    reset_plugin_manager()


def test_names_and_options_are_checked_before_anything_runs(test_hooks):
    assert hook_problems(["scale"], {"scale": {"factor": 3.0}}) == []
    problems = hook_problems(["scale", "nosuch"], {"scale": {"factr": 3.0}, "cut": {"keep": 2}})
    assert "algorithm.batch_hooks: unknown batch hook 'nosuch'" in problems[
        1
    ] or "unknown batch hook 'nosuch'" in " ".join(problems)
    assert "algorithm.batch_hook_options['scale'] has ['factr']; hook 'scale' takes {'factor': 2.0}" in problems
    assert "algorithm.batch_hook_options has options for ['cut'], which algorithm.batch_hooks does not run" in problems


def test_each_stage_runs_its_hooks_with_their_options(test_hooks):
    hooks = BatchHooks(["scale"], {"scale": {"factor": 3.0}})
    assert hooks.stage("before_update") and not hooks.stage("after_reward")
    out, metrics = hooks.run("after_reward", batch())
    assert out.batch["advantages"][:, 0].tolist() == [0, 1, 2, 3, 4, 5] and metrics == {}
    out, _ = hooks.run("before_update", batch())
    assert out.batch["advantages"][:, 0].tolist() == [0, 3, 6, 9, 12, 15]


def test_what_a_stage_may_not_change_is_refused(test_hooks):
    with pytest.raises(RuntimeError, match="must keep or drop whole groups; groups it cut or added: \\['c'\\]"):
        BatchHooks(["cut"], {}).run("after_reward", batch())
    out, metrics = BatchHooks(["cut"], {"cut": {"keep": 4}}).run("after_reward", batch())
    assert len(out) == 4 and metrics == {"batch_hooks/cut/rows": 4.0}
    with pytest.raises(RuntimeError, match="'shuffle' \\(before_update\\) changed the rows"):
        BatchHooks(["shuffle"], {}).run("before_update", batch())

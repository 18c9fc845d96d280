"""Every registered worker method declares what it reads (``@register(reads=...)``), and a real step ships that.

* :func:`undeclared_registrations` reads the source (``ast``) of workers/ and core/: each ``@register(...)``
  without ``reads=`` is reported (``reads=()``: a method that takes no batch). The worker classes are checked
  too, through the registrations the worker group reads.
* One training step with the actor, a reference (``actor.use_kl_loss``), a critic (``gae``) and the rollout
  correction on (so ``update_actor``'s optional inputs are all there and the old log-probs are recomputed), with
  the worker group's dispatch watched on the driver: every call's DataProto arguments must reach the ranks cut to
  exactly the declared columns, each of which the batch had (:func:`shipped_problems`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import small_config

import hybridflow
from hybridflow.core import DataProto
from hybridflow.core.dispatch import FutureShard, RegisteredMethod, Registration
from hybridflow.core.keys import (
    ADVANTAGES,
    ATTENTION_MASK,
    INPUT_IDS,
    OLD_LOG_PROBS,
    POSITION_IDS,
    REF_LOG_PROBS,
    RESPONSE_MASK,
    RESPONSES,
    RETURNS,
    ROLLOUT_IS_WEIGHTS,
    ROLLOUT_LOG_PROBS,
    VALUES,
)
from hybridflow.core.worker_group import RoleGroup

ROOT = Path(hybridflow.__file__).resolve().parent

# What each method's code reads of its batch, written out from the code (not from the declarations), for the
# step below: a declaration that drops a column read only when present (the engine's position_ids) or adds one the
# code never touches disagrees with this.
GENERATE = {INPUT_IDS, ATTENTION_MASK, POSITION_IDS}  # the engine (position_ids when present)
LOG_PROBS = {*GENERATE, RESPONSES}  # response_log_probs / packing; the token budget reads attention_mask
STEP_READS = {
    ("actor", "generate_sequences"): GENERATE,
    ("actor", "compute_log_prob"): LOG_PROBS,
    ("ref", "compute_ref_log_prob"): LOG_PROBS,
    ("critic", "compute_values"): {*LOG_PROBS, RESPONSE_MASK},  # values are zeroed outside the response
    ("critic", "update_critic"): {*LOG_PROBS, RESPONSE_MASK, VALUES, RETURNS},
    ("actor", "update_actor"): {
        *LOG_PROBS,
        RESPONSE_MASK,
        OLD_LOG_PROBS,
        ADVANTAGES,
        REF_LOG_PROBS,
        ROLLOUT_IS_WEIGHTS,
        ROLLOUT_LOG_PROBS,
    },  # KL loss, correction, the log-prob gap
}


def undeclared_registrations(source: str, filename: str = "<source>") -> list[str]:
    """``"file:line: Class.method"`` for every ``@register(...)``-decorated method of ``source`` without ``reads=``."""
    found = []
    for cls in ast.walk(ast.parse(source, filename)):
        if not isinstance(cls, ast.ClassDef):
            continue
        for fn in cls.body:
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for dec in fn.decorator_list:
                call = dec if isinstance(dec, ast.Call) else None
                name = getattr(call.func if call else dec, "id", getattr(call.func if call else dec, "attr", None))
                if name == "register" and not (call and any(kw.arg == "reads" for kw in call.keywords)):
                    found.append(f"{filename}:{fn.lineno}: {cls.name}.{fn.name}")
    return found


def worker_sources() -> list[Path]:
    return sorted(p for d in ("workers", "core") for p in (ROOT / d).rglob("*.py"))


def test_every_registered_method_in_the_tree_declares_reads():
    files = worker_sources()
    found = [hit for p in files for hit in undeclared_registrations(p.read_text(), str(p.relative_to(ROOT)))]
    assert found == [], "@register without reads=:\n" + "\n".join(found)
    assert sum("@register(" in p.read_text() for p in files) >= 6  # the scan sees the worker modules


def test_the_source_check_finds_a_register_without_reads():
    source = """
class W(Worker):
    @register(dispatch=DP_COMPUTE_PROTO, reads=FORWARD_INPUTS)
    def fine(self, data): ...

    @register(dispatch=ONE_TO_ALL, reads=())
    def no_batch(self): ...

    @register(dispatch=DP_COMPUTE_PROTO)
    def ships_everything(self, data): ...

    @register
    def bare(self): ...

    @torch.no_grad()
    @dispatch.register(dispatch=DP_COMPUTE_METRIC)
    def qualified(self, data): ...
"""
    assert undeclared_registrations(source, "w.py") == [
        "w.py:10: W.ships_everything",
        "w.py:13: W.bare",
        "w.py:17: W.qualified",
    ]


def worker_classes() -> list[type]:
    from hybridflow.workers.actor.worker import ActorRolloutWorker
    from hybridflow.workers.critic.worker import CriticWorker
    from hybridflow.workers.reference import RefWorker
    from hybridflow.workers.reward_model import RewardModelWorker
    from hybridflow.workers.reward_model_trainer import RewardModelTrainerWorker
    from hybridflow.workers.rollout.worker import RolloutWorker

    return [ActorRolloutWorker, CriticWorker, RefWorker, RewardModelWorker, RewardModelTrainerWorker, RolloutWorker]


def registrations(cls: type) -> dict[str, Registration]:
    """What the worker group reads of ``cls``: each registered method's :class:`Registration` (RoleGroup's lookup)."""
    return {
        name: attr.registration for name in dir(cls) if isinstance(attr := getattr(cls, name, None), RegisteredMethod)
    }


def test_every_worker_class_method_the_driver_can_call_declares_reads():
    undeclared = [
        f"{cls.__name__}.{name}"
        for cls in worker_classes()
        for name, reg in registrations(cls).items()
        if reg.reads is None
    ]
    assert undeclared == []
    assert len([r for cls in worker_classes() for r in registrations(cls).values()]) >= 25


# ------------------------------------------------------------------- one real step
@dataclass
class Call:
    """One group call as the driver dispatched it."""

    role: str
    method: str
    reads: tuple[str, ...] | None
    given: list[set[str]]  # the columns of each DataProto argument the driver passed
    shipped: list[set[str]]  # the columns of each DataProto the ranks were sent (after the cut)


def _columns(data: DataProto) -> set[str]:
    return {*data.batch, *data.non_tensor_batch}


def shipped_problems(calls: list[Call]) -> list[str]:
    """What is wrong with the recorded calls: a method without ``reads=``, a DataProto shipped with other columns
    than the declared ones, a declared column the batch lacked (a step that sends a method all it can read)."""
    problems = []
    for c in calls:
        where = f"{c.role}.{c.method}"
        if c.reads is None:
            problems.append(f"{where}: no reads= declared; the call shipped every column")
            continue
        if len(c.shipped) != len(c.given):
            problems.append(f"{where}: {len(c.given)} DataProto arguments, {len(c.shipped)} shipped")
        for given, shipped in zip(c.given, c.shipped):
            if shipped != (expected := given & set(c.reads)):
                problems.append(f"{where}: shipped {sorted(shipped)}, declared and present {sorted(expected)}")
            if missing := set(c.reads) - given:
                problems.append(f"{where}: declares {sorted(missing)}, which the batch did not have")
    return problems


def test_the_shipped_check_fails_a_call_without_reads_and_a_wrong_cut():
    cols = {"input_ids", "attention_mask", "responses"}
    good = Call("actor", "compute_log_prob", ("input_ids", "attention_mask", "responses"), [cols | {"uid"}], [cols])
    assert shipped_problems([good]) == []
    whole = Call("ref", "compute_ref_log_prob", None, [cols | {"uid"}], [cols | {"uid"}])
    assert shipped_problems([whole]) == ["ref.compute_ref_log_prob: no reads= declared; the call shipped every column"]
    extra = Call("critic", "compute_values", ("input_ids",), [cols], [cols])
    assert "shipped" in shipped_problems([extra])[0]
    absent = Call("critic", "update_critic", ("input_ids", "returns"), [cols], [{"input_ids"}])
    assert shipped_problems([absent]) == ["critic.update_critic: declares ['returns'], which the batch did not have"]


@pytest.fixture
def recorded(monkeypatch) -> list[Call]:
    """Every group call of the test, with what its ranks were sent (RoleGroup._shared sees the cut plan)."""
    calls: list[Call] = []
    submit, shared = RoleGroup._submit, RoleGroup._shared

    def recording_submit(self, name, reg, args, kwargs, timeout_s):
        given = [_columns(v) for v in (*args, *kwargs.values()) if isinstance(v, DataProto)]
        calls.append(Call(self.role, name, reg.reads, given, []))
        return submit(self, name, reg, args, kwargs, timeout_s)

    def recording_shared(self, plan):
        values = [v for args in plan.rank_args for v in args] + [v for kw in plan.rank_kwargs for v in kw.values()]
        assert not any(isinstance(v, FutureShard) for v in values), "a future argument: its columns are not seen here"
        protos = {id(v): v for v in values if isinstance(v, DataProto)}  # one shard per dp group here (1 rank)
        calls[-1].shipped = [_columns(v) for v in protos.values()]
        return shared(self, plan)

    monkeypatch.setattr(RoleGroup, "_submit", recording_submit)
    monkeypatch.setattr(RoleGroup, "_shared", recording_shared)
    return calls


@pytest.mark.slow
def test_one_step_ships_each_call_exactly_its_declared_columns(ray_session, tmp_path, recorded):
    from hybridflow.trainer.main import build_and_fit

    config = small_config(
        tmp_path,
        **{
            "actor_rollout_ref.actor.use_kl_loss": True,
            "algorithm.adv_estimator": "gae",
            "trainer.total_training_steps": 1,
            "data.train_batch_size": 2,
            "actor_rollout_ref.rollout.n": 2,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
            "algorithm.rollout_correction.rollout_is": "token",
        },
    )
    assert build_and_fit(config, tmp_path / "run").steps == 1
    called = {(c.role, c.method) for c in recorded}
    assert {(c.role, c.method) for c in recorded if c.given} == set(STEP_READS), called
    assert {("actor", "init_model"), ("ref", "init_model"), ("critic", "init_model")} <= called
    assert shipped_problems(recorded) == []
    wrong = {
        (c.role, c.method): sorted(set(c.reads) ^ STEP_READS[c.role, c.method])
        for c in recorded
        if c.given and set(c.reads) != STEP_READS[c.role, c.method]
    }
    assert wrong == {}, "declared reads differ from what the code reads (columns in one only)"

"""The memory plan against the trainer's own measurement: every stage a run reports (``memory/<stage>/peak_gb``, the
largest rank's resident set) within 25% of its planned peak.

The configurations are ``bench/bench_memory_plan.py``'s (two model sizes, offload, activation checkpointing,
reducing every micro-batch, LoRA, a critic, split placement, bf16 with a reference), run with the real trainer on
2 CPU ranks. ``make test`` runs the ~95M model's plain job (two steps: the optimizer's state exists from the
second); ``make test-memory`` runs every configuration for three steps, about a minute each.
"""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_memory_plan", ROOT / "bench" / "bench_memory_plan.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

TOLERANCE = 0.25
"""|planned - measured| <= TOLERANCE x measured (issue 50's bound)."""


def off_the_plan(name: str, steps: int) -> dict[str, tuple[float, float]]:
    """Each measured stage of configuration ``name`` whose plan misses by more than the tolerance:
    ``{stage: (planned, measured)}``; asserts every planned stage was measured."""
    measured = bench.measure(name, steps)["measured_gb"]
    planned = {stage: plan["peak_gb"] for stage, plan in bench.planned(name)["stages"].items()}
    assert set(planned) == set(measured), (planned, measured)
    return {
        stage: (planned[stage], measured[stage])
        for stage in planned
        if abs(planned[stage] - measured[stage]) > TOLERANCE * measured[stage]
    }


@pytest.mark.slow
def test_the_plan_of_a_95m_model_s_job_is_within_a_quarter_of_every_stage_measured(ray_session):
    assert off_the_plan("full", steps=2) == {}


@pytest.mark.memory_configs
@pytest.mark.parametrize("name", [n for n in bench.CONFIGS if n != "full"])
def test_the_plan_is_within_a_quarter_of_every_stage_measured(ray_session, name):
    assert off_the_plan(name, steps=3) == {}

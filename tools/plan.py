"""``hybridflow plan <overrides>``: each stage's predicted peak memory per rank, the memory a rank has, the verdict.

The overrides are ``hybridflow-train``'s (veRL's spellings translated the same way); nothing starts: no Ray, no
weights (the model is built on the meta device). ``--json`` prints the plan as
``{"stages": {"<stage>": {"peak_gb", "ranks", "parts_gb"}}, "limit_gb", "fits", "device"}``. The model behind
the numbers: ``trainer/memory_plan.py`` and ``docs/memory.md``.
"""

from __future__ import annotations

import json
from typing import Any

from hybridflow.trainer.memory_check import largest_parts, refusal
from hybridflow.trainer.memory_plan import MemoryPlan, plan_memory

__all__ = ["compose_config", "format_plan", "plan_command"]


def compose_config(overrides: list[str]) -> Any:
    """The checked config ``hybridflow-train <overrides>`` would run (its device settled), without starting it."""
    from hydra import compose, initialize_config_dir  # noqa: PLC0415
    from hydra.errors import HydraException  # noqa: PLC0415
    from omegaconf import OmegaConf  # noqa: PLC0415

    from hybridflow.configs import CONFIG_DIR  # noqa: PLC0415
    from hybridflow.configs.overrides import override_problems, translate  # noqa: PLC0415
    from hybridflow.configs.schema import register_configs  # noqa: PLC0415
    from hybridflow.trainer.config_checks import ConfigError, config_problems, settle_device  # noqa: PLC0415

    translation = translate(overrides)
    problems = override_problems(translation.args)
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))
    register_configs()
    try:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
            cfg = compose("ppo_trainer", overrides=translation.args)
    except HydraException as error:  # an override Hydra cannot apply: its own message, no traceback
        raise ConfigError(f"invalid config:\n  - {error}") from None
    config = OmegaConf.to_object(cfg)
    settle_device(config.trainer)
    problems = config_problems(config, this_machine=False)  # a GPU run is planned on any machine
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))
    return config


def format_plan(plan: MemoryPlan) -> str:
    """The table ``hybridflow plan`` prints, and the verdict."""
    rows = ["| stage | ranks | peak GiB | parts (GiB) |", "|---|---|---:|---|"]
    for stage in plan.stages.values():
        rows.append(f"| {stage.stage} | {stage.ranks} | {stage.peak_gb:.2f} | {largest_parts(stage.parts, 99)} |")
    if plan.limit_gb is None:
        verdict = f"limit: unknown ({plan.limit_source})"
    else:
        largest = plan.largest()
        verdict = (
            f"limit: {plan.limit_gb:.2f} GiB per rank ({plan.limit_source}); largest stage {largest.stage} "
            f"{largest.peak_gb:.2f} GiB: " + ("fits" if plan.fits else "does NOT fit")
        )
    return "\n".join(rows) + f"\n\n{verdict} (device: {plan.device})"


def plan_command(overrides: list[str], as_json: bool) -> tuple[int, str]:
    """``hybridflow plan``: the exit code (0 fits or no limit known, 1 does not fit) and what to print."""
    config = compose_config(overrides)
    plan = plan_memory(config)
    text = json.dumps(plan.as_json(), indent=2) if as_json else format_plan(plan)
    if plan.fits is False and not as_json:
        text += "\n\n" + refusal(config, plan)
    return (1 if plan.fits is False else 0), text

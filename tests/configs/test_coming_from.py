"""The "coming from" pages' mapping rows, each parsed and applied to the code.

``docs/coming-from-verl.md``'s key table says what ``hybridflow-train`` does
with each setting of veRL's scripts (the same, translated, no effect,
refused); each row is run through :func:`translate` and the override check.
``docs/coming-from-trl.md``'s tables map ``GRPOConfig`` names to keys here;
each row's names must be in the table of ``configs/foreign_keys.py``, and the
keys the row gives must be among those the table suggests.
"""

import re
from pathlib import Path

import pytest

from hybridflow.configs.foreign_keys import TRL_NAMES, lookup, suggestion
from hybridflow.configs.overrides import override_problems, translate

DOCS = Path(__file__).resolve().parents[2] / "docs"
TICKS = re.compile(r"`([^`]+)`")


def table_rows(page: str, header: str) -> list[tuple[str, str]]:
    """(first cell, second cell) of each row of the table whose header row starts with ``header``."""
    lines = (DOCS / page).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header}"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        first, second = (cell.strip() for cell in line.strip("|").split(" | ", 1))
        rows.append((first, second))
    return rows


VERL_ROWS = table_rows("coming-from-verl.md", "veRL, as its scripts write it")


def test_the_verl_table_covers_the_example_scripts_keys():
    assert len(VERL_ROWS) >= 80
    kinds = {second.split(":")[0].split(" (")[0].split(" when")[0] for _, second in VERL_ROWS}
    assert kinds == {"the same", "translated", "no effect", "refused"}


@pytest.mark.parametrize("first,second", VERL_ROWS, ids=[f for f, _ in VERL_ROWS])
def test_a_verl_row_is_what_the_command_does(first, second):
    [arg] = TICKS.findall(first)
    context = ["actor_rollout_ref.model.path=" + arg.partition("=")[2]] if second.startswith("no effect when") else []
    out = translate([*context, arg])
    problems = override_problems(out.args)
    if second.startswith("the same"):
        assert (out.args, out.lines, problems) == ([arg], [], [])
    elif second.startswith("translated: "):
        shown = TICKS.findall(second.split(" (")[0])
        assert out.args == shown and len(out.lines) == 1 and problems == []
    elif second.startswith("no effect"):
        assert out.args == context and len(out.lines) == 1 and problems == []
    else:
        assert second.startswith("refused: ") and len(problems) == 1, problems
        for key in TICKS.findall(second):  # the key the row says to write is the one the message names
            assert key.partition("=")[0] in problems[0], (key, problems[0])


TRL = {e.name for e in TRL_NAMES}
TRL_ROWS = [row for header in ("TRL |", "`scale_rewards`") for row in table_rows("coming-from-trl.md", header)]


def trl_names(first: str) -> list[str]:
    """The GRPOConfig names a row's first cell maps (``loss_type="cispo"`` -> ``loss_type``)."""
    return [name for span in TICKS.findall(first) if (name := span.partition("=")[0]) in TRL]


@pytest.mark.parametrize("first,second", TRL_ROWS, ids=[f[:40] for f, _ in TRL_ROWS])
def test_a_trl_row_gives_keys_the_table_suggests(first, second):
    names = trl_names(first) or ["scale_rewards"]
    suggested = set()
    for name in names:
        entry, _ = lookup(name)
        for value in [entry.example, *entry.by_value]:
            suggested.update(item.lstrip("'+").partition("=")[0] for item in suggestion(entry, value) or ())
    given = {
        span.lstrip("+").partition("=")[0]
        for span in TICKS.findall(second)
        if span.startswith(
            ("actor_rollout_ref.", "+actor_rollout_ref.", "algorithm.", "+algorithm.", "data.", "trainer.")
        )
        and "..." not in span
        and "/" not in span
        and " " not in span
    }
    assert given, (first, second)
    assert given & suggested, (names, given, suggested)
    for span in TICKS.findall(second):
        if "=" in span and " " not in span and "..." not in span and "<" not in span:
            assert override_problems([span]) == [], span


def test_trl_cispo_and_entropy_differences_are_said():
    text = (DOCS / "coming-from-trl.md").read_text()
    assert "clip_ratio_low=1.0" in text and "from above only" in text
    assert "per-token mean" in text and "loss_agg_mode" in text

"""Mutation testing of the algorithm core with cosmic-ray: how many wrong formulas the suite catches.

    make mutate TARGET=core/dispatch.py           # one target, at most ~30 minutes (a sample if it needs more)
    make mutate                                   # every target not yet in the results file, one after another
    .venv/bin/python bench/mutate.py --only rewards/gsm8k.py --budget-s 1800 --seed 0 [--redo]
    .venv/bin/python bench/mutate.py --table      # the results file as docs/reliability.md's table

Each target (a module or a folder) is mutated against the fast unit tests that cover it (no Ray, no end-to-end
run). The mutants run in a copy of the committed tree (``git archive HEAD``), never in the checkout: cosmic-ray
edits a file in place for each mutant. ``PYTHONPATH`` points the tests at the copy (it comes before the editable
install on ``sys.path``).

A target whose mutants do not fit ``--budget-s`` (each costs at most one run of its tests, timed once on the
unmutated copy) runs a sample of them, drawn with ``--seed``: the score is then the sample's, with its 95%
interval (Wilson's, with the finite-population correction). Each finished target appends one row to
``bench/results/mutation.jsonl`` (date, tool and version, commit, mutants run of the population, killed,
survived, timed out, incompetent: a mutant that does not import or run at all, the score and its interval) and
writes its survivors' diffs to ``bench/results/mutation-survivors/<target>.md``, the list docs/reliability.md
explains; a rerun skips the targets the file has unless ``--redo``.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import math
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COSMIC_RAY = str(Path(sys.executable).parent / "cosmic-ray")  # the one installed beside this interpreter
RESULTS = ROOT / "bench" / "results" / "mutation.jsonl"
SURVIVORS = ROOT / "bench" / "results" / "mutation-survivors"

# target -> the unit tests that cover it, none of them starting Ray (run with -x: the first failure kills the mutant)
# (tests/estimators/test_external_plugin.py pip-installs into the venv: not a unit test, left out)
ESTIMATOR_TESTS = [
    "tests/estimators/test_estimators.py",
    "tests/estimators/test_catalogue_estimators.py",
    "tests/estimators/test_actor_defaults.py",
]
TARGETS: dict[str, list[str]] = {
    "estimators": ESTIMATOR_TESTS,
    "losses": [
        "tests/losses",
        "tests/workers/test_loss_scale_factor.py",
        "tests/workers/test_ppo_critic.py::test_clipped_value_loss_hand_computed",  # losses/value.py
        "tests/trainer/test_train_rm.py::test_bradley_terry_loss_and_accuracy_match_hand_computed_values",
        "tests/trainer/test_train_rm.py::test_bradley_terry_gradient_pulls_the_pair_apart",
    ],
    "trainer/kl_control.py": ["tests/trainer/test_kl_control.py"],
    "trainer/estimator_inputs.py": [
        "tests/trainer/test_estimator_inputs.py",
        "tests/trainer/test_old_log_probs.py::test_auto_reuses_only_the_same_numbers",
        "tests/trainer/test_old_log_probs.py::test_an_estimator_that_needs_the_pass_recomputes_and_false_is_refused_for_it",
        "tests/losses/test_bypass.py",
        *ESTIMATOR_TESTS,
    ],
    "core/data_proto.py": ["tests/core/test_data_proto.py"],
    "core/dispatch.py": ["tests/core/test_dispatch.py"],
    "rewards/sources.py": ["tests/rewards/test_sources.py"],
    "rewards/math_answer.py": ["tests/rewards/test_math_answer.py"],
    "rewards/gsm8k.py": ["tests/rewards/test_gsm8k.py"],
    "rewards/arithmetic.py": [
        "tests/rewards/test_format_routing_custom.py",
        "tests/rewards/test_sources.py",
        "tests/data/test_synthetic.py",
    ],
    "rewards/code_asserts.py": ["tests/rewards/test_code_forgery.py", "tests/rewards/test_code_sandbox.py"],
    "workers/rollout/sampling.py": ["tests/workers/test_sampling.py"],
    "core/devices.py": ["tests/core/test_devices.py", "tests/trainer/test_config_checks.py"],
}
OUTCOMES = ("killed", "survived", "timeout", "incompetent")


def copy_tree(dest: Path, commit: str) -> Path:
    """``commit``'s tree under ``dest/hybridflow`` (the folder's name is the package's); returns it."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "--prefix=hybridflow/"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest / "hybridflow"


def test_command(tests: list[str], parent: Path) -> str:
    """The command a mutant's tests run with: the copy under ``parent`` first on the path."""
    return f"env PYTHONPATH={parent} {sys.executable} -m pytest -x -q -p no:cacheprovider -p no:xdist {' '.join(tests)}"


def config_text(target: str, tests: list[str], parent: Path, timeout_s: float) -> str:
    command = test_command(tests, parent)
    return "\n".join(
        [
            "[cosmic-ray]",
            f'module-path = "{target}"',
            f"timeout = {timeout_s}",
            "excluded-modules = []",
            f'test-command = "{command}"',
            "",
            "[cosmic-ray.distributor]",
            'name = "local"',
            "",
        ]
    )


def annotation_spans(path: Path) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) positions of every type annotation in a file: a mutant there changes nothing at run time
    (``from __future__ import annotations`` keeps them as strings), so it is skipped, not counted."""
    spans = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        found = []
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            found.append(node.annotation)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            found.append(node.returns)
        spans += [((a.lineno, a.col_offset), (a.end_lineno, a.end_col_offset)) for a in found]
    return spans


def skip_annotation_mutants(session: Path, tree: Path) -> None:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    spans: dict[Path, list] = {}
    with use_db(str(session), WorkDB.Mode.open) as db:
        for item in db.work_items:
            for mutation in item.mutations:
                path = tree / mutation.module_path
                if path not in spans:
                    spans[path] = annotation_spans(path)
                start = tuple(mutation.start_pos)
                if any(lo <= start < hi for lo, hi in spans[path]):
                    db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))


def sample_mutants(session: Path, size: int, seed: int) -> tuple[int, int]:
    """Keep ``size`` of the session's pending mutants, drawn with ``seed``, and skip the rest; (population,
    kept). Mutants already decided (the annotation ones) are not in the population."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    with use_db(str(session), WorkDB.Mode.open) as db:
        pending = sorted(item.job_id for item in db.pending_work_items)
        kept = set(random.Random(seed).sample(pending, size)) if size < len(pending) else set(pending)
        for job_id in pending:
            if job_id not in kept:
                db.set_result(job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED))
    return len(pending), len(kept)


def tests_seconds(target: str, tree: Path) -> float:
    """One run of the target's tests on the unmutated copy, timed (what a surviving mutant costs at most)."""
    start = time.monotonic()
    done = subprocess.run(test_command(TARGETS[target], tree.parent), shell=True, cwd=tree, capture_output=True)
    if done.returncode != 0:
        raise RuntimeError(f"{target}: its tests fail on the unmutated tree:\n{done.stdout.decode()[-2000:]}")
    return time.monotonic() - start


def run_target(target: str, timeout_s: float, budget_s: float, seed: int) -> dict:
    """Mutate one target in its own copy, a sample of its mutants when they do not fit ``budget_s``; returns its
    results row (with the survivors' diffs)."""
    with tempfile.TemporaryDirectory(prefix="hybridflow-mutate-") as tmp:
        commit = subprocess.run(  # the commit the copy is of (HEAD may move while the mutants run)
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        tree = copy_tree(Path(tmp), commit)
        config, session = Path(tmp) / "cosmic-ray.toml", Path(tmp) / "session.sqlite"
        config.write_text(config_text(target, TARGETS[target], Path(tmp), timeout_s), encoding="utf-8")
        subprocess.run([COSMIC_RAY, "init", str(config), str(session)], cwd=tree, check=True)
        skip_annotation_mutants(session, tree)
        per_mutant = tests_seconds(target, tree)
        population, sampled = sample_mutants(session, max(1, int(budget_s / per_mutant)), seed)
        subprocess.run([COSMIC_RAY, "exec", str(config), str(session)], cwd=tree, check=True, stdout=subprocess.DEVNULL)
        dump = subprocess.run(
            [COSMIC_RAY, "dump", str(session)], cwd=tree, check=True, capture_output=True, text=True
        ).stdout
    counts = dict.fromkeys(OUTCOMES, 0)
    survivors = []
    for line in dump.splitlines():
        job, result = json.loads(line)
        if result is None or result["worker_outcome"] == "skipped":
            continue
        if result["worker_outcome"] == "timeout":
            outcome = "timeout"
        elif result["worker_outcome"] != "normal" or result["test_outcome"] == "incompetent":
            outcome = "incompetent"
        else:
            outcome = result["test_outcome"]
        counts[outcome] += 1
        if outcome == "survived":
            survivors.append(result["diff"])
    competent = counts["killed"] + counts["survived"] + counts["timeout"]
    caught = counts["killed"] + counts["timeout"]
    return {
        "commit": commit,
        "target": target,
        "population": population,
        "sampled": sampled,
        **counts,
        "score": caught / competent if competent else None,
        "interval": score_interval(caught, competent, population - counts["incompetent"]),
        "tests_s": round(per_mutant, 2),
        "seed": seed,
        "survivors": survivors,
    }


def score_interval(caught: int, competent: int, population: int) -> list[float] | None:
    """The 95% interval of the share caught among all the target's competent mutants, from ``caught`` of a
    sample of ``competent``: Wilson's score interval, its two sides drawn toward the sample's share by the
    finite-population correction (a sample of the whole population has no uncertainty left)."""
    if not competent:
        return None
    p = caught / competent
    if population <= competent:  # every competent mutant ran: the score is exact
        return [round(p, 4), round(p, 4)]
    z, fpc = 1.96, math.sqrt((population - competent) / (population - 1))
    centre = (p + z * z / (2 * competent)) / (1 + z * z / competent)
    half = z * math.sqrt(p * (1 - p) / competent + z * z / (4 * competent**2)) / (1 + z * z / competent)
    low, high = centre - half, centre + half  # Wilson's, for a sample of an unbounded population
    return [round(p - (p - low) * fpc, 4), round(p + (high - p) * fpc, 4)]  # drawn toward p as the sample nears all


def finished() -> dict[str, dict]:
    """The results file's rows by target (the last row of each)."""
    if not RESULTS.exists():
        return {}
    rows = [json.loads(line) for line in RESULTS.read_text(encoding="utf-8").splitlines() if line.strip()]
    return {row["target"]: row for row in rows}


def record(row: dict, version: str) -> None:
    """Append ``row`` (with the date and the tool) to the results file; its survivors' diffs go to their own
    page."""
    survivors = row.pop("survivors")
    meta = {"date": datetime.date.today().isoformat(), "tool": f"cosmic-ray {version}", "commit": row.pop("commit")}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a", encoding="utf-8") as f:
        f.write(json.dumps({**meta, **row}) + "\n")
    SURVIVORS.mkdir(parents=True, exist_ok=True)
    page = SURVIVORS / (row["target"].replace("/", "_") + ".md")
    body = "\n".join(f"```diff\n{d.strip()}\n```\n" for d in survivors) or "None.\n"
    page.write_text(f"# Survivors of `{row['target']}` ({meta['tool']}, {meta['commit']})\n\n{body}", encoding="utf-8")


def table(rows: list[dict]) -> str:
    """docs/reliability.md's table: one row per target."""
    lines = [
        "| target | date, tool, commit | mutants run / population | killed | survived | timed out | incompetent "
        "| killed of the competent | 95% interval |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        score = f"{r['score']:.1%}" if r["score"] is not None else "-"
        low, high = r["interval"] or (None, None)
        interval = "-" if low is None else ("exact" if low == high else f"{low:.1%} - {high:.1%}")
        lines.append(
            f"| `{r['target']}` | {r['date']}, {r['tool']}, {r['commit']} | {r['sampled']} / {r['population']} | "
            f"{r['killed']} | {r['survived']} | {r['timeout']} | {r['incompetent']} | {score} | {interval} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(TARGETS), help="these targets (default: all)")
    parser.add_argument("--budget-s", type=float, default=1800.0, help="a target's time: past it, a sample")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="a mutant's test run past this is 'timed out'")
    parser.add_argument("--redo", action="store_true", help="run targets the results file already has")
    parser.add_argument("--table", action="store_true", help="print the results file as a table, run nothing")
    args = parser.parse_args()
    if args.table:
        print(table([finished()[t] for t in TARGETS if t in finished()]))
        return 0
    if shutil.which(COSMIC_RAY) is None:
        sys.exit("cosmic-ray is not installed: pip install 'cosmic-ray==8.7.0' (make mutate does)")
    version = subprocess.run([COSMIC_RAY, "--version"], capture_output=True, text=True).stdout.split()[-1]
    done = finished()
    for target in args.only or list(TARGETS):
        if target in done and not args.redo:
            print(f"{target}: in {RESULTS.relative_to(ROOT)} already (--redo runs it again)")
            continue
        row = run_target(target, args.timeout_s, args.budget_s, args.seed)
        record(row, version)
        print(table([finished()[target]]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

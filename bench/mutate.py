"""Mutation testing of the algorithm core with cosmic-ray: how many wrong formulas the suite catches.

    make mutate                                   # every target below (hours on 2 cores; see docs/reliability.md)
    .venv/bin/python bench/mutate.py --only trainer/kl_control.py rewards/gsm8k.py --jobs 2

Each target (a module or a folder) is mutated against the tests that cover it. The mutants run in a copy
of the committed tree (``git archive HEAD``), never in the checkout: cosmic-ray edits a file in place for
each mutant, and a copy per parallel job keeps two mutants from meeting. ``PYTHONPATH`` points the tests at
the copy (it comes before the editable install on ``sys.path``). Prints, and writes to ``<out>/mutation.md``,
one row per target: mutants, killed, survived, timed out, incompetent (a mutant that does not import or
run at all); ``<out>/survivors.md`` holds each survivor's diff, the list docs/reliability.md explains.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import datetime
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COSMIC_RAY = str(Path(sys.executable).parent / "cosmic-ray")  # the one installed beside this interpreter

# target -> the tests that cover it (run with -x: the first failure kills the mutant)
TARGETS: dict[str, list[str]] = {
    "estimators": ["tests/estimators"],
    "losses": ["tests/losses"],
    "trainer/kl_control.py": ["tests/trainer/test_kl_control.py", "tests/trainer/test_old_log_probs.py"],
    "trainer/estimator_inputs.py": ["tests/trainer/test_estimator_inputs.py", "tests/estimators"],
    "core/data_proto.py": ["tests/core/test_data_proto.py"],
    "core/dispatch.py": ["tests/core/test_dispatch.py"],
    "rewards/math_answer.py": ["tests/rewards/test_math_answer.py"],
    "rewards/gsm8k.py": ["tests/rewards/test_gsm8k.py"],
    "rewards/arithmetic.py": ["tests/rewards/test_format_routing_custom.py", "tests/rewards/test_manager.py"],
    "rewards/code_asserts.py": ["tests/rewards/test_code_forgery.py", "tests/rewards/test_code_sandbox.py"],
}
OUTCOMES = ("killed", "survived", "timeout", "incompetent")


def copy_tree(dest: Path) -> Path:
    """The committed tree under ``dest/hybridflow`` (the folder's name is the package's); returns it."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "HEAD", "--prefix=hybridflow/"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest / "hybridflow"


def config_text(target: str, tests: list[str], parent: Path, timeout_s: float) -> str:
    command = (
        f"env PYTHONPATH={parent} {sys.executable} -m pytest -x -q -p no:cacheprovider -p no:xdist {' '.join(tests)}"
    )
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


def run_target(target: str, out: Path, timeout_s: float) -> dict:
    """Mutate one target in its own copy; returns its counts and survivors."""
    with tempfile.TemporaryDirectory(prefix="hybridflow-mutate-") as tmp:
        tree = copy_tree(Path(tmp))
        name = target.replace("/", "_")
        config, session = out / f"{name}.toml", out / f"{name}.sqlite"
        config.write_text(config_text(target, TARGETS[target], Path(tmp), timeout_s), encoding="utf-8")
        session.unlink(missing_ok=True)
        subprocess.run([COSMIC_RAY, "init", str(config), str(session)], cwd=tree, check=True)
        skip_annotation_mutants(session, tree)
        subprocess.run([COSMIC_RAY, "exec", str(config), str(session)], cwd=tree, check=True, stdout=subprocess.DEVNULL)
        dump = subprocess.run(
            [COSMIC_RAY, "dump", str(session)], cwd=tree, check=True, capture_output=True, text=True
        ).stdout
    counts = dict.fromkeys(OUTCOMES, 0)
    survivors = []
    for line in dump.splitlines():
        job, result = json.loads(line)
        if result is None:
            continue
        if result["worker_outcome"] == "skipped":
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
    return {"target": target, **counts, "survivors": survivors}


def table(rows: list[dict], version: str) -> str:
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    lines = [
        f"cosmic-ray {version}, {datetime.date.today().isoformat()}, the committed tree ({commit})",
        "",
        "| target | mutants | killed | survived | timed out | incompetent | killed of the competent |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        competent = r["killed"] + r["survived"] + r["timeout"]
        share = f"{(r['killed'] + r['timeout']) / competent:.1%}" if competent else "-"
        total = competent + r["incompetent"]
        lines.append(
            f"| `{r['target']}` | {total} | {r['killed']} | {r['survived']} | {r['timeout']} | "
            f"{r['incompetent']} | {share} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(TARGETS), help="these targets (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="targets mutated at once, each in its own copy")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="a mutant's test run past this is 'timed out'")
    parser.add_argument("--out", type=Path, default=ROOT / "mutation-results")
    args = parser.parse_args()
    if shutil.which(COSMIC_RAY) is None:
        sys.exit("cosmic-ray is not installed: pip install 'cosmic-ray==8.7.0' (make mutate does)")
    args.out.mkdir(parents=True, exist_ok=True)
    version = subprocess.run([COSMIC_RAY, "--version"], capture_output=True, text=True).stdout.split()[-1]
    targets = args.only or list(TARGETS)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(lambda t: run_target(t, args.out, args.timeout_s), targets))
    text = table(rows, version)
    (args.out / "mutation.md").write_text(text, encoding="utf-8")
    survivors = [
        f"## `{r['target']}`\n\n" + "\n".join(f"```diff\n{d.strip()}\n```\n" for d in r["survivors"])
        for r in rows
        if r["survivors"]
    ]
    (args.out / "survivors.md").write_text("\n".join(survivors), encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

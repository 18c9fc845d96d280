"""What a user installs works: a wheel built from a clean copy of the tree, installed outside the checkout.

``make test`` runs against an editable install, which finds every folder on disk, so a folder the build leaves
out goes unnoticed there (``tools`` and ``sandbox`` once did: ``hybridflow-train`` failed at start from a
wheel). Here the tree as git sees it (tracked and new files, nothing ignored) is copied, built into an sdist
and a wheel from that sdist (``python -m build``), and the wheel is installed into a fresh virtualenv that
borrows the suite's installed dependencies but not its editable ``hybridflow``. From a folder outside the
checkout: every file of the tree that should ship is in site-packages, every module imports, every console
script and subcommand answers ``--help``, ``hybridflow plugins`` lists the built-in plugins, and the default
job trains 2 steps.
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import borrowed_venv

import hybridflow

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# The tree's files that are not the package: the suite, benchmarks, docs, and the build's own files.
NOT_SHIPPED_DIRS = ("tests/", "bench/", "docs/", ".ci/")
NOT_SHIPPED_FILES = {
    ".gitignore",
    "Makefile",
    "README.md",
    "LICENSE",
    "setup.cfg",
    "setup.py",
    "pyproject.toml",
    "mkdocs.yml",
}
DATA_DIRS = ("templates/", "examples/")  # copied whole; their Python files belong to other packages
BUILTIN_PLUGINS = ("grpo", "rloo", "gae", "reinforce_plus_plus", "vanilla", "gspo", "math", "gsm8k", "code")


def tree_files() -> list[str]:
    """The files a fresh clone of this checkout would hold, with what is new and not ignored."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the clean copy is what git tracks")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return sorted(path for path in listed.split("\0") if path and (ROOT / path).is_file())


def shipped(path: str) -> bool:
    return not path.startswith(NOT_SHIPPED_DIRS) and path not in NOT_SHIPPED_FILES


def user_env() -> dict[str, str]:
    """The environment of a user's shell: nothing that points into the checkout or at another Ray or W&B."""
    drop = ("PYTHONPATH", "RAY_ADDRESS", "WANDB_API_KEY", "WANDB_MODE", "HYBRIDFLOW_DISABLE_PLUGIN_AUTOLOAD")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def build(copy: Path, dist: Path) -> str:
    """An sdist, then the wheel built from that sdist, with the suite's setuptools (no download)."""
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(copy)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def run(argv: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=user_env(), capture_output=True, text=True, timeout=timeout)


def console_scripts(site: Path) -> list[str]:
    (info,) = site.glob("hybridflow-*.dist-info")
    entry_points = configparser.ConfigParser()
    entry_points.read(info / "entry_points.txt")
    return sorted(entry_points["console_scripts"])


def modules_of(package: Path) -> list[str]:
    """Every module of the installed package by its dotted name, the data folders' files aside."""
    names = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative.startswith(DATA_DIRS) or relative == "__main__.py":
            continue
        parts = ["hybridflow", *relative.removesuffix(".py").split("/")]
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_a_wheel_from_a_clean_copy_installs_and_runs_outside_the_checkout(tmp_path):
    copy, dist, outside = tmp_path / "clean", tmp_path / "dist", tmp_path / "elsewhere"
    files = tree_files()
    for path in files:
        (copy / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / path, copy / path)
    log = build(copy, dist)
    assert "absent from the `packages` configuration" not in log, log
    (wheel,) = dist.glob("hybridflow-*.whl")
    assert len(list(dist.glob("hybridflow-*.tar.gz"))) == 1

    # every package the suite has but hybridflow (its editable finder, .pth and metadata): the wheel is the only way in
    _, site = borrowed_venv(tmp_path / "venv", with_hybridflow=False)
    bin_dir = tmp_path / "venv" / "bin"
    installed = run(
        [sys.executable, "-m", "pip", "--python", str(bin_dir / "python"), "install", "--quiet", "--no-deps",
         "--no-index", str(wheel)],
        cwd=tmp_path,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    outside.mkdir()
    # the slowest check first, in the background: the default job, 2 steps, in its own Ray instance (one rank: a
    # rank is a process whose imports cost the suite seconds, and the wheel's code is the same on each)
    train_log = (tmp_path / "train.log").open("w")
    train = subprocess.Popen(
        [str(bin_dir / "hybridflow-train"), "trainer.total_training_steps=2", "trainer.n_gpus_per_node=1",
         "hydra.run.dir=run"],
        cwd=outside, env=user_env(), stdout=train_log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        package = site / "hybridflow"
        missing = [path for path in files if shipped(path) and not (package / path).is_file()]
        assert missing == [], f"in the tree but not in the wheel: {missing}"
        assert not (package / "setup.py").exists()

        modules = modules_of(package)
        imports = run(
            [str(bin_dir / "python"), "-c",
             "import importlib, sys, hybridflow\n"
             "print(hybridflow.__file__)\n"
             "for name in sys.argv[1:]: importlib.import_module(name)",
             *modules],
            cwd=outside,
        )  # fmt: skip
        assert imports.returncode == 0, imports.stderr[-3000:]
        assert imports.stdout.splitlines()[0] == str(package / "__init__.py")

        for script in console_scripts(site):
            helped = run([str(bin_dir / script), "--help"], cwd=outside)
            assert helped.returncode == 0, f"{script} --help: {helped.stderr[-2000:]}"
        from hybridflow.cli import build_parser

        (subcommands,) = (a.choices for a in build_parser()._actions if isinstance(a.choices, dict))
        for sub in subcommands:
            helped = run([str(bin_dir / "hybridflow"), sub, "--help"], cwd=outside)
            assert helped.returncode == 0, f"hybridflow {sub} --help: {helped.stderr[-2000:]}"
        version = run([str(bin_dir / "hybridflow"), "--version"], cwd=outside)
        assert version.stdout.strip() == f"hybridflow {hybridflow.__version__} from {package}", version.stdout

        listing = run([str(bin_dir / "hybridflow"), "plugins"], cwd=outside).stdout
        rows = {line.split()[0]: line.split()[1:3] for line in listing.splitlines() if line.startswith("  ")}
        for name in BUILTIN_PLUGINS:
            assert rows.get(name) == ["hybridflow", hybridflow.__version__], f"{name} not built in:\n{listing}"

        assert train.wait(timeout=240) == 0, (tmp_path / "train.log").read_text()[-4000:]
    finally:
        if train.poll() is None:
            train.kill()
    text = (tmp_path / "train.log").read_text()
    assert "training: step 2/2" in text and re.search(r"^steps\s+2$", text, re.M), text[-3000:]
    assert len((outside / "run" / "metrics.jsonl").read_text().splitlines()) >= 2

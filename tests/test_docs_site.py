"""The docs site builds in strict mode: a broken link or anchor, a page missing from the navigation, or an API
reference that no longer resolves (a renamed hookspec, a moved class) fails the suite, as ``make docs`` would."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_docs_site_builds_strict_with_no_warning(tmp_path):
    # -m, as `make docs` does: with the venv's bin/ first on the path, griffe reads the console script as the package
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's notice of its end of life, not about our pages
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert "WARNING" not in out.stderr, out.stderr[-4000:]
    api = tmp_path / "site" / "api"
    hooks = (api / "plugins" / "index.html").read_text(encoding="utf-8")
    assert "hybridflow_register_estimators" in hooks and "AdvantageEstimator" in hooks  # rendered from docstrings
    for page in ("rollout-engine", "data-proto", "dispatch", "worker-group"):
        assert (api / page / "index.html").is_file(), page

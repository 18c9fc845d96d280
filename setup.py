"""Which packages ship: found in the tree, never listed by hand (``setup.cfg`` holds everything else).

The repository root is the package ``hybridflow`` (``package_dir = hybridflow = .``), and setuptools' discovery
names packages after their folders (``core``, not ``hybridflow.core``), so ``packages = find:`` cannot say it in
``setup.cfg``: discovery runs here and its names gain the prefix. Two rules:

- code: every folder with an ``__init__.py``, except the suite and the benchmarks;
- data: every folder under a data root (the Hydra config groups, the plugin templates, the example plugins), so
  a new config group or template ships without an edit here. Their files come with them by ``package_data``.

``tests/packaging/test_wheel.py`` builds a wheel from a clean copy, installs it outside the checkout and runs
every command from it.
"""

from setuptools import find_namespace_packages, find_packages, setup
from setuptools.command.build_py import build_py

NOT_SHIPPED = ["tests", "tests.*", "bench", "bench.*", "docs", "docs.*", "build", "build.*", "dist", "dist.*"]
DATA_ROOTS = ("configs", "templates", "examples")


def data_packages(root: str) -> list[str]:
    """``root`` and the folders under it with importable names; folders whose names are not identifiers
    (``estimator-plugin``, ``__pycache__`` aside) travel as data of the nearest package above them."""
    found = [name for name in find_namespace_packages(where=root) if all(p.isidentifier() for p in name.split("."))]
    return [root, *(f"{root}.{name}" for name in found if "__pycache__" not in name)]


def shipped_packages() -> list[str]:
    code = find_packages(where=".", exclude=NOT_SHIPPED)
    data = [name for root in DATA_ROOTS for name in data_packages(root)]
    return ["hybridflow", *(f"hybridflow.{name}" for name in sorted(set(code) | set(data)))]


class BuildPy(build_py):
    """This file sits in the package's folder but is not part of it: under a PEP 517 build setuptools no longer
    recognises its own setup script, and would ship it as ``hybridflow.setup``."""

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if (m[0], m[1]) != ("hybridflow", "setup")]


setup(packages=shipped_packages(), cmdclass={"build_py": BuildPy})

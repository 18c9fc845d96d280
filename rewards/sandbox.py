"""Run untrusted Python in a sandbox: :func:`run_python`.

Each run gets a fresh temporary directory (removed afterwards) and a
separate process tree started by :mod:`hybridflow.rewards.sandbox_launcher`:

* **no network**: a new network namespace (only a downed loopback);
* **nothing outside its directory**: a fresh unprivileged uid that owns
  nothing else (when started as root), private empty tmpfs it cannot
  write over the world-writable ``/tmp``, ``/var/tmp``, ``/dev/shm``,
  ``/run/lock``, its own ``/proc``; its directory is ``/tmp/sandbox``
  (also ``HOME`` and ``TMPDIR``); the interpreter's standard library, no
  site-packages of the trainer's virtualenv;
* **limits** (``setrlimit``): CPU seconds, address space, file size,
  processes (per uid, so a fork bomb stops at ``max_processes``), open
  files, no core dumps; plus a wall-clock timeout after which the whole
  tree is killed (a pid namespace: nothing it forked survives);
* **a scrubbed environment**: ``PATH``, ``HOME``, ``LANG`` and nothing of
  the trainer's (no API keys); ``python -I`` ignores ``PYTHON*`` variables.

Where namespaces cannot be created (not root, user namespaces disabled)
:func:`run_python` raises :class:`SandboxUnavailableError` unless
``allow_unisolated=True``, which keeps only the limits, the scrubbed
environment, the directory and the timeout: no network isolation and no
protection of files the trainer's user can write. A sandbox protects the
trainer; it cannot make a program's self-reported results trustworthy.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from hybridflow.rewards import sandbox_launcher

logger = logging.getLogger(__name__)

_LAUNCHER = os.path.abspath(sandbox_launcher.__file__)


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run."""

    wall_s: float = 10.0
    """Wall-clock seconds before the whole process tree is killed."""
    cpu_s: int = 5
    """CPU seconds (RLIMIT_CPU) of the program's process."""
    memory_mb: int = 512
    """Address space per process (RLIMIT_AS)."""
    file_size_mb: int = 16
    """Largest file the program may write, stdout included (RLIMIT_FSIZE)."""
    max_processes: int = 16
    """Processes and threads of the sandbox's uid (RLIMIT_NPROC)."""
    max_open_files: int = 64
    """Open file descriptors (RLIMIT_NOFILE)."""


@dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed run did. ``returncode`` is 128+N when killed by signal N."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    isolated: bool
    wall_s: float

    @property
    def ok(self) -> bool:
        """Exited with code 0 within the time limit."""
        return self.returncode == 0 and not self.timed_out


class SandboxUnavailableError(RuntimeError):
    """The machine does not allow the namespaces a safe sandbox needs."""


MAX_OUTPUT_BYTES = 1 << 20
"""Most bytes of stdout (and of stderr) read back from a run."""

_SAFE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}


def _read_capped(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        return f.read(MAX_OUTPUT_BYTES).decode("utf-8", errors="replace")


def run_python(
    code: str,
    stdin: str = "",
    *,
    files: Mapping[str, str] | None = None,
    limits: SandboxLimits = SandboxLimits(),
    allow_unisolated: bool = False,
    python: str = sys.executable,
) -> SandboxResult:
    """Run ``code`` as ``main.py`` with ``stdin`` in a fresh sandbox; see the module docstring.

    :param files: more files (name -> text) written next to ``main.py``.
    :param allow_unisolated: run with limits only where namespaces are unavailable.
    :raises SandboxUnavailableError: no namespaces and ``allow_unisolated`` is false.
    """
    work_dir = tempfile.mkdtemp(prefix="hybridflow-sandbox-")
    io_dir = tempfile.mkdtemp(prefix="hybridflow-sandbox-io-")  # 0700, never visible inside
    try:
        for name, text in {"main.py": code, **dict(files or {})}.items():
            if os.path.basename(name) != name:
                raise ValueError(f"sandbox file names must be plain names, got {name!r}")
            with open(os.path.join(work_dir, name), "w", encoding="utf-8") as f:
                f.write(text)
        os.chmod(work_dir, 0o700)
        config = {
            "dir": work_dir,
            "uid": 200_000 + secrets.randbelow(1 << 30),  # owns nothing on this machine
            "limits": asdict(limits),
            "allow_unisolated": allow_unisolated,
            "argv": [python, "-I", "-B", "main.py"],
            # isolated runs reach the interpreter through a bind mount of its prefix
            "python_prefix": sys.base_prefix,
            "python_in_prefix": os.path.relpath(os.path.realpath(python), sys.base_prefix),
            "env": dict(_SAFE_ENV),  # the launcher adds HOME and TMPDIR: the work dir
        }
        return _launch(config, stdin, io_dir, limits.wall_s)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
        shutil.rmtree(io_dir, ignore_errors=True)


def _launch(config: dict, stdin: str, io_dir: str, wall_s: float) -> SandboxResult:
    out_path, err_path = os.path.join(io_dir, "stdout"), os.path.join(io_dir, "stderr")
    start = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", _LAUNCHER, json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=err,
            env=dict(_SAFE_ENV),
            start_new_session=True,
        )
        timed_out = False
        try:
            proc.communicate(stdin.encode("utf-8"), timeout=wall_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            try:  # the launcher's group; its pid namespace dies with it
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
    elapsed = time.monotonic() - start
    stderr = _read_capped(err_path)
    if proc.returncode == sandbox_launcher.EXIT_UNAVAILABLE and sandbox_launcher.UNAVAILABLE_MARK in stderr:
        raise SandboxUnavailableError(stderr.strip().split(": ", 1)[-1])
    isolated = not stderr.startswith(sandbox_launcher.UNISOLATED_MARK)
    if not isolated:
        stderr = stderr[len(sandbox_launcher.UNISOLATED_MARK) + 1 :]
    return SandboxResult(proc.returncode, _read_capped(out_path), stderr, timed_out, isolated, elapsed)

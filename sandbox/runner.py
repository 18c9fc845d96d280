"""Run untrusted Python in a sandbox: :func:`run_python`.

Threat model. The program is an adversary (in RL, a policy paid to find
a way): inside its own interpreter and process tree it can do anything:
rewrite any object (``ctypes`` included), read what it was given (its
directory, stdin, the system's libraries), fork, spin, allocate and write
until a limit stops it. It cannot touch the verifier's process, read the
trainer's files (its checkout, datasets, home directories) or write outside
its directory, reach the network, see or signal other processes, read the
trainer's environment, exceed its limits, or outlive its run. So nothing a
verdict depends on may live inside: callers keep the expected answers in
their own process and treat what the program writes (stdout, the result
channel) as untrusted data, parsed and compared there. What decides a score
is that comparison, never a line the program prints about itself. An
unisolated run (below) keeps only part of these walls.

Each run gets a fresh temporary directory (removed afterwards) and a
separate process tree started by :mod:`hybridflow.sandbox.launcher`:

* **no network**: a new network namespace (only a downed loopback);
* **nothing outside its directory**: a fresh unprivileged uid that owns
  nothing else (when started as root), and a minimal root: a read-only
  tmpfs holding the system's ``/usr``, ``/etc``, ``/bin``, ``/lib``
  (read-only), ``/dev/null`` and its like, the interpreter's prefix at
  its own path (read-only; the standard library, no site-packages of the
  trainer's virtualenv), its own ``/proc`` (its own processes only) and
  its directory, ``/tmp/sandbox`` (also ``HOME`` and ``TMPDIR``). The
  trainer's checkout, datasets, home directories and ``/tmp`` are not in
  it, so it can neither read expected answers from disk nor write anywhere
  but its directory;
* **limits** (``setrlimit``): CPU seconds, address space, file size,
  processes (per uid, so a fork bomb stops at ``max_processes``), open
  files, no core dumps; the memory of the whole tree together
  (:mod:`hybridflow.sandbox.memory`); a wall-clock timeout after
  which the whole tree is killed (a pid namespace: nothing it forked survives);
* **a scrubbed environment**: ``PATH``, ``HOME``, ``LANG`` and nothing of
  the trainer's (no API keys); ``python -I`` ignores ``PYTHON*`` variables;
* **separate outputs**: stdout and stderr go to files the program cannot
  reopen (or to ``/dev/null``), read back up to a cap; with
  ``result_channel=True`` the program also gets :data:`RESULT_FD`, a third
  file, so a harness's report is not lost when the program floods stdout.

Where namespaces cannot be created (not root, user namespaces disabled)
:func:`run_python` raises :class:`SandboxUnavailableError` unless
``allow_unisolated=True``, which keeps only the limits, the scrubbed
environment, the directory and the timeout: no network isolation and no
protection of files the trainer's user can write.
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

from hybridflow.sandbox import launcher as sandbox_launcher
from hybridflow.sandbox.memory import memory_guard

logger = logging.getLogger(__name__)

_LAUNCHER = os.path.abspath(sandbox_launcher.__file__)

RESULT_FD = sandbox_launcher.RESULT_FD
"""The file descriptor of the result channel inside the program (``result_channel=True``)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run."""

    wall_s: float = 10.0
    """Wall-clock seconds before the whole process tree is killed."""
    cpu_s: int = 5
    """CPU seconds (RLIMIT_CPU) of the program's process."""
    memory_mb: int = 512
    """Address space per process (RLIMIT_AS)."""
    total_memory_mb: int = 1024
    """Memory of all the run's processes together (resident pages, plus page cache
    under a cgroup); past it the kernel OOM-kills inside the tree (memory cgroup) or
    the watchdog kills the tree. See :mod:`hybridflow.sandbox.memory`."""
    file_size_mb: int = 16
    """Largest file the program may write, stdout and the result channel included (RLIMIT_FSIZE)."""
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
    results: bytes = b""
    """What the program wrote to :data:`RESULT_FD` (untrusted), at most :data:`MAX_RESULT_BYTES` + 1 bytes."""
    stdout_truncated: bool = False
    """The program wrote more stdout than was read back."""
    memory_peak_mb: float | None = None
    """Peak memory of the whole tree as the guard measured it; None where it cannot tell."""
    memory_exceeded: bool = False
    """The aggregate bound was hit: an OOM kill in the cgroup, or the watchdog killed the tree."""
    memory_guard: str = ""
    """How the aggregate bound was enforced: ``cgroup v1``, ``cgroup v2`` or ``watchdog``."""

    @property
    def ok(self) -> bool:
        """Exited with code 0 within the time limit."""
        return self.returncode == 0 and not self.timed_out


class SandboxUnavailableError(RuntimeError):
    """The machine does not allow the namespaces a safe sandbox needs."""


MAX_OUTPUT_BYTES = 1 << 20
"""Most bytes of stdout (by default) and of stderr read back from a run."""
MAX_RESULT_BYTES = 1 << 20
"""Most bytes of the result channel read back; a longer report is cut and shows as longer than this."""

_SAFE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONHASHSEED": "0",
    "PYTHONDONTWRITEBYTECODE": "1",
}


def _read_capped(path: str, limit: int) -> bytes:
    """Up to ``limit + 1`` bytes of ``path``, so a caller can tell a longer file from one of exactly ``limit``."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        return f.read(limit + 1)


def run_python(
    code: str,
    stdin: str = "",
    *,
    files: Mapping[str, str] | None = None,
    limits: SandboxLimits = SandboxLimits(),
    allow_unisolated: bool = False,
    python: str = sys.executable,
    capture_stdout: bool = True,
    capture_stderr: bool = True,
    stdout_limit: int = MAX_OUTPUT_BYTES,
    result_channel: bool = False,
) -> SandboxResult:
    """Run ``code`` as ``main.py`` with ``stdin`` in a fresh sandbox; see the module docstring.

    :param files: more files (name -> text) written next to ``main.py``.
    :param allow_unisolated: run with limits only where namespaces are unavailable.
    :param capture_stdout: False sends the program's stdout to ``/dev/null`` (a flood costs nothing).
    :param capture_stderr: False sends the program's stderr to ``/dev/null``.
    :param stdout_limit: most bytes of stdout read back (``stdout_truncated`` says when there was more).
    :param result_channel: open :data:`RESULT_FD` in the program, read back into ``results``.
    :raises SandboxUnavailableError: no namespaces and ``allow_unisolated`` is false, or no memory guard.
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
            # isolated runs see the interpreter's prefix (bound at its own path), not the venv
            "python_prefix": sys.base_prefix,
            "python_in_prefix": os.path.relpath(os.path.realpath(python), sys.base_prefix),
            "env": dict(_SAFE_ENV),  # the launcher adds HOME and TMPDIR: the work dir
            "discard_stderr": not capture_stderr,
        }
        return _launch(config, stdin, io_dir, limits, capture_stdout, stdout_limit, result_channel)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
        shutil.rmtree(io_dir, ignore_errors=True)


def _launch(
    config: dict,
    stdin: str,
    io_dir: str,
    limits: SandboxLimits,
    capture_stdout: bool,
    stdout_limit: int,
    result_channel: bool,
) -> SandboxResult:
    out_path, err_path, results_path, status_path = (
        os.path.join(io_dir, name) for name in ("stdout", "stderr", "results", "status")
    )
    guard = memory_guard(limits.total_memory_mb)
    config.update(guard.launcher_config())
    # the launcher's own word (unavailable, unisolated), out of the program's reach: it closes this on execve
    status_fd = os.open(status_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    config["status_fd"], pass_fds = status_fd, (status_fd,)
    if result_channel:  # the launcher moves it to RESULT_FD in the program
        results_fd = os.open(results_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        config["result_fd"], pass_fds = results_fd, (*pass_fds, results_fd)
    start = time.monotonic()
    try:
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", _LAUNCHER, json.dumps(config)],
                stdin=subprocess.PIPE,
                stdout=out if capture_stdout else subprocess.DEVNULL,
                stderr=err,
                env=dict(_SAFE_ENV),
                start_new_session=True,
                pass_fds=pass_fds,
            )
            guard.start(proc.pid)
            timed_out = False
            try:
                proc.communicate(stdin.encode("utf-8"), timeout=limits.wall_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                try:  # the launcher's group; its pid namespace dies with it
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                proc.wait()
    finally:
        for fd in pass_fds:
            os.close(fd)
        guard.finish()
    elapsed = time.monotonic() - start
    stderr = _read_capped(err_path, MAX_OUTPUT_BYTES)[:MAX_OUTPUT_BYTES].decode("utf-8", errors="replace")
    status = _read_capped(status_path, MAX_OUTPUT_BYTES).decode("utf-8", errors="replace")
    if proc.returncode == sandbox_launcher.EXIT_UNAVAILABLE and sandbox_launcher.UNAVAILABLE_MARK in status:
        raise SandboxUnavailableError(status.strip().split(": ", 1)[-1])
    isolated = sandbox_launcher.UNISOLATED_MARK not in status
    stdout = _read_capped(out_path, stdout_limit)
    return SandboxResult(
        proc.returncode,
        stdout[:stdout_limit].decode("utf-8", errors="replace"),
        stderr,
        timed_out,
        isolated,
        elapsed,
        results=_read_capped(results_path, MAX_RESULT_BYTES) if result_channel else b"",
        stdout_truncated=len(stdout) > stdout_limit,
        memory_peak_mb=guard.peak_mb,
        memory_exceeded=guard.exceeded,
        memory_guard=guard.mechanism,
    )

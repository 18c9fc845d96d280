"""``code``: run the response's Python against test cases in a sandbox.

The program is the last fenced code block of the response (```` ```python ````
preferred, then any ```` ``` ````), or the whole response when it has none.
The ground truth (a JSON string or a dict) holds the tests, in one of two
forms:

* ``{"inputs": [...], "outputs": [...]}``: stdin/stdout cases; each runs the
  program in its own sandbox and this process compares its stdout with the
  expected output (trailing whitespace of each line and trailing blank lines
  ignored). stderr is not read (sent to ``/dev/null``, so a flood there costs
  nothing). Up to ``max(1 MiB, 2 x expected + 64 KiB)`` of stdout is read
  back; a program that prints more fails its case, even if the extra is
  whitespace;
* ``{"asserts": ["assert f(1) == 2", ...]}``: each assert is split in this
  process into a call (``f(1)``), which the sandbox evaluates after running
  the program, and an expected value (``2``), which never leaves this
  process; the sandbox reports the calls' values as built-in data on a
  channel of their own (not stdout, which is discarded) and this process
  compares them. Supported forms: :mod:`hybridflow.rewards.code_asserts`;
  the harness: :mod:`hybridflow.rewards.code_harness`.

Score 1.0 when every case passes (io cases checked in order, stopping at the
first failure), else 0.0. A program cannot report its own success: the
verdict is made here, from outputs read as untrusted data (the threat model
is in :mod:`hybridflow.sandbox.runner`). Every run uses
:func:`hybridflow.sandbox.runner.run_python`: hostile programs (infinite
loops, fork bombs, huge allocations, writes outside the sandbox, reading the
environment, sockets) fail their case and leave the caller untouched. The
reward pool's ``timeout_s`` must cover up to ``max_tests`` runs of
``timeout_s`` each (one run for all the asserts).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from hybridflow.plugins import RewardVerifier, hookimpl
from hybridflow.rewards import code_harness
from hybridflow.rewards.code_asserts import Verdict, judge, plan_asserts
from hybridflow.sandbox.runner import MAX_OUTPUT_BYTES, MAX_RESULT_BYTES, SandboxLimits, run_python

logger = logging.getLogger(__name__)

_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)


@functools.lru_cache(maxsize=1)
def _harness_source() -> str:
    with open(code_harness.__file__, encoding="utf-8") as f:
        return f.read()


def extract_code(response: str) -> str:
    """The last ```python block of ``response``, else its last ``` block, else all of it."""
    blocks = _FENCE.findall(response)
    python_blocks = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    if python_blocks:
        return python_blocks[-1]
    return blocks[-1][1] if blocks else response


def _normalize_output(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()).rstrip()


def _load_tests(ground_truth: Any) -> Mapping[str, Any]:
    tests = json.loads(ground_truth) if isinstance(ground_truth, (str, bytes)) else ground_truth
    if not isinstance(tests, Mapping) or not ({"inputs", "outputs"} <= tests.keys() or "asserts" in tests):
        raise ValueError("code ground truth must be JSON with 'inputs' and 'outputs', or with 'asserts'")
    if not (tests.get("asserts") or tests.get("inputs")):
        raise ValueError("code ground truth has no test cases")
    return tests


def run_io_tests(
    code: str, inputs: Sequence[str], outputs: Sequence[str], limits: SandboxLimits, allow_unisolated: bool
) -> bool:
    """Whether ``code`` prints each expected output for its input (stops at the first failure)."""
    if len(inputs) != len(outputs):
        raise ValueError(f"code ground truth has {len(inputs)} inputs but {len(outputs)} outputs")
    for stdin, expected in zip(inputs, outputs):
        expected = str(expected)
        # room for the expected output with generous whitespace; a case whose expected
        # output is larger than the file-size limit gets that limit raised to fit
        stdout_limit = max(MAX_OUTPUT_BYTES, 2 * len(expected.encode("utf-8")) + (64 << 10))
        case_limits = dataclasses.replace(limits, file_size_mb=max(limits.file_size_mb, (stdout_limit >> 20) + 1))
        result = run_python(
            code,
            str(stdin),
            limits=case_limits,
            allow_unisolated=allow_unisolated,
            capture_stderr=False,
            stdout_limit=stdout_limit,
        )
        if not result.ok or result.stdout_truncated or _normalize_output(result.stdout) != _normalize_output(expected):
            return False
    return True


def run_assert_tests(code: str, asserts: Sequence[str], limits: SandboxLimits, allow_unisolated: bool) -> Verdict:
    """Run ``code`` and the asserts' calls in one sandbox; judge the reported values here."""
    plan = plan_asserts(asserts)  # before the sandbox: a bad ground truth raises, whatever the response
    result = run_python(
        _harness_source(),
        json.dumps(plan.steps),
        files={"solution.py": code},
        limits=limits,
        allow_unisolated=allow_unisolated,
        capture_stdout=False,
        capture_stderr=False,
        result_channel=True,
    )
    if not result.ok:
        return Verdict(False, "timed out" if result.timed_out else f"exit code {result.returncode}")
    if len(result.results) > MAX_RESULT_BYTES:
        return Verdict(False, f"a report over {MAX_RESULT_BYTES} bytes")
    return judge(plan, result.results)


def code_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    timeout_s: float = 5.0,
    cpu_s: int = 3,
    memory_mb: int = 512,
    max_tests: int = 10,
    allow_unisolated: bool = False,
    total_memory_mb: int = 1024,
) -> float:
    """1.0 when the response's program passes every test case in the sandbox, else 0.0.

    ``timeout_s``, ``cpu_s`` and ``memory_mb`` (per process) limit each
    sandboxed run, ``total_memory_mb`` all its processes together; only the
    first ``max_tests`` cases are run; ``allow_unisolated`` runs without
    namespaces where the machine has none (see
    :mod:`hybridflow.sandbox.runner`), otherwise that raises. A ground truth
    with an assert form :mod:`~hybridflow.rewards.code_asserts` cannot judge
    safely raises ValueError.
    """
    tests = _load_tests(ground_truth)
    code = extract_code(solution_str)
    limits = SandboxLimits(wall_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, total_memory_mb=total_memory_mb)
    if "asserts" in tests:
        verdict = run_assert_tests(code, list(tests["asserts"])[:max_tests], limits, allow_unisolated)
        logger.debug("code asserts: %s", verdict.reason or "passed")
        passed = verdict.passed
    else:
        inputs, outputs = list(tests["inputs"])[:max_tests], list(tests["outputs"])[:max_tests]
        passed = run_io_tests(code, inputs, outputs, limits, allow_unisolated)
    return 1.0 if passed else 0.0


@hookimpl
def hybridflow_register_reward_verifiers(register):
    register(RewardVerifier(name="code", fn=code_score))

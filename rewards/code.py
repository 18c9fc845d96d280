"""``code``: run the response's Python against test cases in a sandbox.

The program is the last fenced code block of the response (```` ```python ````
preferred, then any ```` ``` ````), or the whole response when it has none.
The ground truth (a JSON string or a dict) holds the tests, in one of two
forms:

* ``{"inputs": [...], "outputs": [...]}``: stdin/stdout cases; each runs the
  program in its own sandbox and compares stdout with the expected output
  (trailing whitespace of each line and trailing blank lines ignored);
* ``{"asserts": ["assert f(1) == 2", ...]}``: the program is executed, then
  each statement; a harness reports how many passed, tagged with a random
  token it read from stdin, so a program that exits early (``sys.exit(0)``,
  ``os._exit(0)``) passes nothing.

Score 1.0 when every case passes (checked in order, stopping at the first
failure), else 0.0. Every run uses :func:`hybridflow.rewards.sandbox.run_python`:
hostile programs (infinite loops, fork bombs, huge allocations, writes
outside the sandbox, reading the environment, sockets) fail their case and
leave the caller untouched. The reward pool's ``timeout_s`` must cover up to
``max_tests`` runs of ``timeout_s`` each.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from hybridflow.plugins import RewardVerifier, hookimpl
from hybridflow.rewards.sandbox import SandboxLimits, run_python

_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)

_ASSERT_HARNESS = """\
import sys
_token = sys.stdin.readline().strip()
_tests = {tests!r}
_namespace = {{"__name__": "__main__"}}
_passed = 0
try:
    with open("solution.py", encoding="utf-8") as _f:
        exec(compile(_f.read(), "solution.py", "exec"), _namespace)
    for _test in _tests:
        exec(compile(_test, "<test>", "exec"), _namespace)
        _passed += 1
except BaseException:
    pass
sys.stdout.write("\\n" + _token + " " + str(_passed) + "\\n")
"""


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
        result = run_python(code, str(stdin), limits=limits, allow_unisolated=allow_unisolated)
        if not result.ok or _normalize_output(result.stdout) != _normalize_output(str(expected)):
            return False
    return True


def run_assert_tests(code: str, asserts: Sequence[str], limits: SandboxLimits, allow_unisolated: bool) -> bool:
    """Whether ``code`` followed by each assert statement runs without an exception."""
    token = secrets.token_hex(16)
    harness = _ASSERT_HARNESS.format(tests=list(asserts))
    result = run_python(harness, token + "\n", files={"solution.py": code}, limits=limits, allow_unisolated=allow_unisolated)
    lines = result.stdout.rstrip("\n").splitlines()
    return result.ok and bool(lines) and lines[-1] == f"{token} {len(asserts)}"


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
) -> float:
    """1.0 when the response's program passes every test case in the sandbox, else 0.0.

    ``timeout_s``, ``cpu_s`` and ``memory_mb`` limit each sandboxed run;
    only the first ``max_tests`` cases are run; ``allow_unisolated`` runs
    without namespaces where the machine has none (see
    :mod:`hybridflow.rewards.sandbox`), otherwise that raises.
    """
    tests = _load_tests(ground_truth)
    code = extract_code(solution_str)
    limits = SandboxLimits(wall_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb)
    if "asserts" in tests:
        passed = run_assert_tests(code, list(tests["asserts"])[:max_tests], limits, allow_unisolated)
    else:
        inputs, outputs = list(tests["inputs"])[:max_tests], list(tests["outputs"])[:max_tests]
        passed = run_io_tests(code, inputs, outputs, limits, allow_unisolated)
    return 1.0 if passed else 0.0


@hookimpl
def hybridflow_register_reward_verifiers(register):
    register(RewardVerifier(name="code", fn=code_score))

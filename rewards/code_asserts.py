"""The ``asserts`` tests of the ``code`` verifier, split and judged outside the sandbox.

Each ground-truth assert is split here, in the verifier's process, into what
the sandbox evaluates, a *call* (the expression whose value the test checks),
and what only this process holds, the *expected* side (a literal, read with
:func:`ast.literal_eval` and never sent). The sandbox reports each call's
value as built-in data (:mod:`hybridflow.rewards.code_harness`); this process
decodes that untrusted report and makes every comparison. A solution that
takes over its interpreter, returns objects equal to everything, or writes a
report of its own gains nothing: it would have to produce the expected values
without ever seeing them.

Supported forms (anything else raises ValueError naming the test):

=============================================  =============================================
``assert CALL == LIT``, also ``!=`` ``<``      the comparison, made here; ``LIT`` on either
``<=`` ``>`` ``>=`` ``in`` ``not in`` ``is``   side, and chains such as ``0 < CALL < 9``
``is not``
``assert abs(CALL - LIT) < LIT`` (or ``<=``)   the distance, computed here
``assert math.isclose(CALL, LIT, rel_tol=L)``  :func:`math.isclose` here (bare ``isclose`` too)
``assert CALL``, ``assert not CALL``           the truth of the reported value, here
``assert A and B``                             both, each one of these forms
``import m``, ``x = CALL``, a bare ``CALL``    setup, run in the sandbox in order; its names
                                               serve later calls (``assert x == 3``)
=============================================  =============================================

``LIT`` is anything :func:`ast.literal_eval` reads. A ``CALL`` (and a setup
statement) may not contain a comparison, ``and``/``or``/``not``, a
conditional expression or a comprehension filter: the sandbox would decide
those with the solution's objects (``f(1) == g(2)`` asks the result's
``__eq__``). Literals inside a call reach the sandbox as inputs, so a test
that hides its expected value there (``assert f(1) - 2 == 0``) lets a result
object see it; write ``assert f(1) == 2``. The assert's message is ignored.
A value counts only as built-in data: ``None``, bool, int, float, complex,
str, bytes, tuple, list, set, frozenset, dict (subclasses read as their base
type, so a namedtuple or a ``Counter`` compares as Python would compare it).
"""

from __future__ import annotations

import ast
import json
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

_OPS = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_SETUP = (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Expr)
_MAX_DEPTH = 200
_MAX_SAME_HASH = 32
"""Most elements of one decoded set (or keys of a dict) that may share a hash: ints that all hash alike
(multiples of 2**61 - 1) make building a set quadratic, 5.9 s for a 1 MiB report; a set the harness
encodes has distinct elements, which share a hash only by rare coincidence."""


@dataclass(frozen=True)
class Check:
    """One verdict, made in the verifier: ``holds(value)`` of the value reported for step ``step``."""

    test: str
    step: int
    holds: Callable[[Any], bool]


@dataclass(frozen=True)
class AssertPlan:
    """What the sandbox runs (``steps``: ``["exec" | "eval", source]``) and what stays here (``checks``)."""

    steps: list[list[str]]
    checks: list[Check]


@dataclass(frozen=True)
class Verdict:
    """Whether a solution passed every assert, judged in the verifier's process."""

    passed: bool
    reason: str = ""
    """Why it failed: the first failing test or the broken part of the report."""


def _unsupported(test: str, why: str) -> ValueError:
    return ValueError(
        f"code ground truth: {test!r} is not a supported assert ({why}); see hybridflow.rewards.code_asserts"
    )


def _literal(node: ast.AST) -> tuple[bool, Any]:
    """``(True, value)`` for a literal, ``(False, None)`` for anything the solution computes."""
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _distance(node: ast.expr) -> tuple[ast.expr, Callable[[Any], Any]]:
    """``abs(CALL - LIT)`` -> (``CALL``, the distance computed here); anything else unchanged."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "abs" and len(node.args) == 1:
        inner = node.args[0]
        if isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Sub) and not node.keywords:
            (left_is_literal, left), (right_is_literal, right) = _literal(inner.left), _literal(inner.right)
            if right_is_literal and not left_is_literal:
                return inner.left, lambda value: abs(value - right)
            if left_is_literal and not right_is_literal:
                return inner.right, lambda value: abs(left - value)
    return node, lambda value: value


def _split_compare(node: ast.Compare, test: str) -> tuple[ast.expr, Callable[[Any], bool]]:
    operands = [node.left, *node.comparators]
    literals = [_literal(operand) for operand in operands]
    values = [value for _, value in literals]
    computed = [i for i, (is_literal, _) in enumerate(literals) if not is_literal]
    if len(computed) != 1:
        raise _unsupported(test, "a comparison needs exactly one computed side, the others literals")
    (at,) = computed
    call, transform = _distance(operands[at])
    ops = [_OPS[type(op)] for op in node.ops]

    def holds(value: Any) -> bool:
        chain = [*values[:at], transform(value), *values[at + 1 :]]
        return all(op(a, b) for op, a, b in zip(ops, chain, chain[1:]))

    return call, holds


def _split_isclose(node: ast.Call, test: str) -> tuple[ast.expr, Callable[[Any], bool]]:
    tolerances = {keyword.arg: _literal(keyword.value) for keyword in node.keywords}
    arguments = [_literal(arg) for arg in node.args]
    computed = [i for i, (is_literal, _) in enumerate(arguments) if not is_literal]
    if (
        len(arguments) != 2
        or len(computed) != 1
        or not set(tolerances) <= {"rel_tol", "abs_tol"}
        or not all(is_literal for is_literal, _ in tolerances.values())
    ):
        raise _unsupported(test, "isclose needs one computed argument, one literal and literal tolerances")
    (at,) = computed
    _, expected = arguments[1 - at]
    options = {name: value for name, (_, value) in tolerances.items()}
    return node.args[at], lambda value: math.isclose(value, expected, **options)


def _is_isclose(node: ast.expr) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Name):
        return func.id == "isclose"
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "isclose"
        and isinstance(func.value, ast.Name)
        and func.value.id == "math"
    )


def _split(node: ast.expr, test: str) -> list[tuple[ast.expr, Callable[[Any], bool]]]:
    """The (call, check made here) pairs an assert's condition stands for."""
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
        return [pair for value in node.values for pair in _split(value, test)]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = _split(node.operand, test)
        if len(inner) != 1:
            raise _unsupported(test, "'not' over 'and'")
        ((call, holds),) = inner
        return [(call, lambda value: not holds(value))]
    if isinstance(node, ast.Compare):
        return [_split_compare(node, test)]
    if _is_isclose(node):
        return [_split_isclose(node, test)]
    if _literal(node)[0]:
        raise _unsupported(test, "it asserts a literal, nothing the solution computes")
    return [(node, bool)]


def _require_no_decisions(node: ast.AST, test: str) -> None:
    for sub in ast.walk(node):
        if (
            isinstance(sub, (ast.Compare, ast.BoolOp, ast.IfExp))
            or (isinstance(sub, ast.UnaryOp) and isinstance(sub.op, ast.Not))
            or (isinstance(sub, ast.comprehension) and sub.ifs)
        ):
            raise _unsupported(
                test, f"{ast.unparse(sub)!r} would be decided inside the sandbox by the solution's objects"
            )


def plan_asserts(tests: Sequence[str]) -> AssertPlan:
    """Split ground-truth asserts into the sandbox's steps and the checks this process keeps."""
    steps: list[list[str]] = []
    checks: list[Check] = []
    for test in tests:
        try:
            body = ast.parse(str(test)).body
        except SyntaxError as exc:
            raise ValueError(f"code ground truth: cannot parse {test!r}: {exc}") from exc
        for statement in body:
            if isinstance(statement, ast.Assert):
                for call, holds in _split(statement.test, test):
                    _require_no_decisions(call, test)
                    steps.append(["eval", ast.unparse(call)])
                    checks.append(Check(test, len(steps) - 1, holds))
            elif isinstance(statement, _SETUP):
                _require_no_decisions(statement, test)
                steps.append(["exec", ast.unparse(statement)])
            else:
                raise _unsupported(test, f"a {type(statement).__name__} statement; asserts must be top-level")
    if not checks:
        raise ValueError("code ground truth has no assert to check")
    return AssertPlan(steps, checks)


def decode(tree: Any, depth: int = 0) -> Any:
    """A value from the harness's ``[type, data]`` tree; untrusted, so anything malformed raises
    (ValueError, or TypeError for an unhashable set element or dict key)."""
    if depth > _MAX_DEPTH or not isinstance(tree, list) or not tree or not isinstance(tree[0], str):
        raise ValueError("not a value tree")
    kind, data = tree[0], tree[1:]
    if kind == "none" and not data:
        return None
    if len(data) != 1:
        raise ValueError(f"malformed {kind!r}")
    (data,) = data
    if kind == "bool" and isinstance(data, bool):
        return data
    if kind in ("int", "float", "str", "bytes") and isinstance(data, str):
        return {"int": lambda s: int(s, 16), "float": float, "str": str, "bytes": bytes.fromhex}[kind](data)
    if kind == "complex" and isinstance(data, list) and len(data) == 2 and all(isinstance(part, str) for part in data):
        return complex(float(data[0]), float(data[1]))
    if kind in ("tuple", "list") and isinstance(data, list):
        return {"tuple": tuple, "list": list}[kind](decode(item, depth + 1) for item in data)
    if kind in ("set", "frozenset") and isinstance(data, list):
        return {"set": set, "frozenset": frozenset}[kind](_spread([decode(item, depth + 1) for item in data]))
    if kind == "dict" and isinstance(data, list) and all(isinstance(pair, list) and len(pair) == 2 for pair in data):
        keys = _spread([decode(key, depth + 1) for key, _ in data])
        return dict(zip(keys, (decode(value, depth + 1) for _, value in data)))
    raise ValueError(f"not a value: {kind!r}")


def _spread(items: list[Any]) -> list[Any]:
    """``items``, to become a set or dict keys, if no more than :data:`_MAX_SAME_HASH` share a hash (linear: the
    hashes are counted in a dict keyed by the hash values, which hash as themselves); ValueError otherwise."""
    counts: dict[int, int] = {}
    for item in items:
        h = hash(item)  # TypeError for an unhashable element, as set() would raise
        counts[h] = counts.get(h, 0) + 1
        if counts[h] > _MAX_SAME_HASH:
            raise ValueError("a set or dict whose elements hash alike (a forged report)")
    return items


def judge(plan: AssertPlan, report: bytes) -> Verdict:
    """Whether the sandbox's (untrusted) report shows every step ran and every check holds."""
    try:
        outcomes = json.loads(report.decode("utf-8"))
    except (ValueError, RecursionError):
        return Verdict(False, "the report is not JSON")
    if not isinstance(outcomes, list) or not outcomes:
        return Verdict(False, "the report is not a list of outcomes")
    if outcomes[0] != ["ok", None]:
        return Verdict(False, f"the solution did not run: {str(outcomes[0])[:200]}")
    if len(outcomes) != 1 + len(plan.steps):
        return Verdict(False, f"the report has {len(outcomes) - 1} outcomes for {len(plan.steps)} steps")
    for (kind, source), outcome in zip(plan.steps, outcomes[1:]):
        if kind == "exec":
            ran = outcome == ["ok", None]
        else:
            ran = isinstance(outcome, list) and len(outcome) == 2 and outcome[0] == "value"
        if not ran:
            return Verdict(False, f"{source!r}: {str(outcome)[:200]}")
    for check in plan.checks:
        try:
            holds = bool(check.holds(decode(outcomes[1 + check.step][1])))  # built-in data only: no foreign __bool__
        except Exception:  # noqa: BLE001 - malformed values, and comparisons Python refuses (1 < "a")
            holds = False
        if not holds:
            return Verdict(False, f"{check.test!r} does not hold")
    return Verdict(True)

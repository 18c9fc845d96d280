"""Tool ``calculator``: evaluate an arithmetic expression, safely.

The expression is parsed with :mod:`ast` and only numbers, ``+ - * / // %
**`` and parentheses are evaluated (no names, calls or attributes), with
bounds that keep a hostile expression cheap: at most 200 characters,
exponents up to 64, and every number, literals and results alike, finite
and at most 10**100 in magnitude (``1e999`` is an error, not ``inf``).
Integers stay exact; a float result is shown with up to 12 significant digits.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Mapping
from typing import Any

from hybridflow.plugins import Tool, hookimpl

__all__ = ["evaluate"]

_MAX_CHARS, _MAX_EXPONENT, _MAX_MAGNITUDE = 200, 64, 10**100
_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def evaluate(expression: str) -> int | float:
    """The value of ``expression``; ValueError (with the reason) for anything but bounded arithmetic."""
    if len(expression) > _MAX_CHARS:
        raise ValueError(f"expression longer than {_MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {exc.msg}") from None
    return _eval(tree.body)


def _bounded(value: int | float) -> int | float:
    """``value`` if it is a finite number within the bound; ValueError otherwise."""
    if isinstance(value, complex):
        raise ValueError("not a real number")
    bound = float(_MAX_MAGNITUDE) if isinstance(value, float) else _MAX_MAGNITUDE  # 1e100 is a hair above 10**100
    if abs(value) > bound or (isinstance(value, float) and math.isnan(value)):
        raise ValueError("number out of range (at most 10**100 in magnitude)")
    return value


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ValueError(f"exponent larger than {_MAX_EXPONENT}")
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
        return _bounded(value)
    raise ValueError(f"only numbers and + - * / // % ** ( ) are allowed, not {type(node).__name__}")


def calculator(arguments: Mapping[str, Any], state: Mapping[str, Any]) -> str:
    """Evaluate an arithmetic expression (numbers, + - * / // % **, parentheses)."""
    try:
        value = evaluate(arguments["expression"])
    except ValueError as exc:
        return f"error: {exc}"
    return str(value) if isinstance(value, int) else f"{value:.12g}"


@hookimpl
def hybridflow_register_tools(register):
    register(
        Tool(
            name="calculator",
            fn=calculator,
            description="Evaluate an arithmetic expression such as (2+3)*4.",
            parameters={"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
        )
    )

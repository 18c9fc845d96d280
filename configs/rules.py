"""Small checks the config dataclasses use in their ``problems()`` methods.

Each returns a list of messages, one per broken rule, that start with the
field's name and its value (``lr=-0.1 must be > 0``); the config check
prefixes the section's dotted path, so the user reads the whole key. A
section's rules live in its own dataclass in ``schema.py``, right under its
fields; rules that span sections live in ``trainer/config_checks.py`` and
``core/parallel_dims.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def greater_than(obj: Any, bound: float, *names: str, optional: bool = False) -> list[str]:
    """Fields that are not numbers strictly above ``bound`` (``optional``: None is allowed too)."""
    return [
        f"{n}={getattr(obj, n)!r} must be > {bound}" + (" or null" if optional else "")
        for n in names
        if not (optional and getattr(obj, n) is None) and not _number_above(getattr(obj, n), bound, True)
    ]


def at_least(obj: Any, bound: float, *names: str, optional: bool = False) -> list[str]:
    """Fields that are not numbers >= ``bound`` (``optional``: None is allowed too)."""
    out = []
    for n in names:
        value = getattr(obj, n)
        if optional and value is None:
            continue
        if not _number_above(value, bound, False):
            out.append(f"{n}={value!r} must be >= {bound}" + (" or null" if optional else ""))
    return out


def within(
    obj: Any, name: str, low: float, high: float, *, low_open: bool = False, high_open: bool = False
) -> list[str]:
    """The field when it is outside the interval (``low_open`` / ``high_open`` exclude the ends)."""
    value = getattr(obj, name)
    ok = isinstance(value, (int, float)) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if ok:
        return []
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    return [f"{name}={value!r} must be in {interval}"]


def one_of(obj: Any, name: str, allowed: Iterable[str]) -> list[str]:
    """The field when it is not one of ``allowed``."""
    allowed = tuple(allowed)
    value = getattr(obj, name)
    return [] if value in allowed else [f"{name}={value!r}; allowed: {', '.join(allowed)}"]


def _number_above(value: Any, bound: float, strict: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return value > bound if strict else value >= bound

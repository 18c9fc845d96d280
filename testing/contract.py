"""What the three checks share: finding the plugin, running its properties, saying what broke.

A check is a list of named properties. Each property is a function that
raises ``AssertionError`` naming the input and the numbers when the plugin
breaks it; :func:`run_properties` runs them all (one failure does not hide
the next) and raises one ``AssertionError`` listing every broken property,
or returns a :class:`ContractReport` of what was checked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from hybridflow.plugins.entries import PluginEntry

Entry = TypeVar("Entry", bound=PluginEntry)


@dataclass(frozen=True)
class ContractReport:
    """What a check did: the properties it checked (all held) and those declared not to hold, with why."""

    subject: str
    checked: tuple[str, ...]
    not_expected: tuple[str, ...]


def resolve(entry_or_name: Any, entry_type: type[Entry], lookup: Callable[[str], Entry]) -> Entry:
    """The record itself, or the one registered under that name (an unknown name raises the manager's error)."""
    if isinstance(entry_or_name, entry_type):
        return entry_or_name
    if isinstance(entry_or_name, str):
        return lookup(entry_or_name)
    raise TypeError(f"expected a {entry_type.__name__} or its registered name, got {type(entry_or_name).__name__}")


def checked_options(entry: PluginEntry, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``options`` as a dict; one the plugin does not have is a ``TypeError`` (a mistake of the caller, not the
    plugin)."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(entry.options))
    if unknown:
        raise TypeError(
            f"{entry.kind} {entry.name!r} has no option(s) {unknown}; its options are {entry.options or '{}'}"
        )
    return options


def run_properties(
    subject: str, properties: list[tuple[str, Callable[[], None]]], not_expected: Mapping[str, str]
) -> ContractReport:
    """Run every property; raise one ``AssertionError`` listing each that failed, with its message."""
    failures = []
    for name, check in properties:
        try:
            check()
        except AssertionError as exc:
            failures.append(f"- {name}: {exc}")
    if failures:
        raise AssertionError(
            f"{subject} breaks {len(failures)} contract propert{'y' if len(failures) == 1 else 'ies'}:\n"
            + "\n".join(failures)
        )
    return ContractReport(
        subject, tuple(name for name, _ in properties), tuple(f"{k} ({v})" for k, v in not_expected.items())
    )


def call(label: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``; an exception from the plugin becomes an ``AssertionError`` naming the input."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        raise AssertionError(f"on {label}: raised {type(exc).__name__}: {exc}") from exc


def mismatch(got: torch.Tensor, expected: torch.Tensor, *, atol: float, rtol: float = 0.0) -> str | None:
    """None when ``got`` matches ``expected`` elementwise; else where and by how much it differs most."""
    bad = ~torch.isclose(got, expected, atol=atol, rtol=rtol)
    if not bad.any():
        return None
    worst = torch.where(bad, (got - expected).abs(), torch.zeros_like(got)).nan_to_num(nan=float("inf"))
    at = tuple(int(i) for i in torch.unravel_index(worst.argmax(), worst.shape))
    return (
        f"{int(bad.sum())} of {bad.numel()} entries differ (atol {atol:g}, rtol {rtol:g}); worst at {list(at)}: "
        f"got {float(got[at]):.6g}, expected {float(expected[at]):.6g}"
    )


def not_finite(x: torch.Tensor) -> str | None:
    """None when every entry is finite; else how many are not and where the first is."""
    bad = ~torch.isfinite(x)
    if not bad.any():
        return None
    first = [int(i) for i in bad.nonzero()[0]]
    return f"{int(bad.sum())} of {bad.numel()} entries are not finite; the first at {first} is {float(x[tuple(first)])}"

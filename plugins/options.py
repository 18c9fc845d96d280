"""What may be given for a plugin's options: the config check of every ``*_options`` key.

A plugin's options are its function's keyword-only parameters with defaults
(:func:`hybridflow.plugins.entries.keyword_options`); a value given in the
config must be one of those names and of its default's type.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def option_problems(key: str, given: Mapping[str, Any], defaults: Mapping[str, Any], owner: str) -> list[str]:
    """What is wrong with the options ``given`` under config ``key`` for ``owner`` (e.g. ``"policy loss 'vanilla'"``),
    whose options and defaults are ``defaults`` (a plugin's ``.options``), one message each.

    Names must be among ``defaults``; a value must be of its default's type: a float default takes an int or a
    float, an int default an int, a bool default a bool, a str default a str (never a bool for a number);
    a None default takes anything.
    """
    unknown = sorted(set(given) - set(defaults))
    problems = [f"{key} has {unknown}; {owner} takes {dict(defaults)}"] if unknown else []
    for name, value in given.items():
        if name in defaults and not _fits(defaults[name], value):
            problems.append(
                f"{key}.{name}={value!r} is {_kind(value)}; {owner} takes {_kind(defaults[name])} there "
                f"(default {defaults[name]!r})"
            )
    return problems


def _fits(default: Any, value: Any) -> bool:
    """Whether ``value`` may stand where an option's ``default`` does (see :func:`option_problems`)."""
    if default is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple))
    if isinstance(default, Mapping):
        return isinstance(value, Mapping)
    return isinstance(value, type(default))


def _kind(value: Any) -> str:
    """What a reader calls a value's type: ``a number``, ``an integer``, ``text``, ..."""
    kinds = [
        (bool, "true or false"),
        (int, "an integer"),
        (float, "a number"),
        (str, "text"),
        ((list, tuple), "a list"),
        (Mapping, "a mapping"),
        (type(None), "null"),
    ]
    return next((text for types, text in kinds if isinstance(value, types)), f"a {type(value).__name__}")

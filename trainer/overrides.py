"""Command-line overrides checked against the schema before Hydra composes them.

Hydra rejects a misspelt key too, but with seven lines that end in advice
that would not work here (``+key=...`` on a strict schema). This check reads
the overrides the way Hydra does (its own parser) and answers in one line
per problem: an unknown key with the closest keys that exist (or, for a
veRL key or a TRL ``GRPOConfig`` argument, the key that does the same here:
``trainer/foreign_keys.py``), an unknown config group option with the options
there are, a value of the wrong type with the type. Anything it does not
understand (Hydra's own flags, ``hydra.*`` keys, interpolations) it leaves to
Hydra, but still explains the veRL and TRL names among them (``--learning_rate 1e-6``).
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser

from hybridflow.configs import CONFIG_DIR
from hybridflow.configs.schema import PPOConfig
from hybridflow.trainer.foreign_keys import argv_problems, explain

_FLAGS_WITHOUT_VALUE = ("--multirun", "-m")


def schema_keys(root: type = PPOConfig) -> dict[str, Any]:
    """Dotted key -> the field's type, for every key of the schema (sections included)."""
    hints_of = {}
    keys: dict[str, Any] = {}

    def visit(cls: type, prefix: str) -> None:
        hints = hints_of.setdefault(cls, typing.get_type_hints(cls))
        for f in dataclasses.fields(cls):
            key = f"{prefix}{f.name}"
            keys[key] = hints[f.name]
            if dataclasses.is_dataclass(hints[f.name]):
                visit(hints[f.name], key + ".")

    visit(root, "")
    return keys


def group_options(config_dir: str = CONFIG_DIR) -> dict[str, list[str]]:
    """Config group (a folder beside ppo_trainer.yaml) -> its options (the YAML files' names)."""
    return {d.name: sorted(p.stem for p in d.glob("*.yaml")) for d in sorted(Path(config_dir).iterdir()) if d.is_dir()}


def override_problems(args: list[str]) -> list[str]:
    """One message per override in ``args`` (``sys.argv[1:]``) that cannot work; empty when all can, or when
    ``args`` use Hydra flags this check does not model (then Hydra speaks, unless an argument is a veRL or TRL name)."""
    if any(a.startswith("-") and a not in _FLAGS_WITHOUT_VALUE for a in args):
        return argv_problems(args)
    texts = [a for a in args if not a.startswith("-")]
    try:
        overrides = OverridesParser.create().parse_overrides(texts)
    except Exception:  # noqa: BLE001 - a syntax error: Hydra's own message says where
        return []
    keys, groups = schema_keys(), group_options()
    problems = []
    for o, text in zip(overrides, texts):
        name = o.key_or_group
        if name.split(".")[0].split("/")[0] == "hydra" or o.is_delete():  # hydra.* keys, hydra/launcher=... groups
            continue
        if name in groups and "." not in name:
            problems += _group_problem(o, groups[name])
        elif name not in keys:
            problems += _unknown_key(o, keys, text.partition("=")[2])
        elif not o.is_sweep_override():
            problems += _type_problem(o.get_key_element().lstrip("+~"), keys[name], o.value())
    return problems


def _group_problem(o: Any, options: list[str]) -> list[str]:
    values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.value()]
    bad = [v for v in values if v is not None and str(v) not in options]
    return [f"{o.get_key_element()}={v}: no such option of config group {o.key_or_group!r}; options: {', '.join(options)}"
            for v in bad]


def _unknown_key(o: Any, keys: dict[str, Any], value: str) -> list[str]:
    foreign = explain(o.key_or_group, value)
    if foreign is not None:
        return [foreign]
    parent = o.key_or_group.rsplit(".", 1)[0]
    while parent and parent not in keys:
        parent = parent.rsplit(".", 1)[0] if "." in parent else ""
    if parent and _is_mapping(keys[parent]):
        return []  # a key inside a dict-valued field (reward.route.x): Hydra checks the '+'
    close = difflib.get_close_matches(o.key_or_group, list(keys), n=3, cutoff=0.75)
    hint = f"; did you mean {' or '.join(close)}?" if close else "; docs/config.md lists every key"
    return [f"{o.get_key_element()}: no such key{hint}"]


def _type_problem(key: str, hint: Any, value: Any) -> list[str]:
    """Values Hydra would refuse to convert to the field's type."""
    allowed, optional = _base_types(hint)
    if value is None:
        return [] if optional else [f"{key}=null: this key needs a value ({_type_name(allowed)})"]
    if isinstance(value, str) and "${" in value:
        return []  # an interpolation: resolved later
    ok = {
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        bool: isinstance(value, bool),
    }
    if allowed in ok and not ok[allowed]:
        return [f"{key}={value!r} must be {_type_name(allowed)}"]
    return []


def _base_types(hint: Any) -> tuple[Any, bool]:
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Union and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else hint), True
    return hint, False


def _is_mapping(hint: Any) -> bool:
    base, _ = _base_types(hint)
    return typing.get_origin(base) is dict or base is dict


def _type_name(t: Any) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "text"}.get(t, str(t))

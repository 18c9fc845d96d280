"""Command-line overrides checked against the schema before Hydra composes them.

Hydra rejects a misspelt key too, but with seven lines that end in advice
that would not work here (``+key=...`` on a strict schema). This check reads
the overrides the way Hydra does (its own parser) and answers in one line
per problem: an unknown key with the closest keys that exist (or, for a
veRL key or a TRL ``GRPOConfig`` argument, the key that does the same here:
``configs/foreign_keys.py``), an unknown config group option with the options
there are, a value of the wrong type with the type. Anything it does not
understand (Hydra's own flags, ``hydra.*`` keys, interpolations) it leaves to
Hydra, but still explains the veRL and TRL names among them (``--learning_rate 1e-6``).

Before that check, :func:`translate` rewrites a veRL command line as veRL's
users write it: a plain string where a list is expected is a one-item list
(``data.train_files=$path``), an exact rename becomes our key, a key that
changes nothing here is dropped, and a veRL value of one of our keys
(``trainer.save_freq=-1``) becomes ours; each with one line said at start.
What means something else here is left for the check to refuse.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import shlex
import typing
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser

from hybridflow.configs import CONFIG_DIR
from hybridflow.configs.foreign_keys import (
    VALUES,
    VERL,
    ForeignKey,
    argv_problems,
    explain,
    lookup,
    note_for,
    suggestion,
)
from hybridflow.configs.schema import PPOConfig

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
    return schema_override_problems([a for a in args if not a.startswith("-")], PPOConfig, group_options())


def schema_override_problems(
    texts: list[str], root: type, groups: dict[str, list[str]], key_list: str = "docs/config.md", foreign: bool = True
) -> list[str]:
    """One message per override in ``texts`` (no flags) that names no key of the dataclass schema ``root`` nor an
    option of one of ``groups``, or gives a key a value of the wrong type; ``key_list`` is where a reader finds
    every key, ``foreign``: explain veRL's and TRL's names (``configs/foreign_keys.py``, the RL trainer's). Also
    the check of ``hybridflow-train-rm`` (``tools/train_rm.py``), on its own schema."""
    try:
        overrides = OverridesParser.create().parse_overrides(texts)
    except Exception:  # noqa: BLE001 - a syntax error: Hydra's own message says where
        return []
    keys = schema_keys(root)
    problems = []
    for o, text in zip(overrides, texts):
        name = o.key_or_group
        if name.split(".")[0].split("/")[0] == "hydra" or o.is_delete():  # hydra.* keys, hydra/launcher=... groups
            continue
        if name in groups and "." not in name:
            problems += _group_problem(o, groups[name])
        elif name not in keys:
            problems += _unknown_key(o, keys, text.partition("=")[2], key_list, foreign)
        elif not o.is_sweep_override():
            problems += _type_problem(o.get_key_element().lstrip("+~"), keys[name], o.value())
    return problems


@dataclasses.dataclass
class Translation:
    """A command line rewritten by :func:`translate`."""

    args: list[str]
    """The arguments to hand to Hydra."""
    lines: list[str]
    """One per argument rewritten or dropped, saying what happened and why."""


def translate(args: list[str]) -> Translation:
    """``args`` (``sys.argv[1:]``) with veRL's spellings rewritten to ours where the meaning is the same.

    Flags and what does not parse as an override are kept as they are; so is every foreign key that has no
    exact counterpart, for :func:`override_problems` to explain.
    """
    keys = schema_keys()
    given = {o.key_or_group: text.partition("=")[2] for text, o in _parsed(args)}
    out: list[str] = []
    lines: list[str] = []
    sources: list[tuple[str, str | None]] = []  # (each argument handed on, the veRL argument it came from)
    for arg in args:
        parsed = _parsed([arg])
        rewritten = _rewrite(arg, parsed[0][1], keys, given) if parsed else None
        if rewritten is None:
            out.append(arg)
            sources.append((arg, None))
        else:
            out += rewritten[0]
            sources += [(new, arg) for new in rewritten[0]]
            lines.append(rewritten[1])
    return Translation(out, lines + _disagreements(sources))


def _disagreements(sources: list[tuple[str, str | None]]) -> list[str]:
    """One line per key of ours that two settings leave at different values, one of them a translated veRL key:
    Hydra takes the later, and the line says so (veRL has two settings there, for two roles, where one serves
    both here: the reference's and the rollout's log-prob budgets). Each setting counts with its last value, so a
    script's value that the user's own later argument replaces disagrees with nothing."""
    values: dict[str, dict[str, str]] = {}  # key of ours -> {the setting it came from: its last value}
    for arg, came_from in sources:
        parsed = _parsed([arg])
        if not parsed or parsed[0][1].is_sweep_override() or parsed[0][1].is_delete():
            continue
        key = parsed[0][1].key_or_group
        setting = came_from.partition("=")[0].lstrip("+~") if came_from else key
        given = values.setdefault(key, {})
        given.pop(setting, None)  # re-inserted last: the dict's order is the order of the last settings
        given[setting] = arg.partition("=")[2]
    lines = []
    for key, given in values.items():
        if len(set(given.values())) < 2:
            continue
        said = [f"{v} (as written)" if s == key else f"{v} (from veRL's {s})" for s, v in given.items()]
        lines.append(f"{key}: {' and '.join(said)} disagree; {list(given.values())[-1]}, the later, is used")
    return lines


def _parsed(args: list[str]) -> list[tuple[str, Any]]:
    """(text, parsed override) of each argument that is an override Hydra can parse."""
    parser = OverridesParser.create()
    found = []
    for text in args:
        if text.startswith("-") or "=" not in text:
            continue
        try:
            found.append((text, parser.parse_overrides([text])[0]))
        except Exception:  # noqa: BLE001, S112 - a syntax error: Hydra's own message says where
            continue
    return found


def _rewrite(arg: str, o: Any, keys: dict[str, Any], given: dict[str, str]) -> tuple[list[str], str] | None:
    """(the arguments that replace ``arg``, the line saying so), or None to keep ``arg``."""
    key, value = o.key_or_group, arg.partition("=")[2]
    if o.is_delete() or o.is_sweep_override() or key.split(".")[0] == "hydra":
        return None
    if key in keys:
        if arg.startswith("+") and not arg.startswith("++") and _base_types(keys[key])[0] in (int, float, bool, str):
            # veRL's '+' for a key its schema lacks: Hydra refuses to add a value that is there already
            plain = arg[1:]
            again = _rewrite(plain, o, keys, given)
            return again if again is not None else ([plain], f"{key} is a key here: {plain}, without the '+'")
        if key in VALUES:
            return _apply(VALUES[key], key, value, "")
        if _is_list(keys[key]) and isinstance(o.value(), str) and "${" not in value:
            listed = f"{arg.partition('=')[0]}=[{_quoted(o.value())}]"
            return [listed], f"{key}={value} is one item where a list is expected: {listed}"
        return None
    found = lookup(key)
    if found is None or found[0].origin != VERL:
        return None
    entry, rest = found
    if entry.ignored:
        return [], f"veRL's {key} has no effect here: {entry.ignored}"
    if entry.same_as:  # judged by the values the run gets: the last of each key (a script's, then the user's own)
        if _same_value(given.get(entry.same_as), given.get(key, value)):
            return [], f"veRL's {key} repeats {entry.same_as}: nothing to set; {entry.missing}"
        return None
    return _apply(entry, key, value, rest)


def _apply(entry: ForeignKey, key: str, value: str, rest: str) -> tuple[list[str], str] | None:
    """The overrides an exact or no-effect ``entry`` stands for, with its line; None when it has neither."""
    overrides = suggestion(entry, value, rest)
    if overrides is None or not (entry.exact or overrides == ()):
        return None
    if not all("=" in item for item in overrides):
        return None  # names a key whose value is not the foreign one: refused with the advice
    note = note_for(entry, value) or entry.missing
    if not overrides:
        return [], f"veRL's {key}={value} changes nothing here" + (f": {note}" if note else "")
    args = [a for item in overrides for a in shlex.split(item)]
    return args, f"veRL's {key}={value} -> {' '.join(overrides)}" + (f" ({note})" if note else "")


def _same_value(ours: str | None, theirs: str) -> bool:
    """Two values of a path key on one command line name the same thing (quotes and ``./`` aside)."""
    if ours is None:
        return False
    ours, theirs = (os.path.normpath(os.path.expanduser(v.strip("'\""))) for v in (ours, theirs))
    return ours == theirs


def _quoted(value: str) -> str:
    """``value`` as a quoted Hydra string."""
    quote = '"' if "'" in value else "'"
    return quote + value + quote


def _is_list(hint: Any) -> bool:
    base, _ = _base_types(hint)
    return typing.get_origin(base) is list or base is list


def _group_problem(o: Any, options: list[str]) -> list[str]:
    values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.value()]
    bad = [v for v in values if v is not None and str(v) not in options]
    return [
        f"{o.get_key_element()}={v}: no such option of config group {o.key_or_group!r}; options: {', '.join(options)}"
        for v in bad
    ]


def _unknown_key(o: Any, keys: dict[str, Any], value: str, key_list: str, foreign: bool) -> list[str]:
    explained = explain(o.key_or_group, value) if foreign else None
    if explained is not None:
        return [explained]
    parent = o.key_or_group.rsplit(".", 1)[0]
    while parent and parent not in keys:
        parent = parent.rsplit(".", 1)[0] if "." in parent else ""
    if parent and _is_mapping(keys[parent]):
        return []  # a key inside a dict-valued field (reward.route.x): Hydra checks the '+'
    close = difflib.get_close_matches(o.key_or_group, list(keys), n=3, cutoff=0.75)
    hint = f"; did you mean {' or '.join(close)}?" if close else f"; {key_list} lists every key"
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

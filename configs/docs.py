"""Generate ``docs/config.md`` from the schema and the config tree.

Run ``.venv/bin/python -m hybridflow.configs.docs > docs/config.md`` after changing
``schema.py`` or a YAML file here; ``tests/configs/test_docs.py`` fails
until the committed page matches what this prints.

The page has two parts: the config groups (each folder beside this module,
where the root config mounts it, its default and what each option sets),
then every key of the schema, section by section, with its type, its
default, the value the default job composes to when that differs, and the
field's docstring. Field docstrings are not kept at run time, so they are
read from ``schema.py``'s source.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from hybridflow.configs import CONFIG_DIR, schema

REGENERATE = ".venv/bin/python -m hybridflow.configs.docs > docs/config.md"
"""The command that rewrites the page (named in the page and in the test's failure)."""

ROOT_CONFIG = "ppo_trainer"


@dataclasses.dataclass(frozen=True)
class FieldDoc:
    """One leaf key of the schema as the page shows it."""

    key: str  # dotted path from the root, e.g. actor_rollout_ref.rollout.n
    type: str  # the annotation as written in schema.py
    default: Any
    doc: str


@dataclasses.dataclass(frozen=True)
class SectionDoc:
    """A dataclass-valued key (``algorithm``, ``algorithm.kl_ctrl``) and its leaf keys."""

    key: str
    doc: str
    fields: tuple[FieldDoc, ...]


def field_docstrings(module: Any = schema) -> dict[str, dict[str, str]]:
    """Class name -> field name -> the docstring written right under the field."""
    out: dict[str, dict[str, str]] = {}
    for cls in (n for n in ast.parse(inspect.getsource(module)).body if isinstance(n, ast.ClassDef)):
        docs: dict[str, str] = {}
        for node, nxt in zip(cls.body, cls.body[1:] + [None]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if (
                    isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)
                ):
                    docs[node.target.id] = " ".join(inspect.cleandoc(nxt.value.value).split())
        out[cls.name] = docs
    return out


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "???"


def _nested_class(f: dataclasses.Field) -> type | None:
    value = _default(f)
    return type(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else None


def walk_schema(root: type = schema.PPOConfig) -> list[SectionDoc]:
    """Every section of the schema in declaration order, depth first (a section before its subsections)."""
    docs = field_docstrings()
    sections: list[SectionDoc] = []

    def visit(cls: type, prefix: str, doc: str) -> None:
        leaves, nested = [], []
        for f in dataclasses.fields(cls):
            key = f"{prefix}.{f.name}" if prefix else f.name
            text = docs.get(cls.__name__, {}).get(f.name, "")
            sub = _nested_class(f)
            if sub is None:
                leaves.append(FieldDoc(key, str(f.type), _default(f), text))
            else:
                nested.append((sub, key, text))
        if prefix:
            sections.append(SectionDoc(prefix, doc, tuple(leaves)))
        for sub, key, text in nested:
            visit(sub, key, text)

    visit(root, "", "")
    return sections


def default_job_values(dict_keys: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Dotted key -> value in the default job (``ppo_trainer.yaml`` composed with no overrides).

    ``dict_keys`` are keys whose value is a mapping (``reward.route``): kept
    whole, not split into sub-keys. Uses Hydra's compose API, so it must not
    run inside another Hydra context.
    """
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    schema.register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(ROOT_CONFIG)
    return dict(_flatten(OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False), dict_keys))


def _flatten(tree: Any, dict_keys: frozenset[str] = frozenset(), prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(tree, dict) and tree and prefix not in dict_keys:
        for key, value in tree.items():
            yield from _flatten(value, dict_keys, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, tree


def fmt(value: Any) -> str:
    """A value as it is written in YAML or on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(fmt(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {fmt(v)}" for k, v in value.items()) + "}"
    return str(value)


def _cell(text: str) -> str:
    # docstrings use reST literals (``x``); Markdown's is one backtick
    return text.replace("``", "`").replace("|", "\\|").replace("\n", " ")


# -------------------------------------------------------------- config groups
@dataclasses.dataclass(frozen=True)
class GroupDoc:
    """A config group folder: where the root mounts it, its default, its options."""

    name: str
    mount: str  # the package it fills, e.g. actor_rollout_ref.model ("" for _global_)
    default: str  # the option the root selects ("" when none)
    options: tuple[tuple[str, str, tuple[str, ...]], ...]  # (option, comment, settings)


def _root_defaults(config_dir: Path) -> dict[str, tuple[str, str]]:
    """group -> (mount point, default option) from the root config's defaults list."""
    root = yaml.safe_load((config_dir / f"{ROOT_CONFIG}.yaml").read_text())
    out: dict[str, tuple[str, str]] = {}
    for item in root.get("defaults", []):
        if not isinstance(item, dict):
            continue  # the schema and _self_
        [(spec, option)] = item.items()
        spec = spec.removeprefix("optional ").strip()
        group, _, mount = spec.partition("@")
        out[group] = (mount or group, "" if option is None else str(option))
    return out


def _comment(text: str) -> str:
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        body = line.lstrip("#").strip()
        if not body.startswith("@package"):
            lines.append(body)
    return " ".join(" ".join(lines).split())


def _settings(text: str, mount: str) -> tuple[str, ...]:
    """What an option file sets, as command-line overrides (group choices first, then keys)."""
    data = yaml.safe_load(text) or {}
    picks = []
    for item in data.pop("defaults", None) or []:
        if isinstance(item, dict):
            [(spec, option)] = item.items()
            picks.append(f"{spec.removeprefix('override ').strip().lstrip('/')}={option}")
    prefix = f"{mount}." if mount else ""
    return tuple(picks) + tuple(f"{prefix}{k}={fmt(v)}" for k, v in _flatten(data))


def walk_groups(config_dir: Path = Path(CONFIG_DIR)) -> list[GroupDoc]:
    """Every config group folder, sorted by name, with its options."""
    roots = _root_defaults(config_dir)
    groups = []
    for folder in sorted(p for p in config_dir.iterdir() if p.is_dir() and any(p.glob("*.yaml"))):
        mount, default = roots.get(folder.name, (folder.name, ""))
        options = []
        for path in sorted(folder.glob("*.yaml")):
            text = path.read_text()
            if "@package _global_" in text.split("\n", 1)[0]:
                mount = ""
            options.append((path.stem, _comment(text), _settings(text, mount)))
        groups.append(GroupDoc(folder.name, mount, default, tuple(options)))
    return groups


def _override_key(group: GroupDoc) -> str:
    # Hydra names a group mounted elsewhere by group@package on the command line
    return group.name if group.mount in ("", group.name) else f"{group.name}@{group.mount}"


# ------------------------------------------------------------------- the page
def render() -> str:
    """The whole Markdown page."""
    sections = walk_schema()
    job = default_job_values(frozenset(f.key for s in sections for f in s.fields if isinstance(f.default, dict)))
    out = [
        "# Configuration reference",
        "",
        f"<!-- Generated by `{REGENERATE}` from configs/schema.py and the YAML files in configs/. Do not edit. -->",
        "",
        "Every key of `hybridflow-train`'s config, with its type, its default and what it means. The keys and their",
        "documentation live in `configs/schema.py` (Hydra checks the composed config against it, so a misspelt key or",
        "a wrong type fails at start-up); the YAML files only choose values. Set any key on the command line",
        "(`trainer.seed=1`), pick a group option (`data=gsm8k`, `experiment=gsm8k_grpo`), or sweep with `--multirun`.",
        "",
        (
            "Where the default job (`configs/ppo_trainer.yaml` as `make run` composes it) differs from "
            "the schema's default,"
        ),
        "the table shows both.",
        "",
        "Keys of a `dict` type start empty, and Hydra only adds new entries to them with a leading `+`:",
        "`+algorithm.estimator_options.gamma=0.99`, `'+reward.route={gsm8k:math}'` (quote braces for the shell);",
        (
            "`++` sets a key whether or not it exists. A group mounted below the root is chosen with "
            "`group@package=option`"
        ),
        "(`model@actor_rollout_ref.model=local`), as the options below are written.",
        "",
        "## Config groups",
        "",
        "| group | fills | default | options |",
        "|---|---|---|---|",
    ]
    groups = walk_groups()
    for g in groups:
        mount = f"`{g.mount}`" if g.mount else "the whole config (`@package _global_`)"
        default = f"`{g.default}`" if g.default else "none"
        out.append(f"| `{g.name}` | {mount} | {default} | {', '.join(f'`{o[0]}`' for o in g.options)} |")
    for g in groups:
        out += ["", f"### `{g.name}`", ""]
        for option, comment, settings in g.options:
            head = f"- `{_override_key(g)}={option}`"
            out.append(f"{head}: {comment}" if comment else head)
            if settings:
                out.append(f"  sets {', '.join(f'`{s}`' for s in settings)}")
    for section in sections:
        level = "#" * min(2 + section.key.count("."), 4)
        out += ["", f"{level} `{section.key}`", ""]
        if section.doc:
            out += [_cell(section.doc), ""]
        if not section.fields:
            out.pop()  # its subsections follow; no empty table
            continue
        out += ["| key | type | default | description |", "|---|---|---|---|"]
        for f in section.fields:
            default = f"`{_cell(fmt(f.default))}`"
            if f.key in job and fmt(job[f.key]) != fmt(f.default):
                default += f" (default job: `{_cell(fmt(job[f.key]))}`)"
            out.append(f"| `{f.key}` | `{_cell(f.type)}` | {default} | {_cell(f.doc)} |")
    return "\n".join(out) + "\n"


def main() -> None:
    """Print the page (``python -m hybridflow.configs.docs > docs/config.md``)."""
    print(render(), end="")


if __name__ == "__main__":
    main()

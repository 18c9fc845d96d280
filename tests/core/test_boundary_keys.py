"""Every ``meta_info`` key that crosses the driver/worker boundary is a constant of ``core/keys.py``.

:func:`raw_meta_keys` reads a module's syntax tree (``ast``) and reports each place that names a ``meta_info`` key
with a string literal instead of a constant:

* ``x.meta_info["k"]``, ``x.meta_info.get("k")`` / ``.pop`` / ``.setdefault``, ``x.meta_info.update(k=...)`` or
  ``.update({"k": ...})``;
* the same on a name bound to a ``meta_info`` (``meta = prompts.meta_info``) or named ``meta`` / ``meta_info`` (a
  parameter that receives one, as ``sampling_for(config, meta)``);
* a dict literal with a string key passed as ``meta_info=`` (directly, or through a name bound to it), given as
  ``DataProto(batch, non_tensors, {...})``'s third argument, or assigned to ``x.meta_info``.

It also reports an UPPER_CASE name used as a key that ``hybridflow.core.keys`` does not define (a module's own
copy of a key). The tree test runs it over agents/, trainer/, workers/ and core/.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hybridflow.core.keys as keys

ROOT = Path(keys.__file__).resolve().parents[1]
SCANNED = ("agents", "trainer", "workers", "core")
META_NAMES = {"meta", "meta_info"}
ACCESSORS = {"get", "pop", "setdefault"}


def _is_str(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def raw_meta_keys(source: str, filename: str = "<source>") -> list[str]:
    """``"file:line: key"`` for every raw string ``meta_info`` key (and unknown UPPER_CASE key name) in ``source``."""
    tree = ast.parse(source, filename)
    aliases = set(META_NAMES)
    dicts: dict[str, list[ast.Dict]] = {}  # name -> the dict literals assigned to it
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    if isinstance(node.value, ast.Attribute) and node.value.attr == "meta_info":
                        aliases.add(target.id)
                    if isinstance(node.value, ast.Dict):
                        dicts.setdefault(target.id, []).append(node.value)

    def is_meta(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "meta_info") or (
            isinstance(node, ast.Name) and node.id in aliases
        )

    found: list[tuple[int, str]] = []

    def key(node: ast.AST | None, line: int) -> None:
        if node is None:
            return
        if _is_str(node):
            found.append((line, repr(node.value)))
        elif isinstance(node, ast.Name) and node.id.isupper() and not hasattr(keys, node.id):
            found.append((line, f"{node.id} (not a constant of hybridflow.core.keys)"))

    def dict_keys(node: ast.AST) -> None:
        if isinstance(node, ast.Name):
            for d in dicts.get(node.id, []):
                dict_keys(d)
        elif isinstance(node, ast.Dict):
            for k in node.keys:  # None: a ** expansion
                key(k, node.lineno)

    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and is_meta(node.value):
            key(node.slice, node.lineno)
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and is_meta(func.value):
                if func.attr in ACCESSORS and node.args:
                    key(node.args[0], node.lineno)
                elif func.attr == "update":
                    for kw in node.keywords:
                        if kw.arg is not None:
                            found.append((node.lineno, f"{kw.arg!r} (keyword of update)"))
                    for arg in node.args:
                        dict_keys(arg)
            for kw in node.keywords:
                if kw.arg == "meta_info":
                    dict_keys(kw.value)
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("DataProto", "from_dict") and len(node.args) >= 3:
                dict_keys(node.args[2])
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Attribute) and t.attr == "meta_info" for t in node.targets
        ):
            dict_keys(node.value)
    return [f"{filename}:{line}: {what}" for line, what in sorted(found, key=lambda hit: hit[0])]


def tree_files() -> list[Path]:
    return sorted(p for d in SCANNED for p in (ROOT / d).rglob("*.py") if p != Path(keys.__file__).resolve())


def test_no_raw_meta_info_key_in_the_tree():
    files = tree_files()
    assert len(files) > 50 and any(p.name == "ppo_trainer.py" for p in files)  # the scan sees the package
    found = [hit for p in files for hit in raw_meta_keys(p.read_text(), str(p.relative_to(ROOT)))]
    assert found == [], "meta_info keys must be constants of core/keys.py:\n" + "\n".join(found)


PLANTED = """
from hybridflow.core.keys import GREEDY, N_SAMPLES, SEED, WEIGHT_VERSION
LOCAL_KEY = "mine"

def driver(prompts, batch, out, step):
    prompts.meta_info["n"] = 4                                    # 1
    prompts.meta_info.update(greedy=False)                        # 2
    prompts.meta_info.update({"seed": 3, N_SAMPLES: 1})           # 3
    version = out.meta_info.get("weight_version")                 # 4
    batch.meta_info.pop("request", None)                          # 5
    batch.meta_info.setdefault("global_step", step)               # 6
    meta = prompts.meta_info
    meta["max_new_tokens"]                                        # 7
    call = {"stop_token_ids": [], GREEDY: True}                   # 8 (passed below)
    DataProto.from_dict({}, meta_info=call)
    DataProto.from_dict({}, meta_info={"with_sum_pi_squared": 1}) # 9
    DataProto({}, {}, {**prompts.meta_info, "n": 1})              # 10
    out.meta_info = {"weight_version": 0}                         # 11
    out.meta_info[LOCAL_KEY] = 1                                  # 12: a module's own copy of a key

def sampling(meta):
    return meta.get("greedy")                                     # 13

def clean(prompts, out, key):
    prompts.meta_info[N_SAMPLES] = 4
    prompts.meta_info.update({SEED: 3, GREEDY: False})
    out.meta_info.get(WEIGHT_VERSION)
    out.meta_info.pop(key, None)
    out.meta_info.get(METRICS, {}).pop("rollout/stream_idle_s", None)  # a metric name, not a meta key
    out.meta_info[METRICS]["rollout/generate_s"] = 1.0
    config = {"n": 3}                                             # never a meta_info
    config["n"]
"""


def test_the_check_finds_every_planted_raw_key_and_nothing_else():
    found = raw_meta_keys(PLANTED, "planted.py")
    keys_found = [hit.split(": ", 1)[1] for hit in found]
    assert keys_found == [
        "'n'",
        "'greedy' (keyword of update)",
        "'seed'",
        "'weight_version'",
        "'request'",
        "'global_step'",
        "'max_new_tokens'",
        "'stop_token_ids'",
        "'with_sum_pi_squared'",
        "'n'",
        "'weight_version'",
        "LOCAL_KEY (not a constant of hybridflow.core.keys)",
        "'greedy'",
    ], found
    lines = PLANTED.splitlines()
    assert all(lines[int(hit.split(":")[1]) - 1].strip() for hit in found)  # each names its line


@pytest.mark.parametrize(
    "planted",
    [
        'def f(batch):\n    batch.meta_info["global_step"] = 1\n',
        'def f(data):\n    return data.meta_info.get("with_sum_pi_squared", False)\n',
    ],
)
def test_a_raw_key_in_a_tree_file_fails_the_tree_check(planted):
    """A tree file with one raw key reintroduced (as the tree test would read it) is reported."""
    source = (ROOT / "trainer" / "ppo_trainer.py").read_text() + "\n\n" + planted
    assert len(raw_meta_keys(source, "trainer/ppo_trainer.py")) == 1


def test_every_meta_info_constant_has_a_docstring():
    """The meta_info keys of core/keys.py (after its ``# meta_info keys`` line) each say who writes and reads them."""
    source = Path(keys.__file__).read_text()
    start = source.index("# meta_info keys")
    body = ast.parse(source).body
    undocumented = []
    for i, node in enumerate(body):
        if (
            isinstance(node, ast.Assign)
            and _is_str(node.value)
            and node.lineno > source[:start].count("\n") + 1
            and node.targets[0].id not in ("METRICS", "WEIGHT_SYNC_PREFIX")
        ):  # those two: a comment each
            following = body[i + 1] if i + 1 < len(body) else None
            if not (
                isinstance(following, ast.Expr)
                and _is_str(following.value)
                and "Written" in following.value.value
                and "read" in following.value.value
            ):
                undocumented.append(node.targets[0].id)
    assert undocumented == []

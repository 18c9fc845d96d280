"""``custom``: a user's scoring function loaded from a Python file.

Configured as ``reward.custom_reward_function.path`` (the file),
``.name`` (the function, default ``compute_score``) and ``.kwargs`` (extra
keyword arguments passed on every call). The reward manager hands these to
this verifier as keyword arguments; the file is imported once per process
(each pool worker imports it itself, so the function need not be picklable,
only importable from its file).

The function has the verifier signature
``fn(data_source, solution_str, ground_truth, extra_info, **kwargs)`` and
returns a float or a dict with ``"score"``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

from hybridflow.plugins import RewardVerifier, hookimpl

_loaded: dict[tuple[str, str], Callable[..., Any]] = {}


def load_function(path: str, name: str = "compute_score") -> Callable[..., Any]:
    """Import ``path`` as a module (once per process) and return its attribute ``name``.

    Raises ``FileNotFoundError`` for a missing file and ``AttributeError``
    naming the file and the functions it does define for a missing name.
    """
    path = os.path.abspath(os.path.expanduser(path))
    key = (path, name)
    if key in _loaded:
        return _loaded[key]
    if not os.path.isfile(path):
        raise FileNotFoundError(f"custom reward function file not found: {path}")
    module_name = f"hybridflow_custom_reward_{abs(hash(path)):x}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import custom reward function file {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # lets the file's own pickling / dataclasses work
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
    fn = getattr(module, name, None)
    if not callable(fn):
        defined = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise AttributeError(
            f"{path} has no function {name!r}; it defines: {', '.join(defined) or '(nothing callable)'}"
        )
    _loaded[key] = fn
    return fn


def custom_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    path: str,
    name: str = "compute_score",
    **kwargs: Any,
) -> float | dict[str, Any]:
    """The score of the user's function ``name`` from the file ``path``, called with ``kwargs``."""
    fn = load_function(path, name)
    return fn(data_source, solution_str, ground_truth, extra_info, **kwargs)


@hookimpl
def hybridflow_register_reward_verifiers(register):
    register(RewardVerifier(name="custom", fn=custom_score))

"""What the contract kit runs in a reward-pool worker: one verifier call, its exception kept apart.

Kept free of torch and of the rest of the kit, so a worker that imports it
starts as fast as the verifier's own module allows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def call_verifier(
    fn: Callable[..., Any],
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any,
    kwargs: Mapping[str, Any],
) -> tuple[str, Any]:
    """``("returned", value)`` or, for an ordinary ``Exception``, ``("raised", "Type: message")``.

    Anything else (``SystemExit``, ``KeyboardInterrupt``) is left to the
    pool worker, which reports it as an error: the kit tells the two apart.
    """
    try:
        return "returned", fn(data_source, solution_str, ground_truth, extra_info, **kwargs)
    except Exception as exc:
        return "raised", f"{type(exc).__name__}: {exc}"

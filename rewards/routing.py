"""Which verifier scores which row: ``reward.route`` maps ``data_source`` to verifiers.

A route's key is a data_source, exact or a glob (``aime*``); its value is a
verifier name, or a mapping of verifier names to weights whose weighted sum
is the score (``{"format": 0.1, "math": 0.9}``). The user's routes extend
and override :data:`DEFAULT_ROUTES` (veRL's defaults). Lookup: an exact key
first, then the globs in order (the user's before the defaults); a
data_source that matches nothing is an :class:`UnroutedDataSourceError`
listing the routes.

The verifier ``custom`` gets ``reward.custom_reward_function`` (``path``,
``name``, ``kwargs``) as its keyword arguments; when that function is
configured and no route is given, every data_source goes to it (``*`` ->
``custom``), as in veRL. Any other verifier gets
``reward.verifier_kwargs[name]``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_ROUTES: dict[str, str] = {
    "openai/gsm8k": "gsm8k",
    "gsm8k": "gsm8k",
    "lighteval/MATH": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "HuggingFaceH4/MATH-500": "math",
    "hendrycks/competition_math": "math",
    "math": "math",
    "math_dapo": "math",
    "aime*": "math",
    "numina_*": "math",
    "codecontests": "code",
    "apps": "code",
    "codeforces": "code",
    "taco": "code",
    "code": "code",
    "synthetic/arithmetic": "arithmetic",  # hybridflow.data.synthetic
    "synthetic/tool": "tool_task",  # hybridflow.data.synthetic_tool
}
"""Routes every manager starts from (veRL's defaults, by data_source)."""


class UnroutedDataSourceError(KeyError):
    """A batch row's data_source matches no route."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


@dataclass(frozen=True)
class VerifierCall:
    """One verifier applied to a row: its registered name, weight and keyword arguments."""

    name: str
    weight: float = 1.0
    kwargs: Mapping[str, Any] = field(default_factory=dict)


def _is_glob(key: str) -> bool:
    return any(ch in key for ch in "*?[")


def _parse_target(key: str, value: Any) -> tuple[tuple[str, float], ...]:
    if isinstance(value, str):
        return ((value, 1.0),)
    if isinstance(value, Mapping) and value:
        return tuple((str(name), float(weight)) for name, weight in value.items())
    raise TypeError(
        f"reward.route[{key!r}] must be a verifier name or a mapping of verifier names to weights, got {value!r}"
    )


class Router:
    """Resolves a data_source to the :class:`VerifierCall` s that score it.

    :param route: data_source (or glob) -> verifier name or {name: weight};
        extends and overrides :data:`DEFAULT_ROUTES`.
    :param custom_reward_function: ``{"path", "name", "kwargs"}`` for the
        ``custom`` verifier (``path`` empty or missing: no custom function).
    :param verifier_kwargs: verifier name -> keyword arguments for it.
    """

    def __init__(
        self,
        route: Mapping[str, Any] | None = None,
        custom_reward_function: Mapping[str, Any] | None = None,
        verifier_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        custom = dict(custom_reward_function or {})
        self._custom_kwargs: dict[str, Any] | None = None
        if custom.get("path"):
            name = custom.get("name") or "compute_score"
            self._custom_kwargs = {"path": custom["path"], "name": name, **dict(custom.get("kwargs") or {})}
        only_custom = self._custom_kwargs is not None and not route  # None or the config's empty mapping
        if only_custom:  # every data_source goes to it, the defaults' exact routes included
            route = {"*": "custom"}
        self._verifier_kwargs = {k: dict(v) for k, v in (verifier_kwargs or {}).items()}
        user = {str(k): _parse_target(str(k), v) for k, v in (route or {}).items()}
        defaults = {} if only_custom else {k: _parse_target(k, v) for k, v in DEFAULT_ROUTES.items() if k not in user}
        self.routes: dict[str, tuple[tuple[str, float], ...]] = {**user, **defaults}
        self._globs = [k for k in user if _is_glob(k)] + [k for k in defaults if _is_glob(k)]
        if "custom" in self.verifier_names() and self._custom_kwargs is None:
            raise ValueError("a reward route uses 'custom' but reward.custom_reward_function.path is not set")

    def verifier_names(self) -> set[str]:
        """Every verifier name some route uses."""
        return {name for target in self.routes.values() for name, _ in target}

    def _kwargs(self, name: str) -> dict[str, Any]:
        if name == "custom":
            return dict(self._custom_kwargs or {})
        return dict(self._verifier_kwargs.get(name, {}))

    def resolve(self, data_source: str) -> tuple[VerifierCall, ...]:
        """The verifiers (with weights and kwargs) that score rows of ``data_source``."""
        key = data_source if data_source in self.routes and not _is_glob(data_source) else None
        if key is None:
            key = next((g for g in self._globs if fnmatch.fnmatchcase(data_source, g)), None)
        if key is None:
            listing = "; ".join(f"{k} -> {self._describe(t)}" for k, t in self.routes.items())
            raise UnroutedDataSourceError(
                f"no reward route for data_source {data_source!r}. "
                f"Add one, e.g. reward.route={{{data_source!r}: 'math'}}. "
                f"Routes: {listing}"
            )
        return tuple(VerifierCall(name, weight, self._kwargs(name)) for name, weight in self.routes[key])

    @staticmethod
    def _describe(target: tuple[tuple[str, float], ...]) -> str:
        if len(target) == 1 and target[0][1] == 1.0:
            return target[0][0]
        return " + ".join(f"{w:g}*{n}" for n, w in target)

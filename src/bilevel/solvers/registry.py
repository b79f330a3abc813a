"""The solver registry: ``make(name, **hyperparameters)`` and ``names()``."""

from __future__ import annotations

import dataclasses
import difflib

__all__ = ["register", "make", "names", "get", "check_hyperparameters"]

_REGISTRY: dict[str, type] = {}


def register(name: str):
    """Class decorator: register a solver class under a lower-case ``name``."""

    def deco(cls):
        key = name.lower()
        if key in _REGISTRY and _REGISTRY[key] is not cls:
            raise ValueError(f"solver name {key!r} is already registered.")
        _REGISTRY[key] = cls
        return cls

    return deco


def names(kind: str = "offline") -> list[str]:
    """The registered solver names of one ``kind``, lower-case, sorted.

    Args:
        kind: ``"offline"`` (the default: the solvers ``bl.solve`` runs on a
            ``bl.BilevelProblem``, which every offline test battery and the CLI iterate),
            ``"online"`` (``bl.solve_online`` on a ``bl.OnlineProblem``: F2OBO, ...) or
            ``"all"``.
    """
    if kind not in ("offline", "online", "all"):
        raise ValueError(f"names(kind={kind!r}) is unknown; use 'offline', 'online' or 'all'.")
    if kind == "all":
        return sorted(_REGISTRY)
    online = kind == "online"
    return sorted(k for k, cls in _REGISTRY.items() if cls.online == online)


def get(name: str) -> type:
    """The solver class registered under ``name`` (case-insensitive)."""
    if not isinstance(name, str):
        raise TypeError(f"solver name must be a string, got {type(name).__name__}.")
    key = name.lower()
    if key not in _REGISTRY:
        close = difflib.get_close_matches(key, _REGISTRY, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        known = ", ".join(names("all"))
        raise ValueError(f"unknown solver {name!r}.{hint} Known solvers: {known}.")
    return _REGISTRY[key]


def make(name: str, **hyperparameters):
    """Build the solver ``name`` with ``hyperparameters`` (others keep the paper's defaults).

    Raises:
        ValueError: unknown solver name, or a hyperparameter the solver does not have (the
            message lists the ones it has), or a bad value (e.g. a non-positive step size).
    """
    cls = get(name)
    check_hyperparameters(cls, name, hyperparameters)
    return cls(**hyperparameters)


def check_hyperparameters(cls: type, name: str, hyperparameters) -> None:
    """Raise a ValueError listing the solver's hyperparameters if one of ``hyperparameters``
    (names) is not a field of solver class ``cls`` (registered as ``name``)."""
    fields = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = [k for k in hyperparameters if k not in fields]
    if unknown:
        raise ValueError(
            f"solver {name!r} has no hyperparameter(s) {', '.join(map(repr, unknown))}; its "
            f"hyperparameters are: {', '.join(fields)}."
        )

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


def names() -> list[str]:
    """Every registered solver name, lower-case, sorted."""
    return sorted(_REGISTRY)


def get(name: str) -> type:
    """The solver class registered under ``name`` (case-insensitive)."""
    if not isinstance(name, str):
        raise TypeError(f"solver name must be a string, got {type(name).__name__}.")
    key = name.lower()
    if key not in _REGISTRY:
        close = difflib.get_close_matches(key, _REGISTRY, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"unknown solver {name!r}.{hint} Known solvers: {', '.join(names())}.")
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

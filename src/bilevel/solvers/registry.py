"""The solver registry: ``make(name, **hyperparameters)``, ``names()`` and the table of every
registered solver (:func:`table`), which ``bilevel solvers --long`` prints and from which
``docs/solvers.md`` is generated::

    python -m bilevel.solvers --markdown > docs/solvers.md
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "register",
    "make",
    "names",
    "get",
    "check_hyperparameters",
    "SolverEntry",
    "table",
    "format_table",
    "markdown",
]

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


# ---- the table of registered solvers ------------------------------------------------------------
class SolverEntry(NamedTuple):
    """One registered solver, as ``bilevel solvers --long`` and ``docs/solvers.md`` list it."""

    name: str  # the registered name, ``bl.solvers.make(name)``
    cls: type  # the class, exported from ``bl.solvers``
    family: str  # the method family: the folder under ``solvers/``
    paper: str  # the class's ``paper``: authors, title, venue, year
    file: str  # the class's file, relative to the ``bilevel`` package


def table(kind: str = "all") -> list[SolverEntry]:
    """Every registered solver of ``kind`` (as :func:`names`), sorted by name."""
    package = Path(sys.modules[__package__.split(".")[0]].__file__).parent
    rows = []
    for name in names(kind):
        cls = _REGISTRY[name]
        path = Path(sys.modules[cls.__module__].__file__).relative_to(package)
        family = path.parent.name  # solvers/<family>/<name>.py
        rows.append(SolverEntry(name, cls, family, cls.paper, path.as_posix()))
    return rows


def format_table(rows: list[SolverEntry]) -> str:
    """``rows`` as aligned text columns: name, class, family, file, paper."""
    cells = [(r.name, r.cls.__name__, r.family, r.file, r.paper) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(4)]
    lines = ["  ".join(c[i].ljust(widths[i]) for i in range(4)) + "  " + c[4] for c in cells]
    return "\n".join(lines)


def markdown() -> str:
    """The page ``docs/solvers.md``: the offline and the online solvers, one row each."""
    out = [
        "# Solvers",
        "",
        "Every registered solver: its name (`bl.solvers.make(name)`), class (exported from",
        "`bl.solvers`), family, paper and file (relative to `src/bilevel/`). Generated from",
        "the registry; do not edit by hand, regenerate it with",
        "",
        "    python -m bilevel.solvers --markdown > docs/solvers.md",
        "",
        "(`tests/test_solver_registry.py` checks that it is up to date; `bilevel solvers --long`",
        "prints the same table.) `docs/adding_a_solver.md` explains how to add a row.",
    ]
    sections = (
        ("offline", "Offline solvers (`bl.solve`)"),
        ("online", "Online solvers (`bl.solve_online`)"),
    )
    for kind, title in sections:
        out += ["", f"## {title}", "", "| name | class | family | paper | file |"]
        out.append("|---|---|---|---|---|")
        for r in table(kind):
            out.append(f"| `{r.name}` | `{r.cls.__name__}` | {r.family} | {r.paper} | `{r.file}` |")
    return "\n".join(out) + "\n"

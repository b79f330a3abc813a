"""The solver registry: ``make(name, **hyperparameters)``, ``names()`` and the table of every
registered solver (:func:`table`), which ``bilevel solvers --long`` prints and from which
``docs/solvers.md`` (the documentation site's solver index: paper, oracles, ``x_set``, defaults
and a link to each class's API reference) is generated::

    python -m bilevel.solvers --markdown > docs/solvers.md
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "register",
    "make",
    "names",
    "get",
    "check_hyperparameters",
    "SolverEntry",
    "ORACLES",
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
#: The oracles each registered solver calls in one step (an online solver: one round) with its
#: default settings, as fields of :class:`bilevel.core.oracles.Counts`: ``grad_f``, ``grad_g``
#: (gradients), ``value_f``, ``value_g`` (function values), ``hvp`` (Hessian-vector products in
#: y), ``cross`` (cross second-derivative products), ``dense`` (dense Hessians / Jacobians). The
#: solver index (``docs/solvers.md``) lists them as what the method needs;
#: ``tests/test_solver_registry.py`` checks each entry against the counts of one measured step.
#: A new solver adds its line here.
ORACLES: dict[str, frozenset[str]] = {
    name: frozenset(kinds.split())
    for name, kinds in {
        # offline
        "aid-cg": "grad_f grad_g hvp cross",
        "aid-fp": "grad_f grad_g hvp cross",
        "bsa": "grad_f grad_g hvp cross",
        "f2sa": "grad_f grad_g",
        "f3sa": "grad_f grad_g",
        "hozog": "grad_g value_f",
        "ibcg": "grad_f grad_g hvp cross",  # hessian_inverse="exact": dense
        "itd": "grad_f grad_g hvp cross",
        "pzobo": "grad_f grad_g",
        "pzobo-s": "grad_f grad_g",
        "saba": "grad_f grad_g hvp cross",
        "sbfw": "grad_f grad_g hvp cross",  # hessian_inverse="exact": dense
        "soba": "grad_f grad_g hvp cross",
        "stable": "grad_f grad_g dense",
        "stocbio": "grad_f grad_g hvp cross",
        "ttsa": "grad_f grad_g hvp cross",
        # online
        "af2obo": "grad_f grad_g",
        "aobo": "grad_f grad_g hvp cross",
        "f2obo": "grad_f grad_g",
        "f2obo-sl": "grad_f grad_g",
        "fsobo": "grad_f grad_g hvp cross",
        "oagd": "grad_f grad_g hvp cross",
        "obbo": "grad_f grad_g hvp cross",
        "sf2obo": "grad_f grad_g",
        "sobbo": "grad_f grad_g hvp cross",
        "sobow": "grad_f grad_g hvp cross",
        "sogd": "grad_f grad_g hvp cross",
    }.items()
}

#: the defaults nearly every solver shares, which the solver index states once above its tables
#: and lists per solver only where they differ
COMMON_DEFAULTS = {
    "outer_optimizer": "sgd",
    "lr_outer": "auto",
    "lr_inner": "auto",
    "batch_size": None,
}


class SolverEntry(NamedTuple):
    """One registered solver, as ``bilevel solvers --long`` and ``docs/solvers.md`` list it."""

    name: str  # the registered name, ``bl.solvers.make(name)``
    cls: type  # the class, exported from ``bl.solvers``
    family: str  # the method family: the folder under ``solvers/``
    paper: str  # the class's ``paper``: authors, title, venue, year
    file: str  # the class's file, relative to the ``bilevel`` package
    oracles: frozenset[str] | None = None  # ``ORACLES[name]`` (None: not declared)
    defaults: dict[str, Any] | None = None  # every hyperparameter's default (the init fields)


def defaults(cls: type) -> dict[str, Any]:
    """The default of every hyperparameter (init field) of solver class ``cls``, in field
    order; a field without one (none here) is left out."""
    out = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def table(kind: str = "all") -> list[SolverEntry]:
    """Every registered solver of ``kind`` (as :func:`names`), sorted by name."""
    package = Path(sys.modules[__package__.split(".")[0]].__file__).parent
    rows = []
    for name in names(kind):
        cls = _REGISTRY[name]
        path = Path(sys.modules[cls.__module__].__file__).relative_to(package)
        family = path.parent.name  # solvers/<family>/<name>.py
        rows.append(
            SolverEntry(
                name, cls, family, cls.paper, path.as_posix(), ORACLES.get(name), defaults(cls)
            )
        )
    return rows


def format_table(rows: list[SolverEntry]) -> str:
    """``rows`` as aligned text columns: name, class, family, file, paper."""
    cells = [(r.name, r.cls.__name__, r.family, r.file, r.paper) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(4)]
    lines = ["  ".join(c[i].ljust(widths[i]) for i in range(4)) + "  " + c[4] for c in cells]
    return "\n".join(lines)


def needs(row: SolverEntry) -> str:
    """What the solver needs, in words: its order and its oracles (:data:`ORACLES`), then a
    bounded ``x_set`` where its linear minimization oracle needs one."""
    kinds = row.oracles
    if kinds is None:
        text = "(not declared in `registry.ORACLES`)"
    else:
        if kinds & {"hvp", "cross", "dense"}:
            order = "second order"
        elif kinds & {"value_f", "value_g"}:
            order = "zeroth order in x"
        else:
            order = "first order"
        words = [words for key, words in _ORACLE_WORDS if kinds & key]
        text = f"{order}: {', '.join(words)}"
    if row.cls.needs_bounded_set:
        text += "; a bounded `x_set` (its LMO)"
    elif not row.cls.supports_x_set:
        text += "; no `x_set`"
    return text


#: how the solver index names the oracles of :data:`ORACLES`, in this order
_ORACLE_WORDS = (
    (frozenset({"grad_f"}), "∇f"),
    (frozenset({"grad_g"}), "∇g"),
    (frozenset({"value_f"}), "values of f"),
    (frozenset({"value_g"}), "values of g"),
    (frozenset({"hvp", "cross"}), "Hessian-vector and cross products of g"),
    (frozenset({"dense"}), "dense Hessian and Jacobian of g"),
)


def _value(value: Any) -> str:
    """A default as the index prints it: Python's repr, strings in double quotes, floats to 4
    significant digits."""
    if isinstance(value, float) and len(repr(value)) > 8:
        return f"{value:.4g}"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, type) or callable(value):
        return getattr(value, "__name__", repr(value))
    return repr(value)


def _defaults_cell(row: SolverEntry) -> str:
    """The defaults that are not :data:`COMMON_DEFAULTS`, as code spans, one a line, and the
    common fields the class lacks."""
    fields = row.defaults or {}
    items = [
        f"`{k}={_value(v)}`"
        for k, v in fields.items()
        if not (
            k in COMMON_DEFAULTS and v == COMMON_DEFAULTS[k] and type(v) is type(COMMON_DEFAULTS[k])
        )
    ]
    items += [f"no `{k}`" for k in COMMON_DEFAULTS if k not in fields]
    return "<br>".join(items) if items else "(the common ones)"


def markdown() -> str:
    """The page ``docs/solvers.md``: the offline and the online solvers, one row each, with
    the paper, what the method needs (:func:`needs`), its defaults and a link to the class's
    entry in the API reference (``docs/reference/solvers.md``)."""
    common = ", ".join(f"`{k}={_value(v)}`" for k, v in COMMON_DEFAULTS.items())
    out = [
        "# Solvers",
        "",
        "Every registered solver: its name (`bl.solvers.make(name)`), its class (exported from",
        "`bl.solvers`, linked to its API reference), family (its file is",
        "`src/bilevel/solvers/<family>/<name>.py`, `-` written `_`), what it needs, its default",
        "hyperparameters and paper. Generated from the registry; do not edit by hand,",
        "regenerate it with",
        "",
        "    python -m bilevel.solvers --markdown > docs/solvers.md",
        "",
        "(`tests/test_solver_registry.py` checks that it is up to date; `bilevel solvers --long`",
        "prints the name, class, family, file and paper.) `docs/adding_a_solver.md` explains how",
        "to add a row, and the [paper pages](algorithms/index.md) map each method to its paper.",
        "",
        "**Needs** lists the oracles one step (an online solver: one round) calls with the",
        "default settings: *first order* methods use gradients of f and g only; *second order*",
        "ones also Hessian-vector and cross products of g, computed by autodiff without forming",
        "a matrix (`bl.oracles`), or dense Hessians and Jacobians of g (cost `O(dim y^2)`",
        "memory); *zeroth order in x* ones use values of f. Every solver accepts an `x_set` and",
        "projects onto it, except where a bounded set is required (Frank-Wolfe methods, which",
        "call its linear minimization oracle instead).",
        "",
        "**Defaults**: unless its row says otherwise, every solver has",
        f"{common}.",
        '`lr_outer="auto"` is chosen by a short tuning run (offline: `bl.solve` / `bl.tune`;',
        'online: the first rounds of `bl.solve_online`), `lr_inner="auto"` is `c / L_g`',
        "([step sizes](step_sizes.md)).",
    ]
    sections = (
        ("offline", "Offline solvers (`bl.solve`)"),
        ("online", "Online solvers (`bl.solve_online`)"),
    )
    for kind, title in sections:
        out += [
            "",
            f"## {title}",
            "",
            "| name | class | family | needs | defaults | paper |",
            "|---|---|---|---|---|---|",
        ]
        for r in table(kind):
            link = f"[`{r.cls.__name__}`](reference/solvers.md#bilevel.solvers.{r.cls.__name__})"
            out.append(
                f"| `{r.name}` | {link} | {r.family} | {needs(r)} | {_defaults_cell(r)} "
                f"| {r.paper} |"
            )
    return "\n".join(out) + "\n"

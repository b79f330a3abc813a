"""The papers' experiments, each reproducible with ``bilevel reproduce NAME``.

An experiment is a function ``run(out_dir, *, quick, seeds, log) -> ExperimentOutput``
registered here with its paper and a one-line description. ``--quick`` runs a reduced version
(labelled QUICK in every output) that finishes in well under a minute.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path

from bilevel.experiments.common import Claim, ExperimentOutput, Method

__all__ = ["Experiment", "register", "names", "get", "run", "Claim", "Method", "ExperimentOutput"]


@dataclasses.dataclass(frozen=True)
class Experiment:
    name: str
    paper: str
    description: str
    fn: Callable[..., ExperimentOutput]
    default_seeds: int = 3


_EXPERIMENTS: dict[str, Experiment] = {}


def register(name: str, paper: str, description: str, default_seeds: int = 3):
    """Decorator registering ``fn(out_dir, *, quick, seeds, log)`` as experiment ``name``."""

    def deco(fn):
        _EXPERIMENTS[name] = Experiment(name, paper, description, fn, default_seeds)
        return fn

    return deco


def _load_all() -> None:
    for info in pkgutil.iter_modules(__path__):
        if info.name != "common":
            importlib.import_module(f"{__name__}.{info.name}")


def names() -> list[str]:
    _load_all()
    return sorted(_EXPERIMENTS)


def get(name: str) -> Experiment:
    _load_all()
    if name not in _EXPERIMENTS:
        close = difflib.get_close_matches(name, _EXPERIMENTS, n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"unknown experiment {name!r}.{hint} Known: {', '.join(names())}.")
    return _EXPERIMENTS[name]


def run(
    name: str,
    out_dir: str | Path,
    *,
    quick: bool = False,
    seeds: int | None = None,
    log: Callable[[str], None] = print,
) -> ExperimentOutput:
    """Run experiment ``name``, writing its figures, CSVs and claims.md into ``out_dir``."""
    exp = get(name)
    seeds = exp.default_seeds if seeds is None else int(seeds)
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}.")
    return exp.fn(Path(out_dir), quick=quick, seeds=seeds, log=log)

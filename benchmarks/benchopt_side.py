"""benchopt's ``benchmark_bilevel`` loaded from a user's clone, for side-by-side timing.

Nothing of that repository is copied here: this module imports its solver and dataset classes
from the clone the user points at (``--benchopt-dir``, else ``$BENCHMARK_BILEVEL_DIR``, else
``./benchmark_bilevel`` beside this checkout) and drives them the way benchopt does:
``set_objective`` builds the solver's jitted ``one_epoch`` and ``init`` its carry. When the
``benchopt`` package itself is not installed, a three-name stand-in (``BaseSolver``,
``BaseDataset``, ``safe_import_context``, ``stopping_criterion.SufficientProgressCriterion``)
is registered first: the solvers only subclass those names; their JAX code is theirs, unchanged.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import types
from pathlib import Path

DEFAULT_DIRS = ("benchmark_bilevel", "../benchmark_bilevel")
CLONE_HINT = "git clone https://github.com/benchopt/benchmark_bilevel"


def find_clone(path: str | None) -> Path | None:
    """The clone's directory, or ``None`` when there is none (the benchmark then skips)."""
    here = Path(__file__).resolve().parent.parent
    candidates = [path, os.environ.get("BENCHMARK_BILEVEL_DIR")]
    candidates += [str(here / d) for d in DEFAULT_DIRS]
    for c in candidates:
        if c and (Path(c) / "solvers" / "f2sa.py").is_file():
            return Path(c).resolve()
    return None


def _stand_in_benchopt() -> None:
    """Register a minimal ``benchopt`` module (only what the solver files import)."""
    try:
        import benchopt  # noqa: F401

        return
    except ImportError:
        pass

    class _Base:
        parameters: dict = {}

        def __init__(self, **params):
            for name, values in type(self).parameters.items():
                setattr(self, name, values[0])
            for name, value in params.items():
                setattr(self, name, value)

        def run_once(self, *args, **kwargs):  # benchopt's warm-up; timing warms up itself
            return None

    class SufficientProgressCriterion:
        def __init__(self, *args, **kwargs):
            pass

    module = types.ModuleType("benchopt")
    module.BaseSolver = module.BaseDataset = module.BaseObjective = _Base
    module.safe_import_context = contextlib.nullcontext
    criterion = types.ModuleType("benchopt.stopping_criterion")
    criterion.SufficientProgressCriterion = SufficientProgressCriterion
    module.stopping_criterion = criterion
    sys.modules["benchopt"] = module
    sys.modules["benchopt.stopping_criterion"] = criterion


def load(clone: Path, relative: str):
    """Import ``relative`` (e.g. ``solvers/f2sa.py``) of the clone as a module."""
    _stand_in_benchopt()
    if str(clone) not in sys.path:
        sys.path.insert(0, str(clone))
    name = "benchopt_side_" + relative.replace("/", "_").removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, clone / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_solver(clone: Path, file: str, pb_inner, pb_outer, inner0, outer0, **params):
    """A benchopt solver set on the problem; returns ``(one_epoch, carry)``."""
    cls = load(clone, f"solvers/{file}.py").Solver
    solver = cls.__new__(cls)
    for name, values in cls.parameters.items():
        setattr(solver, name, values[0])
    for name, value in params.items():
        setattr(solver, name, value)
    f_inner, n_inner = pb_inner[0], pb_inner[1]
    f_outer, n_outer = pb_outer[0], pb_outer[1]
    solver.set_objective(f_inner, f_outer, n_inner, n_outer, inner0, outer0)
    return solver.one_epoch, solver.init()

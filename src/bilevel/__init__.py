"""bilevel: gradient-based bilevel optimization in JAX.

    min_{x in X} F(x) = f(x, y*(x))    s.t.   y*(x) = argmin_y g(x, y)

Quick start::

    import bilevel as bl
    problem = bl.problems.quadratic(dx=10, dy=50, cond=10.0)
    solver = bl.solvers.make("f2sa", lr_outer=0.05, lr_inner=0.1)
    res = bl.solve(problem, solver, steps=2000, seeds=[0, 1, 2])
    res.history  # step, samples, oracle calls, seconds, grad_norm, ...

Online (streaming) problems: ``bl.OnlineProblem`` (f(t, x, y, batch), g, horizon=T, ...),
played by an online solver (``bl.solvers.names("online")``) with ``bl.solve_online``; see
``docs/online.md``.
"""

import sys as _sys

from bilevel import problems, solvers
from bilevel.analysis import metrics
from bilevel.analysis.diagnose import Diagnosis, NotStronglyConvexWarning, diagnose
from bilevel.core import oracles, schedules, sets
from bilevel.core.online_problem import OnlineProblem
from bilevel.core.problem import BilevelProblem, ProblemKindError
from bilevel.drivers.cpu_rewrites import CpuRewrites, CpuRewriteWarning
from bilevel.drivers.loop import iterate
from bilevel.drivers.online import OnlineResult, solve_online
from bilevel.drivers.results import DivergenceError, DivergenceWarning, Interrupted, Result
from bilevel.drivers.solve import solve
from bilevel.drivers.sweep import sweep
from bilevel.drivers.tuning import Tuning, TuningError, tune
from bilevel.solvers.online.settling import SettlingWarning

# The public modules keep their import paths (``import bilevel.sets``, ``from bilevel.metrics
# import hypergradient``): they live in their layers (core/, analysis/) and are published here.
for _module in (metrics, oracles, schedules, sets):
    _sys.modules[f"{__name__}.{_module.__name__.rsplit('.', 1)[1]}"] = _module
del _module


def __getattr__(name: str):
    # ``bl.meta`` and ``bl.data`` without importing them first; loaded on first use, since
    # they bring the network backbones and the dataset readers that most users never need
    if name in ("meta", "data"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__version__ = "0.1.0"

__all__ = [
    "BilevelProblem",
    "OnlineProblem",
    "solve",
    "iterate",
    "solve_online",
    "OnlineResult",
    "ProblemKindError",
    "sweep",
    "tune",
    "Tuning",
    "TuningError",
    "Result",
    "DivergenceWarning",
    "DivergenceError",
    "Interrupted",
    "CpuRewrites",
    "CpuRewriteWarning",
    "solvers",
    "problems",
    "sets",
    "schedules",
    "oracles",
    "metrics",
    "meta",
    "data",
    "diagnose",
    "Diagnosis",
    "NotStronglyConvexWarning",
    "SettlingWarning",
]

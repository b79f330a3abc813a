"""bilevel: gradient-based bilevel optimization in JAX.

    min_{x in X} F(x) = f(x, y*(x))    s.t.   y*(x) = argmin_y g(x, y)

Quick start::

    import bilevel as bl
    problem = bl.problems.quadratic(dx=10, dy=50, cond=10.0)
    solver = bl.solvers.make("f2sa", lr_outer=0.05, lr_inner=0.1)
    res = bl.solve(problem, solver, steps=2000, seeds=[0, 1, 2])
    res.history  # step, samples, oracle calls, seconds, grad_norm, ...
"""

from . import metrics, oracles, problems, sets, solvers
from .diagnose import Diagnosis, NotStronglyConvexWarning, diagnose
from .problem import BilevelProblem
from .run import DivergenceError, DivergenceWarning, Interrupted, Result, solve
from .sweep import sweep

__version__ = "0.1.0"

__all__ = [
    "BilevelProblem",
    "solve",
    "sweep",
    "Result",
    "DivergenceWarning",
    "DivergenceError",
    "Interrupted",
    "solvers",
    "problems",
    "sets",
    "oracles",
    "metrics",
    "diagnose",
    "Diagnosis",
    "NotStronglyConvexWarning",
]

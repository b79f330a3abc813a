"""Per-solver settings for the shared test battery (tests/test_solvers_battery.py).

A solver not listed runs the battery with ``DEFAULT`` settings; list it when its paper's
step-size rules need other values. Settings are for the deterministic quadratic
(``bl.problems.quadratic()``: mu_g = 1, L_g = 10, L_F ~ 10.5). Besides the entries below, every
module ``tests/solver_settings_*.py`` may define ``SETTINGS`` and ``DROP`` dicts that are merged
in (one file per family of solvers keeps their authors out of each other's way).
"""

import importlib
import pathlib

import numpy as np

DEFAULT = {"lr_outer": 0.05, "lr_inner": 0.1}

SETTINGS = {
    "f2sa": {
        "lr_outer": 0.05,
        "lr_inner": 0.18,
        "regime": "constant",
        "lam0": 100.0,
        "inner_steps": 20,
    },
    "stocbio": {"lr_outer": 0.05, "lr_inner": 0.18, "neumann_steps": 30},
}

#: Factor by which ||grad F|| must fall in the battery's convergence check (200 steps).
DROP = {"default": 30.0}


for _path in sorted(pathlib.Path(__file__).parent.glob("solver_settings_*.py")):
    _module = importlib.import_module(_path.stem)
    SETTINGS.update(getattr(_module, "SETTINGS", {}))
    DROP.update(getattr(_module, "DROP", {}))


def settings(name: str) -> dict:
    return dict(SETTINGS.get(name, DEFAULT))


def drop(name: str) -> float:
    return DROP.get(name, DROP["default"])


# ---- Frank-Wolfe methods (IBCG, SBFW): they need a bounded x_set ------------------------------
#: the battery's ball for Frank-Wolfe methods: radius = this x ||x*|| around the origin (x0 = 0 is
#: its center), so the unconstrained x* is interior and ||grad F|| still falls to zero
BALL_FACTOR = 1.1


def frank_wolfe(name: str) -> bool:
    """Whether solver ``name`` needs a bounded x_set (its LMO has no minimiser otherwise)."""
    import bilevel as bl

    return bl.solvers.get(name).needs_bounded_set


def problem_for(name: str, problem):
    """The battery's ``problem`` as solver ``name`` can take it: unchanged, except that a
    Frank-Wolfe method gets ``x_set = L2Ball(BALL_FACTOR ||x*||)`` (x* from the closed form)."""
    if not frank_wolfe(name):
        return problem
    import bilevel as bl

    radius = BALL_FACTOR * float(np.linalg.norm(problem.reference.x_star))
    return problem.replace(x_set=bl.sets.L2Ball(radius))


def diverging(name: str) -> dict:
    """Settings that make solver ``name`` diverge: a huge outer step, or for a Frank-Wolfe
    method (whose step gamma must lie in (0, 1], and whose x stays in X whatever it is) a huge
    inner step, which blows y up and with it the hypergradient estimate."""
    return {"lr_inner": 1e4} if frank_wolfe(name) else {"lr_outer": 1e4}

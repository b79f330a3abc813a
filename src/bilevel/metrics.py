"""Reference quantities for small problems: the exact inner solution and hypergradient.

``hypergradient`` is the implicit-function-theorem formula with dense linear algebra,

    grad F(x) = grad_x f(x, y*) - (d^2 g/dx dy)(x, y*) [(d^2 g/dy^2)(x, y*)]^{-1} grad_y f(x, y*),

on the full data (every sample), with ``y*(x)`` found by Newton's method. It is the reference
every solver test compares against; it costs O(dim(y)^3) and is meant for small problems.

With a constrained upper level (``problem.x_set``) ``||grad F(x)||`` is not zero at a solution,
so constrained runs are measured by the stationarity measures of constrained smooth
optimisation, both zero exactly at stationary points of F over X:

* :func:`fw_gap`, the Frank-Wolfe gap ``G(x) = max_{s in X} <grad F(x), x - s>`` (Jaggi 2013;
  the criterion of IBCG, Abolfazli et al. 2025, Definition 2.1), which needs a bounded X;
* :func:`grad_mapping`, the gradient mapping ``||x - Proj_X(x - grad F(x))||`` (Nesterov,
  "Introductory Lectures on Convex Optimization", 2004, Sec. 2.2.3), the measure of projected
  methods.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from . import oracles
from ._tree import tree_norm, tree_sub, tree_vdot
from .problem import BilevelProblem

PyTree = Any

__all__ = ["inner_solution", "hypergradient", "fw_gap", "grad_mapping", "default_metrics"]

#: ``default_metrics`` adds the exact ``fw_gap`` / ``grad_mapping`` of a constrained problem when
#: x and y have at most this many entries (the dense hypergradient costs O(dim(y)^3) per eval)
EXACT_METRICS_MAX_DIM = 1000


def inner_solution(
    problem: BilevelProblem, x: PyTree, y: PyTree | None = None, *, newton_steps: int = 30
) -> PyTree:
    """y*(x) by ``newton_steps`` Newton iterations on the full-data g, from ``y`` (or y0).

    Exact in one step for quadratic g; quadratically convergent for strongly convex smooth g.
    """
    g, data = problem.inner, problem.inner_data
    y = problem.y0 if y is None else y
    flat_y, unravel = ravel_pytree(y)

    def newton(fy, _):
        yt = unravel(fy)
        grad = ravel_pytree(oracles.grad_y(g, x, yt, data))[0]
        hess = oracles.hessian_yy(g, x, yt, data)
        return fy - jnp.linalg.solve(hess, grad), None

    flat_y, _ = jax.lax.scan(newton, flat_y, None, length=newton_steps)
    return unravel(flat_y)


def hypergradient(
    problem: BilevelProblem, x: PyTree, y: PyTree | None = None, *, newton_steps: int = 30
) -> PyTree:
    """The exact hypergradient grad F(x) (IFT with a dense inner solve), shaped like x."""
    f, g = problem.outer, problem.inner
    y_star = inner_solution(problem, x, y, newton_steps=newton_steps)
    gx_f, gy_f = oracles.grads(f, x, y_star, problem.outer_data)
    flat_gy, _ = ravel_pytree(gy_f)
    hess = oracles.hessian_yy(g, x, y_star, problem.inner_data)
    v = jnp.linalg.solve(hess, flat_gy)
    cross = oracles.jacobian_xy(g, x, y_star, problem.inner_data) @ v
    flat_gx, unravel_x = ravel_pytree(gx_f)
    return unravel_x(flat_gx - cross)


def _require_x_set(problem: BilevelProblem, metric: str):
    if problem.x_set is None:
        raise ValueError(
            f"{metric} needs a constrained upper level, but {problem.name} has no x_set; for an "
            "unconstrained problem use ||hypergradient(problem, x)||."
        )
    return problem.x_set


def fw_gap(problem: BilevelProblem, x: PyTree, grad: PyTree | None = None) -> jax.Array:
    """The Frank-Wolfe gap ``G(x) = max_{s in X} <grad F(x), x - s> = <grad F(x), x - LMO>``.

    Zero exactly at stationary points of F over X and an upper bound on ``F(x) - F*`` when F is
    convex (Abolfazli et al. 2025, Definition 2.1 and eq. (38)). Uses the exact dense
    :func:`hypergradient` unless ``grad`` is given (a solver's estimate gives the cheap
    surrogate ``<F_k, x_k - s_k>``).

    Raises:
        ValueError: when the problem has no ``x_set`` (or ``x_set.lmo`` refuses, as
            ``Reals`` does).
    """
    x_set = _require_x_set(problem, "fw_gap")
    grad = hypergradient(problem, x) if grad is None else grad
    return tree_vdot(grad, tree_sub(x, x_set.lmo(grad)))


def grad_mapping(
    problem: BilevelProblem, x: PyTree, step: float = 1.0, grad: PyTree | None = None
) -> jax.Array:
    """``||x - Proj_X(x - step * grad F(x))|| / step``, with the exact :func:`hypergradient`
    unless ``grad`` is given.

    The gradient mapping (Nesterov 2004, Sec. 2.2.3): ``||grad F(x)||`` when x is interior,
    zero exactly at stationary points of F over X.

    Raises:
        ValueError: when the problem has no ``x_set``.
    """
    x_set = _require_x_set(problem, "grad_mapping")
    grad = hypergradient(problem, x) if grad is None else grad
    moved = x_set.project(jax.tree.map(lambda a, g: a - step * g, x, grad))
    return tree_norm(tree_sub(x, moved)) / step


def _constrained_metrics(problem: BilevelProblem, x: PyTree, y: PyTree) -> dict[str, jax.Array]:
    """``fw_gap`` (bounded sets with an LMO) and ``grad_mapping`` of a small constrained
    problem, from one exact hypergradient; nothing for a large or unconstrained one."""
    from . import sets

    dims = (ravel_pytree(x)[0].size, ravel_pytree(y)[0].size)
    if problem.x_set is None or max(dims) > EXACT_METRICS_MAX_DIM:
        return {}
    grad = hypergradient(problem, x, y)
    out = {"grad_mapping": grad_mapping(problem, x, grad=grad)}
    # the sets whose LMO is finite by construction (a Box may have infinite bounds, and whether
    # they are is not known while the set's parameters are traced)
    if isinstance(problem.x_set, sets.L2Ball | sets.L1Ball | sets.Simplex | sets.NuclearBall):
        out["fw_gap"] = fw_gap(problem, x, grad)
    return out


def default_metrics(problem: BilevelProblem, x: PyTree, y: PyTree) -> dict[str, jax.Array]:
    """Cheap metrics every problem gets: full-data outer loss and inner gradient norm.

    For a constrained problem (``x_set``) with at most ``EXACT_METRICS_MAX_DIM`` entries in x
    and in y, also the exact ``grad_mapping`` and (for a ball or simplex) ``fw_gap``, which
    measure stationarity where ``||grad F||`` does not (one dense hypergradient per call).
    Plus the problem's own ``metrics(x, y)`` (exact ones for closed-form problems). A problem
    whose full data is too large to evaluate often may return its own ``outer_loss`` /
    ``inner_grad_norm`` (on a fixed subset, say, documented by the problem); those replace the
    full-data ones, which are then not computed.
    """
    own = {}
    if problem.metrics is not None:
        own = {k: jnp.asarray(v) for k, v in problem.metrics(x, y).items()}
    out = {}
    if "outer_loss" not in own:
        out["outer_loss"] = problem.outer(x, y, problem.outer_data)
    if "inner_grad_norm" not in own:
        out["inner_grad_norm"] = tree_norm(oracles.grad_y(problem.inner, x, y, problem.inner_data))
    out.update(_constrained_metrics(problem, x, y))
    out.update(own)
    return out

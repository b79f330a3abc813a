"""Reference quantities for small problems: the exact inner solution and hypergradient.

``hypergradient`` is the implicit-function-theorem formula with dense linear algebra,

    grad F(x) = grad_x f(x, y*) - (d^2 g/dx dy)(x, y*) [(d^2 g/dy^2)(x, y*)]^{-1} grad_y f(x, y*),

on the full data (every sample), with ``y*(x)`` found by Newton's method. It is the reference
every solver test compares against; it costs O(dim(y)^3) and is meant for small problems.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from . import oracles
from ._tree import tree_norm
from .problem import BilevelProblem

PyTree = Any

__all__ = ["inner_solution", "hypergradient", "default_metrics"]


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


def default_metrics(problem: BilevelProblem, x: PyTree, y: PyTree) -> dict[str, jax.Array]:
    """Cheap metrics every problem gets: full-data outer loss and inner gradient norm.

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
    out.update(own)
    return out

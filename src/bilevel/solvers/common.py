"""Pieces shared by several solvers (inner loops, implicit-gradient assembly).

New shared helpers are appended at the end of this file; solvers import them from here rather
than writing their own copy.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from .. import oracles
from .._tree import tree_axpy, tree_sub
from ..problem import BilevelProblem
from ..sampling import Minibatches

PyTree = Any

__all__ = ["inner_sgd", "implicit_hypergradient"]


def inner_sgd(problem: BilevelProblem, mb: Minibatches, x, y, lr, num_steps: int, first: int = 0):
    """``num_steps`` (stochastic) gradient steps on g(x, .) from y.

    Step t uses the inner draw ``first + t`` of ``mb`` (full data when deterministic).
    """

    def body(y_, t):
        return tree_axpy(-lr, oracles.grad_y(problem.inner, x, y_, mb.inner(first + t)), y_), None

    y, _ = jax.lax.scan(body, y, jnp.arange(num_steps))
    return y


def implicit_hypergradient(problem: BilevelProblem, x, y, v, grad_x_f, cross_batch) -> PyTree:
    """``grad_x f - (d^2 g / dx dy) v``: the implicit-function hypergradient given the adjoint
    ``v ~ [d^2 g/dy^2]^{-1} grad_y f`` (AID, stocBiO, TTSA, STABLE's x-direction)."""
    return tree_sub(grad_x_f, oracles.cross_xy(problem.inner, x, y, cross_batch, v))

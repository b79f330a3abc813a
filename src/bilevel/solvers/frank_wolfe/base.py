r"""What the Frank-Wolfe (projection-free) bilevel methods share: IBCG and SBFW.

Both methods of the IBCG paper's comparison (Abolfazli, Jiang, Mokhtari, Yazdandoost Hamedani,
"An Inexact Conditional Gradient Method for Constrained Bilevel Optimization", preprint,
arXiv:2306.02429, Sec. 5 and App. G.1) reach the compact convex set X only through its linear
minimization oracle (LMO) and move by a convex combination

    s_k = argmin_{s in X} <s, d_k>,        x_{k+1} = x_k + step (s_k - x_k),

which stays in X for a step in [0, 1]. The Frank-Wolfe gap of the direction,
``<d_k, x_k - s_k>``, comes for free and is what they record as ``fw_gap_estimate``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from bilevel.core import oracles
from bilevel.core.problem import BilevelProblem
from bilevel.core.tree import tree_axpy, tree_sub, tree_vdot
from bilevel.solvers.base import Solver

PyTree = Any

__all__ = ["FrankWolfeSolver", "frank_wolfe_step", "dense_adjoint", "merge_counts"]


def frank_wolfe_step(
    problem: BilevelProblem, x, direction, step, vertex=None
) -> tuple[PyTree, jax.Array]:
    """``(x + step (s - x), <direction, x - s>)`` with ``s = LMO_X(direction)``: the
    convex-combination step and the Frank-Wolfe gap of the direction (IBCG lines 6-7; SBFW's
    ``x_{k+1} = (1 - eta_k) x_k + eta_k s_k``). ``vertex``: s when the caller computed it
    (IBCG's warm-started nuclear-ball LMO)."""
    vertex = problem.x_set.lmo(direction) if vertex is None else vertex
    to_vertex = tree_sub(vertex, x)
    return tree_axpy(step, to_vertex, x), -tree_vdot(direction, to_vertex)


def dense_adjoint(problem: BilevelProblem, x, y, rhs, batch) -> PyTree:
    """``[d2g/dy2 (x, y)]^{-1} rhs`` by a dense solve, O(m^3): the exact Hessian inverse of
    IBCG's eq. (6) scheme and of "SBFW with Hessian inverse" (App. G.2), small problems only."""
    flat, unravel = ravel_pytree(rhs)
    hess = oracles.hessian_yy(problem.inner, x, y, batch)
    return unravel(jnp.linalg.solve(hess, flat))


def merge_counts(*counts: dict[str, Any]) -> dict[str, Any]:
    """The sum of several ``{kind: calls}`` dicts."""
    out: dict[str, Any] = {}
    for c in counts:
        for kind, n in c.items():
            out[kind] = out.get(kind, 0) + n
    return out


@dataclasses.dataclass(frozen=True)
class FrankWolfeSolver(Solver):
    """Base of the Frank-Wolfe methods (not registered): they need a bounded ``x_set``, take
    no outer optimiser (the step is a convex combination), and record the FW gap of their own
    direction. Their states carry ``fw_gap_estimate``."""

    needs_bounded_set: ClassVar[bool] = True
    #: the Frank-Wolfe step follows the paper's rule (IBCG's gamma, SBFW's eta_k), not a tuning run
    tuned_step_sizes: ClassVar[tuple[str, ...]] = ()

    def _check_plain_steps(self) -> None:
        """Refuse an outer optimiser: there is no gradient step to transform."""
        if self.outer_optimizer != "sgd":
            raise ValueError(
                f"{type(self).__name__}(outer_optimizer={self.outer_optimizer!r}): a "
                "Frank-Wolfe step is the convex combination x + gamma (s - x); only 'sgd' (no "
                "transform) applies."
            )

    def state_metrics(self, state) -> dict[str, jax.Array]:
        """``hypergrad_estimate_norm`` (the direction's norm) and ``fw_gap_estimate``
        (``<d_k, x_k - s_k>``, the FW gap of the method's own direction)."""
        return super().state_metrics(state) | {"fw_gap_estimate": state.fw_gap_estimate}

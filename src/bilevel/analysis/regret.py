"""The bilevel local regret of an online run (Jia & Chen, arXiv:2602.11665, eq. (2)):

    BLReg(T) = sum_{t=1}^T || G_X(x_t, grad F_t(x_t), gamma) ||^2,
    G_X(x, g, gamma) = (x - Proj_X(x - gamma g)) / gamma          (eq. (3); = g when X = R^d)

at the committed x_t, with the exact hypergradient of round t, which the learner never sees.
Three oracles for grad F_t, picked by :func:`choose` (``"auto"``: the first that applies):

* ``"closed form"``: the problem's ``reference.grad_F(t, x)`` (the synthetic streams);
* ``"dense inner solve"``: y*_t(x_t) by dense Newton from the committed y_t, then the implicit
  function formula with a dense Hessian solve (``bl.metrics.dense_hypergradient``, the same
  reference every offline solver test uses), when y has at most :data:`DENSE_MAX_DIM` entries;
* ``"reference solve"``: many gradient steps on g_t and a conjugate-gradient adjoint
  (``bl.metrics.reference_hypergradient``) for larger y.

Both solves run on round t's evaluation data (all of its held samples, or a sampler's draw at
the fixed evaluation key). ``bl.solve_online`` evaluates the regret outside its timed region
and outside the oracle counts: it is a measurement, not part of any algorithm.
"""

from __future__ import annotations

from typing import Any

import jax

from bilevel.analysis import metrics
from bilevel.core.tree import tree_size, tree_vdot

__all__ = [
    "ORACLES",
    "DENSE_MAX_DIM",
    "REFERENCE_CG_STEPS",
    "choose",
    "describe",
    "hypergradient",
    "regret_term",
]

ORACLES = ("closed form", "dense inner solve", "reference solve")
#: the dense oracle's largest y (entries): one dense Hessian and a Newton solve per round and
#: seed, O(dim(y)^3) each; above this the matrix-free reference solve is cheaper
DENSE_MAX_DIM = 500
#: conjugate-gradient iterations of the reference solve's adjoint
REFERENCE_CG_STEPS = 200


def choose(problem, regret: str) -> str:
    """The oracle named by ``regret`` (``"auto"``: closed form, else dense, else reference).

    Raises:
        ValueError: an unknown name, or ``"closed form"`` without ``reference.grad_F``.
    """
    has_closed_form = callable(getattr(problem.reference, "grad_F", None))
    if regret == "auto":
        if has_closed_form:
            return "closed form"
        return "dense inner solve" if tree_size(problem.y0) <= DENSE_MAX_DIM else "reference solve"
    if regret not in ORACLES:
        raise ValueError(
            f"solve_online(regret={regret!r}) is unknown; use 'auto', one of {ORACLES}, or None "
            "(no regret)."
        )
    if regret == "closed form" and not has_closed_form:
        raise ValueError(
            f"solve_online(regret='closed form') needs problem.reference.grad_F(t, x), which "
            f"{problem.name} does not have; use regret='auto'."
        )
    return regret


def describe(oracle: str, reference_steps: int) -> str:
    """The oracle in words, as ``OnlineResult.regret_oracle`` reports it."""
    if oracle == "reference solve":
        return f"reference solve ({reference_steps} GD steps + {REFERENCE_CG_STEPS} CG)"
    return oracle


def hypergradient(problem, oracle: str, t, x, y, reference_steps: int) -> Any:
    """grad F_t(x) by ``oracle``, the inner solves warm-started at ``y`` (the committed y_t)."""
    if oracle == "closed form":
        return problem.reference.grad_F(t, x)
    f, g = problem.at_round(t)
    outer_data, inner_data = problem.evaluation_data(t)
    if oracle == "dense inner solve":
        return metrics.dense_hypergradient(f, g, x, y, outer_data, inner_data)
    return metrics.reference_hypergradient(
        f, g, x, y, outer_data, inner_data, gd_steps=reference_steps, cg_steps=REFERENCE_CG_STEPS
    )


def regret_term(x_set, x, grad, gamma) -> jax.Array:
    """||G_X(x, grad, gamma)||^2, one round's term of eq. (2)."""
    mapping = metrics.gradient_mapping(x_set, x, grad, gamma)
    return tree_vdot(mapping, mapping)

"""Pieces shared by several solvers (inner loops, implicit-gradient assembly).

New shared helpers are appended at the end of this file; solvers import them from here rather
than writing their own copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from bilevel.core import oracles
from bilevel.core.problem import BilevelProblem
from bilevel.core.sampling import Minibatches
from bilevel.core.tree import tree_axpy, tree_norm, tree_sub

PyTree = Any

__all__ = [
    "inner_sgd",
    "implicit_hypergradient",
    "penalty_inner_loop",
    "penalty_x_gradient",
    "linear_system_hypergradient",
    "descend_until",
    "Levels",
    "MINIBATCH_FRACTION",
    "fastest_contraction_step",
]


class Levels(NamedTuple):
    """A round's level functions ``f(x, y, batch)``, ``g(x, y, batch)`` in the shape the offline
    pieces below take a problem (``.outer``, ``.inner``), so the online methods reuse them on
    ``problem.at_round(t)``: ``inner_sgd``, ITD's unroll, ``implicit_hypergradient``."""

    outer: Callable
    inner: Callable


def inner_sgd(problem: BilevelProblem, mb: Minibatches, x, y, lr, num_steps: int, first: int = 0):
    """``num_steps`` (stochastic) gradient steps on g(x, .) from y.

    Step t uses the inner draw ``first + t`` of ``mb`` (full data when deterministic).
    """

    def body(y_, t):
        return tree_axpy(-lr, oracles.grad_y(problem.inner, x, y_, mb.inner(first + t)), y_), None

    if num_steps == 1:  # no loop: the step's other derivatives at (x, y) on the same draw
        return body(y, 0)[
            0
        ]  # (SOBA's) then share its forward pass (bilevel.drivers._xla_cpu.dot_merge)
    y, _ = jax.lax.scan(body, y, jnp.arange(num_steps))
    return y


def implicit_hypergradient(problem: BilevelProblem, x, y, v, grad_x_f, cross_batch) -> PyTree:
    """``grad_x f - (d^2 g / dx dy) v``: the implicit-function hypergradient given the adjoint
    ``v ~ [d^2 g/dy^2]^{-1} grad_y f`` (AID, stocBiO, TTSA, STABLE's x-direction)."""
    return tree_sub(grad_x_f, oracles.cross_xy(problem.inner, x, y, cross_batch, v))


# ---- the fully first-order penalty family (F2SA, F2OBO) ------------------------------------
def penalty_inner_loop(f, g, x, y, z, *, lr_z, lr_y, lam, num_steps: int, draws):
    """``num_steps`` steps of the two inner sequences of the fully first-order penalty methods
    (Kwon et al., ICML 2023, Algorithm 1, F2SA; Jia & Chen, arXiv:2602.11665, Algorithm 1 lines
    4-7, F2OBO), each from the other's old value (they are independent)::

        z <- z - lr_z grad_y g(x, z)                          (tracks y*(x) = argmin_y g)
        y <- y - lr_y (grad_y f(x, y) + lam grad_y g(x, y))   (tracks y*_lam = argmin f + lam g)

    ``f(x, y, batch)`` and ``g`` are the level functions (an online method passes round t's);
    ``draws(k)`` gives inner step k's batches ``(g at z, f at y, g at y)`` (k traced). Returns
    ``(y, z)``. ``num_steps`` may be traced (SF2OBO's K_t = ceil(4 kappa_g log t)): the loop is
    then a ``while_loop``; an int gives a ``scan``, as ``fori_loop`` does with static bounds.
    """

    def body(k, carry):
        y_, z_ = carry
        batch_gz, batch_f, batch_gy = draws(k)
        z_new = tree_axpy(-lr_z, oracles.grad_y(g, x, z_, batch_gz), z_)
        direction = tree_axpy(
            lam, oracles.grad_y(g, x, y_, batch_gy), oracles.grad_y(f, x, y_, batch_f)
        )
        return tree_axpy(-lr_y, direction, y_), z_new

    return jax.lax.fori_loop(0, num_steps, body, (y, z))


def penalty_x_gradient(f, g, x, y, z, lam, batch_f, batch_gy, batch_gz) -> PyTree:
    """The x-gradient of the penalty surrogate at fixed (detached) y and z,

        grad_x f(x, y) + lam (grad_x g(x, y) - grad_x g(x, z)),

    the estimate of grad L*_lam(x) (Kwon et al. 2023, Lemma 3.1; Jia & Chen, eq. (6) and
    Algorithm 1 line 9), with the given batches of f at y, g at y and g at z (one sample for
    both g terms is the same batch given twice). Three first-order calls; the difference of
    the two g terms is taken before it is scaled by lam (with lam in the thousands, as F2OBO's
    lam_t = 5t soon is, the error of the product is lam times the bias of y and z, which
    dominates this rounding).
    """
    h_fx = oracles.grad_x(f, x, y, batch_f)
    h_gxy = oracles.grad_x(g, x, y, batch_gy)
    h_gxz = oracles.grad_x(g, x, z, batch_gz)
    return tree_axpy(lam, tree_sub(h_gxy, h_gxz), h_fx)


# ---- the online hypergradient methods (AOBO, FSOBO, SOGD) -----------------------------------
def linear_system_hypergradient(
    f, g, x, y, v, *, lr, num_steps: int, outer_batch, hessian_batch, cross_batch
):
    """The adjoint and implicit hypergradient of an online hypergradient method at (x, y):

        v <- v - lr (d^2 g/dy^2 (x, y) v - grad_y f(x, y))     (num_steps times, from v)
        h  = grad_x f(x, y) - d^2 g/dx dy (x, y) v

    gradient descent on the linear system warm-started from the previous round's v
    (``linsolve.fixed_point``; one step is SOBA's ``LinearSystemStep``), then the hypergradient
    with the new v (:func:`implicit_hypergradient`). ``f``, ``g`` are round t's level
    functions; ``outer_batch`` feeds both partials of f (one fused call), ``hessian_batch(i)``
    the i-th product (i traced), ``cross_batch`` the cross term. Returns ``(v, h)``; costs one
    grad_f, ``num_steps`` hvp and one cross.
    """
    from bilevel.core import linsolve  # here, so that this section only appends to the module

    gx_f, gy_f = oracles.grads(f, x, y, outer_batch)
    v = linsolve.fixed_point(
        lambda u, i: oracles.hvp_yy(g, x, y, hessian_batch(i), u),
        gy_f,
        lr=lr,
        num_iters=num_steps,
        init=v,
        indexed=True,
    )
    return v, implicit_hypergradient(Levels(f, g), x, y, v, gx_f, cross_batch)


# ---- adaptive inner loops (AOBO, AF2OBO) ----------------------------------------------------
def descend_until(grad, v, lr, tol, max_steps: int):
    """Gradient steps ``v <- v - lr grad(v, i)`` while ``||grad(v, i)|| > tol`` and fewer than
    ``max_steps`` were made (a ``lax.while_loop``): the adaptive inner loops of AOBO (Jia, Wang
    & Chen, arXiv:2602.06457) and AF2OBO (Jia & Chen, arXiv:2602.11665, Algorithm 2 lines 4-8).
    ``grad(v, i)`` is evaluated on draw ``i`` (the step count so far; a method that keeps one
    batch ignores it), and the gradient of each test is the one its step uses, so ``steps + 1``
    gradients in all. Returns ``(v, steps, ||grad||)`` with ``steps`` an int32 and the norm
    that stopped the loop. A non-finite gradient fails the test and stops the loop."""

    def cond(carry):
        _, _, norm, i = carry
        return (norm > tol) & (i < max_steps)

    def body(carry):
        v_, d, _, i = carry
        v_ = tree_axpy(-lr, d, v_)
        d = grad(v_, i + 1)
        return v_, d, tree_norm(d), i + 1

    zero = jnp.zeros((), jnp.int32)
    d0 = grad(v, zero)
    v, _, norm, steps = jax.lax.while_loop(cond, body, (v, d0, tree_norm(d0), zero))
    return v, steps, norm


#: with minibatches a ``2/(mu_g + L_g)`` step is this fraction of itself
#: (:func:`fastest_contraction_step`)
MINIBATCH_FRACTION = 0.5


def fastest_contraction_step(mu_g: float, L_g: float, minibatches: bool) -> float:
    """``2 / (mu_g + L_g)``, the step of gradient descent on a mu_g-strongly convex, L_g-smooth
    function whose contraction ``(kappa - 1) / (kappa + 1)`` is the fastest (IBCG's Lemma B.1,
    PZOBO-S's Theorem 2), times :data:`MINIBATCH_FRACTION` when the run draws minibatches.

    Why half: that step has no margin (the stiffest direction's factor is ``-(kappa - 1) /
    (kappa + 1)``, close to -1), and a recursion on minibatches sees a new Hessian every step,
    with ``L_g`` estimated once (the largest of the batches') and re-estimated every 25 steps
    along the path. At 0.99 of it IBCG's adjoint ``w - eta (H_B w - b)`` ran away on a
    hyper-cleaning with batches of 32 (FW gap estimate 22-190; at half: 0.06-0.07); PZOBO-S's
    inner paths, whose differences give its Jacobian estimate, ended at 0.286 of the start's
    ``||grad F||`` on ``benchmarks/defaults.py``'s ``ridge_raw`` with batches of 32 (``L_g``
    rises 36x along the path), at half at 0.063 (measured 2026-11-29)."""
    step = 2.0 / (mu_g + L_g)
    return step * MINIBATCH_FRACTION if minibatches else step

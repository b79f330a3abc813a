"""Matrix-free approximate solvers of ``H u = b`` for a symmetric positive definite ``H``.

Bilevel methods need ``u = [∇²_yy g]^{-1} ∇_y f`` but can only afford Hessian-vector
products, so ``H`` is given *only* as a linear map ``matvec(v) -> H v`` acting on pytrees
(``v`` and ``b`` may be any pytrees of real arrays with identical structure, e.g. nested
dicts of parameters). The solvers are

* :func:`cg` -- conjugate gradient (AID-CG),
* :func:`fixed_point` -- gradient descent on the quadratic (AID-FP),
* :func:`neumann` -- truncated Neumann series, optionally with a fresh (stochastic)
  Hessian per factor (stocBiO),
* :func:`dense_solve` -- an exact dense reference for small problems.

All iterative solvers take a *static* iteration count (a Python ``int``) and loop with
:func:`jax.lax.scan`, so their cost is fixed, they compose with ``jit``/``vmap``/``grad`` and
they can be nested inside an outer ``lax.scan``. Early stopping (``cg`` with ``tol > 0``)
freezes the iterate with ``jnp.where``; it never shortens the loop, so the matvec count is
the same whether or not the tolerance is met.

References:
    M. R. Hestenes and E. Stiefel. Methods of conjugate gradients for solving linear
    systems. J. Res. Natl. Bur. Stand., 49(6):409-436, 1952.

    R. Grazzi, L. Franceschi, M. Pontil, S. Salzo. On the iteration complexity of
    hypergradient computation. ICML 2020.

    K. Ji, J. Yang, Y. Liang. Bilevel optimization: convergence analysis and enhanced
    design. ICML 2021 (stocBiO, Algorithm 3).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from bilevel.core.tree import (
    tree_add,
    tree_axpy,
    tree_scale,
    tree_sub,
    tree_vdot,
    tree_where,
    tree_zeros_like,
)

PyTree = Any
MatVec = Callable[[PyTree], PyTree]

__all__ = ["cg", "dense_solve", "fixed_point", "neumann"]


# --------------------------------------------------------------------------------------
# argument validation (static values only: traced values cannot be inspected under jit)
# --------------------------------------------------------------------------------------


def _check_count(name: str, value: Any, minimum: int) -> int:
    """Return ``value`` as a Python int, or raise if it is not a static integer >= minimum.

    The count fixes the length of a ``lax.scan``, so it must be known at trace time; bools
    are rejected because ``True`` iterations is almost certainly a bug.
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(
            f"{name} must be a Python int >= {minimum} (a static iteration count), "
            f"got {value!r} of type {type(value).__name__}"
        )
    value = operator.index(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _concrete_float(value: Any) -> float | None:
    """``float(value)`` if it is a concrete scalar, ``None`` if traced (jit/vmap/grad)."""
    try:
        return float(value)
    except (TypeError, jax.errors.ConcretizationTypeError):
        # A tracer (e.g. lr batched by vmap or an argument of a jitted function) cannot be
        # checked; the caller then owns its validity.
        return None


def _check_positive(name: str, value: Any) -> None:
    concrete = _concrete_float(value)
    # `not concrete > 0` also rejects NaN.
    if concrete is not None and not concrete > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


def _check_nonnegative(name: str, value: Any) -> None:
    concrete = _concrete_float(value)
    if concrete is not None and not concrete >= 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")


def _match_dtypes(new: PyTree, old: PyTree) -> PyTree:
    """Cast ``new`` leafwise to the dtypes of ``old``.

    A scan carry must keep its dtype across iterations; a scalar step size computed by
    summing inner products over leaves of mixed precision (float32 and float64) would
    otherwise silently promote float32 leaves.
    """
    return jax.tree.map(lambda n, o: jnp.asarray(n, dtype=jnp.result_type(o)), new, old)


def _as_float_arrays(tree: PyTree) -> PyTree:
    """Leaves as JAX arrays; integer/bool leaves become the default float dtype.

    The iterates inherit the dtypes of ``b``, and an integer iterate would truncate steps.
    """

    def convert(leaf):
        leaf = jnp.asarray(leaf)
        if jnp.issubdtype(leaf.dtype, jnp.inexact):
            return leaf
        return leaf.astype(jnp.result_type(float))

    return jax.tree.map(convert, tree)


# --------------------------------------------------------------------------------------
# conjugate gradient
# --------------------------------------------------------------------------------------


def cg(
    matvec: MatVec,
    b: PyTree,
    *,
    num_iters: int,
    init: PyTree | None = None,
    tol: float = 0.0,
    indexed: bool = False,
) -> PyTree:
    r"""Conjugate gradient for ``H u = b`` with ``H`` symmetric positive definite.

    Starting from ``u_0 = init`` (zeros if ``None``), ``r_0 = b - H u_0``, ``p_0 = r_0``,
    each iteration performs

    .. math::

        \alpha_k = \frac{r_k^\top r_k}{p_k^\top H p_k},\quad
        u_{k+1} = u_k + \alpha_k p_k,\quad
        r_{k+1} = r_k - \alpha_k H p_k,\quad
        \beta_k = \frac{r_{k+1}^\top r_{k+1}}{r_k^\top r_k},\quad
        p_{k+1} = r_{k+1} + \beta_k p_k.

    In exact arithmetic the ``H``-norm error ``||u_k - H^{-1} b||_H`` is non-increasing and
    the solution is reached after at most ``n`` iterations (``n`` = total size of ``b``).

    Early stopping: once the (recursively updated) residual satisfies
    ``||r_k|| <= max(tol, eps) * ||b||`` (``eps`` the dtype's machine epsilon: a residual at
    the rounding level of ``b``; in particular ``r_k = 0``, which covers ``b = 0`` with
    ``init=None``) the remaining iterations leave the iterate unchanged.
    The divisions by ``p^T H p`` and ``r^T r`` are guarded, so no NaN is produced after
    convergence. If ``p^T H p = 0`` before convergence (possible only if ``H`` is singular),
    the step is skipped and the search direction is reset to the residual. NaNs in ``b`` or
    produced by ``matvec`` propagate to the result (they are never mistaken for
    convergence). For an ``H`` that is not positive definite the iteration runs but its
    output is meaningless.

    Args:
        matvec: Linear map ``v -> H v`` on pytrees shaped like ``b``; ``H`` must be
            symmetric positive definite (e.g. a Hessian-vector product of a strongly convex
            lower-level objective).
        b: Right-hand side, a pytree of real arrays.
        num_iters: Number of CG iterations, a static Python int ``>= 0``.
        init: Starting point ``u_0`` (same structure as ``b``); ``None`` means zeros.
        tol: Relative residual tolerance ``>= 0``; ``0`` runs every iteration unless the
            residual falls to the rounding level ``eps * ||b||``.
        indexed: Call ``matvec(v, i)`` with ``i`` the iteration (a traced ``int32``,
            ``0, ..., num_iters - 1``), so the caller can use an independent minibatch Hessian
            per product (hypertorch's ``stochastic=True``); ``init`` must then be ``None``.

    Returns:
        The approximate solution ``u_{num_iters}``, a pytree like ``b``.

    Raises:
        ValueError: If ``num_iters`` is not an int ``>= 0`` or a concrete ``tol`` is
            negative.

    Complexity:
        Exactly ``num_iters`` matvecs, plus one for the initial residual when ``init`` is
        given. The loop always runs ``num_iters`` times (static cost); converged
        iterations only freeze the state.

    References:
        Hestenes & Stiefel, "Methods of conjugate gradients for solving linear systems",
        1952. Used as AID-CG in Grazzi et al., ICML 2020.
    """
    num_iters = _check_count("num_iters", num_iters, 0)
    _check_nonnegative("tol", tol)
    b = _as_float_arrays(b)

    if indexed and init is not None:
        raise ValueError("cg(indexed=True) starts from 0: the initial residual has no index.")
    if init is None:
        # u_0 = 0 gives r_0 = b for free: no matvec needed.
        x0 = tree_zeros_like(b)
        r0 = b
    else:
        x0 = _match_dtypes(_as_float_arrays(init), b)
        r0 = _match_dtypes(tree_sub(b, matvec(x0)), b)
    rs0 = tree_vdot(r0, r0)
    # Compare squared norms so no sqrt (and no sqrt'(0) = inf under grad) is needed. A residual
    # at the rounding level of b counts as converged too: iterating on it only adds rounding,
    # and its derivative (rs_new / rs with rs ~ 0) overflows in float32, which made forward-mode
    # Jacobians of a converged solve NaN (OAGD's round map on a 3-dimensional y).
    floor = jnp.finfo(jnp.result_type(rs0)).eps ** 2
    threshold = jnp.maximum(tol * tol, floor) * tree_vdot(b, b)

    def step(carry, i):
        x, r, p, rs = carry
        hp = matvec(p, i) if indexed else matvec(p)
        php = tree_vdot(p, hp)
        # Written as `not <=` so that a NaN residual counts as *not* converged: NaNs from
        # the matvec or from b propagate to the output instead of being frozen away.
        active = ~(rs <= threshold)  # rs == 0 always counts as converged
        ok = active & (php != 0)
        # Double-where: the untaken branch must not divide by zero, or grad would be NaN.
        alpha = jnp.where(ok, rs / jnp.where(ok, php, 1.0), 0.0)
        x_new = tree_where(ok, tree_axpy(alpha, p, x), x)
        r_new = tree_where(ok, tree_axpy(-alpha, hp, r), r)
        rs_new = tree_vdot(r_new, r_new)
        beta = jnp.where(ok, rs_new / jnp.where(ok, rs, 1.0), 0.0)
        # Converged: keep p (never used again). p^T H p = 0: beta = 0 restarts with p = r.
        p_new = tree_where(active, tree_axpy(beta, p, r_new), p)
        new = (x_new, r_new, p_new, rs_new)
        return _match_dtypes(new, carry), None

    carry0 = (x0, r0, r0, rs0)
    (x, _, _, _), _ = jax.lax.scan(step, carry0, jnp.arange(num_iters, dtype=jnp.int32))
    return x


# --------------------------------------------------------------------------------------
# Neumann series
# --------------------------------------------------------------------------------------


def neumann(
    matvec: Callable[..., PyTree],
    b: PyTree,
    *,
    lr: float,
    num_terms: int,
    indexed: bool = False,
) -> PyTree:
    r"""Truncated Neumann series approximation of ``H^{-1} b``.

    .. math::

        u = \eta \sum_{q=0}^{Q-1} (I - \eta H)^q b,
        \qquad \eta = \texttt{lr},\ Q = \texttt{num\_terms}.

    Since ``u - H^{-1} b = -(I - \eta H)^Q H^{-1} b``, the series converges to ``H^{-1} b``
    when ``||I - \eta H|| < 1``, i.e. ``0 < lr < 2 / L`` with ``L = λ_max(H)`` (``lr = 1/L``
    is the usual choice). The terms are computed by the recursion
    ``t_0 = b``, ``t_q = t_{q-1} - \eta H t_{q-1}``.

    Stochastic (stocBiO) variant: with ``indexed=True`` the map is called as
    ``matvec(v, q)`` with ``q`` the term index, a traced ``int32`` running over
    ``1, ..., Q-1``, so the caller can draw an independent minibatch Hessian ``H_q`` for
    every factor (e.g. ``jax.random.fold_in(key, q)``). The terms are then the chained
    products ``t_q = (I - \eta H_q) t_{q-1} = \prod_{j=1}^{q} (I - \eta H_j) b`` (``H_q``
    applied last), as in Ji, Yang & Liang (2021), Algorithm 3.

    Args:
        matvec: ``v -> H v`` (or ``(v, q) -> H_q v`` when ``indexed``) on pytrees like
            ``b``.
        b: Right-hand side, a pytree of real arrays.
        lr: Step size ``η > 0`` (may be traced, in which case it is not validated).
        num_terms: Number of terms ``Q``, a static Python int ``>= 1``; ``Q = 1`` returns
            ``lr * b``. An int array, maybe traced (a length that changes with the
            iteration, TTSA's ``t_max(k)``), runs a ``lax.fori_loop`` instead (not
            reverse-differentiable).
        indexed: Pass the term index ``q`` to ``matvec`` as a second argument.

    Returns:
        ``u``, a pytree like ``b``.

    Raises:
        ValueError: If ``num_terms`` is not an int ``>= 1`` or a concrete ``lr <= 0``.

    Complexity:
        Exactly ``num_terms - 1`` matvecs (term ``q = 0`` is ``b`` itself).

    References:
        Ji, Yang & Liang, "Bilevel optimization: convergence analysis and enhanced design",
        ICML 2021 (stocBiO, Algorithm 3). Also Lorraine et al., AISTATS 2020.
    """
    dynamic = isinstance(num_terms, jax.Array)  # a length computed at run time (maybe traced)
    if not dynamic:
        num_terms = _check_count("num_terms", num_terms, 1)
    _check_positive("lr", lr)
    b = _as_float_arrays(b)

    def step(carry, q):
        term, total = carry
        h_term = matvec(term, q) if indexed else matvec(term)
        term = tree_axpy(-lr, h_term, term)
        new = (term, tree_add(total, term))
        return _match_dtypes(new, carry), None

    if dynamic:  # a while loop, as the length may be known only at run time
        _, total = jax.lax.fori_loop(1, num_terms, lambda q, c: step(c, q)[0], (b, b))
        return _match_dtypes(tree_scale(lr, total), b)
    # q = 1, ..., Q-1 (the index is scanned over even when unused; it costs nothing).
    qs = jnp.arange(1, num_terms, dtype=jnp.int32)
    (_, total), _ = jax.lax.scan(step, (b, b), qs)
    return _match_dtypes(tree_scale(lr, total), b)


# --------------------------------------------------------------------------------------
# fixed-point iteration (gradient descent on the quadratic)
# --------------------------------------------------------------------------------------


def fixed_point(
    matvec: MatVec,
    b: PyTree,
    *,
    lr: float,
    num_iters: int,
    init: PyTree | None = None,
    indexed: bool = False,
) -> PyTree:
    r"""Fixed-point iteration (gradient descent on ``½ uᵀHu - bᵀu``) for ``H u = b``.

    .. math::

        u_{k+1} = u_k - \eta (H u_k - b),

    hence ``u_k - H^{-1} b = (I - \eta H)^k (u_0 - H^{-1} b)``; it converges for
    ``0 < lr < 2 / L``. From ``u_0 = 0`` the iterates coincide with the Neumann partial
    sums (``fixed_point(num_iters=k) == neumann(num_terms=k)``), but this form supports a
    warm start ``init``, which is how AID-FP reuses the previous outer step's solution.

    Args:
        matvec: Linear map ``v -> H v`` on pytrees like ``b``.
        b: Right-hand side, a pytree of real arrays.
        lr: Step size ``η > 0`` (may be traced, in which case it is not validated).
        num_iters: Number of iterations, a static Python int ``>= 0``.
        init: Starting point ``u_0``; ``None`` means zeros.
        indexed: Call ``matvec(v, i)`` with ``i`` the iteration (traced ``int32``,
            ``0, ..., num_iters - 1``): an independent minibatch Hessian per product.

    Returns:
        ``u_{num_iters}``, a pytree like ``b``.

    Raises:
        ValueError: If ``num_iters`` is not an int ``>= 0`` or a concrete ``lr <= 0``.

    Complexity:
        Exactly ``num_iters`` matvecs (the first one is spent on ``u_0`` even when it is
        zero, keeping the cost uniform and the body a single scan).

    References:
        Grazzi, Franceschi, Pontil & Salzo, "On the iteration complexity of hypergradient
        computation", ICML 2020 (AID-FP).
    """
    num_iters = _check_count("num_iters", num_iters, 0)
    _check_positive("lr", lr)
    b = _as_float_arrays(b)
    u0 = tree_zeros_like(b) if init is None else _match_dtypes(_as_float_arrays(init), b)

    def step(u, i):
        hu = matvec(u, i) if indexed else matvec(u)
        residual = tree_sub(hu, b)  # H u - b, the gradient of the quadratic
        return _match_dtypes(tree_axpy(-lr, residual, u), u), None

    u, _ = jax.lax.scan(step, u0, jnp.arange(num_iters, dtype=jnp.int32))
    return u


# --------------------------------------------------------------------------------------
# dense reference
# --------------------------------------------------------------------------------------


def dense_solve(matvec: MatVec, b: PyTree) -> PyTree:
    """Exact solve of ``H u = b`` by materialising ``H`` -- a reference for small problems.

    The pytree ``b`` is flattened with :func:`jax.flatten_util.ravel_pytree` to a vector of
    size ``n``; ``H`` is built column by column by applying ``matvec`` (vmapped) to the
    ``n`` identity columns, then ``jnp.linalg.solve`` (LU) is used, so ``H`` need not be
    symmetric here.

    Args:
        matvec: Linear map ``v -> H v`` on pytrees like ``b``; must be ``vmap``-able.
        b: Right-hand side, a pytree of real arrays.

    Returns:
        ``H^{-1} b``, a pytree like ``b``.

    Complexity:
        ``n`` matvecs (batched in one ``vmap``), ``O(n^2)`` memory for the dense matrix and
        ``O(n^3)`` time for the factorisation: only for tests and small problems.
    """
    flat_b, unravel = ravel_pytree(_as_float_arrays(b))
    n = flat_b.shape[0]
    if n == 0:
        return b

    def flat_matvec(v):
        return ravel_pytree(matvec(unravel(v)))[0]

    # vmap returns H e_i as row i, i.e. H^T; transpose so non-symmetric inputs are right too.
    columns = jax.vmap(flat_matvec)(jnp.eye(n, dtype=flat_b.dtype))
    return unravel(jnp.linalg.solve(columns.T, flat_b))

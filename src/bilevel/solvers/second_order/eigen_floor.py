r"""STABLE's ``Punder``: the projection onto ``{M : M >= floor I}`` and a factor to solve with.

Chen, Sun, Xiao, Yin, AISTATS 2022, eq. (9b): the Hessian estimate of each step is projected
onto the matrices whose eigenvalues are at least ``mu_g``, and (8a), (8b) solve with it. The
projection of a symmetric ``M = Q diag(lam) Q^T`` is ``Q diag(max(lam, floor)) Q^T``, which
needs an eigendecomposition; but where every eigenvalue is already above the floor it is ``M``
itself, and a Cholesky factorisation of ``M - floor I`` says so: it succeeds exactly when
``M - floor I`` is positive definite. :func:`floor_and_factor` tries that first (two Cholesky
factorisations, 12 against 132 us for one ``eigh`` at dim y = 50 on this CPU) and runs the
eigendecomposition only when the floor binds. Both branches return the same projection (up to
round-off: ``Q diag(lam) Q^T`` of an unfloored ``M`` is ``M``).

Under ``vmap`` (seeds, sweeps) a ``lax.cond`` with a batched predicate runs both branches;
:func:`floor_and_factor` is a ``custom_vmap`` that takes the Cholesky branch for the whole batch
when every member is certified, and the ``eigh`` branch for the whole batch otherwise, so a
batch also runs one branch.

:func:`smallest_eigenvalue` gives ``lambda_min`` of a symmetric matrix without its eigenvectors
(a tridiagonal reduction and bisection), for the ``mu_g="auto"`` floor.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap
from jax.scipy.linalg import cho_solve, eigh_tridiagonal

__all__ = [
    "floor_and_factor",
    "floor_eigenvalues",
    "smallest_eigenvalue",
    "solve_with_factor",
]


def symmetrize(matrix: jax.Array) -> jax.Array:
    """``(M + M^T)/2`` over the last two axes: the Frobenius projection onto the symmetric
    matrices; it removes round-off asymmetry (every sampled Hessian is symmetric)."""
    return 0.5 * (matrix + jnp.swapaxes(matrix, -1, -2))


def floor_eigenvalues(matrix: jax.Array, floor) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``Punder`` by eigendecomposition: ``Q diag(max(lam, floor)) Q^T`` of ``(M + M^T)/2``.

    ``matrix`` may carry leading batch axes (``floor`` then has them too, or is a scalar).

    Returns:
        ``(projected, eigenvalues, eigenvectors)``: the projected matrix and its
        eigendecomposition (eigenvalues >= floor, ascending).
    """
    lam, q = jnp.linalg.eigh(symmetrize(matrix))
    lam = jnp.maximum(lam, jnp.asarray(floor, lam.dtype)[..., None])
    return (q * lam[..., None, :]) @ jnp.swapaxes(q, -1, -2), lam, q


def _floor_and_factor(sym: jax.Array, floor: jax.Array) -> tuple[jax.Array, jax.Array]:
    """:func:`floor_and_factor` for arrays with any leading batch axes, one branch for all."""
    eye = jnp.broadcast_to(jnp.eye(sym.shape[-1], dtype=sym.dtype), sym.shape)
    # one batched call: two independent LAPACK calls in one program could deadlock jaxlib
    # 0.10.2's CPU thread pool under vmap (seen with two eigh calls, see STABLE)
    factors = jnp.linalg.cholesky(jnp.stack([sym - floor[..., None, None] * eye, sym]))
    # Cholesky of M - floor I succeeds (finite) iff lambda_min(M) > floor: Punder(M) = M
    unfloored = jnp.all(jnp.isfinite(factors[0]))

    def by_eigh():
        projected = symmetrize(floor_eigenvalues(sym, floor)[0])
        return projected, jnp.linalg.cholesky(projected)

    return jax.lax.cond(unfloored, lambda: (sym, factors[1]), by_eigh)


@custom_vmap
def floor_and_factor(sym: jax.Array, floor: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(Punder(sym), its lower Cholesky factor)`` for a symmetric ``sym`` and a scalar floor.

    The factor serves the solves of STABLE's (8a) and (8b) (:func:`solve_with_factor`). The
    eigendecomposition runs only where the floor binds (module docstring); the projection is
    symmetrised in that branch so that the factor is of a symmetric matrix.
    """
    return _floor_and_factor(sym, floor)


@floor_and_factor.def_vmap
def _floor_and_factor_batched(axis_size, in_batched, sym, floor):
    sym, floor = (
        a if batched else jnp.broadcast_to(a, (axis_size, *a.shape))
        for a, batched in zip((sym, floor), in_batched, strict=True)
    )
    # calling the custom_vmap function again: an enclosing vmap (seeds around a sweep's
    # grid) batches it by this same rule, so nested batches also run one branch
    return floor_and_factor(sym, floor), (True, True)


def solve_with_factor(factor: jax.Array, rhs: jax.Array) -> jax.Array:
    """``M^{-1} rhs`` from the lower Cholesky factor of ``M``."""
    return cho_solve((factor, True), rhs)


def smallest_eigenvalue(sym: jax.Array) -> jax.Array:
    """``lambda_min`` of a symmetric matrix, without eigenvectors: a tridiagonal reduction
    (LAPACK ``sytrd``) and one bisection (Sturm sequences), accurate to round-off like a full
    ``eigh`` and about 3x cheaper at dimension 50 (41 against 132 us on this CPU, float32; the
    reduction is 27 us of it, the bisection 14)."""
    if sym.shape[-1] == 1:
        return sym[0, 0]
    _, diagonal, off_diagonal, _ = jax.lax.linalg.tridiagonal(sym)
    return eigh_tridiagonal(
        diagonal, off_diagonal, eigvals_only=True, select="i", select_range=(0, 0)
    )[0]

"""Small pytree arithmetic used everywhere (x and y may be any pytrees of arrays).

Kept private and tiny on purpose: the solvers read like the papers' vector updates,
``tree_axpy(-lr, grad, y)`` for ``y - lr * grad``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any


def tree_add(a: PyTree, b: PyTree) -> PyTree:
    """a + b, leafwise."""
    return jax.tree.map(jnp.add, a, b)


def tree_sub(a: PyTree, b: PyTree) -> PyTree:
    """a - b, leafwise."""
    return jax.tree.map(jnp.subtract, a, b)


def tree_scale(s, a: PyTree) -> PyTree:
    """s * a for a scalar s."""
    return jax.tree.map(lambda leaf: s * leaf, a)


def tree_axpy(s, a: PyTree, b: PyTree) -> PyTree:
    """s * a + b for a scalar s (the workhorse of every gradient step)."""
    return jax.tree.map(lambda u, v: s * u + v, a, b)


def tree_vdot(a: PyTree, b: PyTree):
    """<a, b> summed over all leaves (real inner product)."""
    parts = jax.tree.leaves(jax.tree.map(lambda u, v: jnp.vdot(u, v), a, b))
    return sum(parts) if parts else jnp.zeros(())


def tree_norm(a: PyTree):
    """Euclidean norm over all leaves."""
    return jnp.sqrt(tree_vdot(a, a))


def tree_zeros_like(a: PyTree) -> PyTree:
    return jax.tree.map(jnp.zeros_like, a)


def tree_allfinite(a: PyTree):
    """A scalar bool: every entry of every leaf is finite."""
    leaves = [jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(a)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def tree_where(cond, a: PyTree, b: PyTree) -> PyTree:
    """Leafwise select by a scalar condition (broadcast)."""
    return jax.tree.map(lambda u, v: jnp.where(cond, u, v), a, b)


def tree_size(a: PyTree) -> int:
    """Total number of scalar entries (a static Python int)."""
    return sum(int(jnp.size(leaf)) for leaf in jax.tree.leaves(a))

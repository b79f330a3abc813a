"""First- and second-order oracles of ``f`` and ``g``, derived by autodiff in one place.

Every solver asks for derivatives here, never with its own ``jax.grad``, so that conventions
(which argument is which, forward-over-reverse for HVPs) and the call accounting are uniform.

Notation, for a scalar ``h(x, y)`` (``f`` or ``g``) with x in X and y in Y:

* ``grad_x h``, ``grad_y h``: partial gradients, the other argument held fixed (no
  differentiation through y as a function of x: that is what "partial" means in every paper);
* ``hvp_yy(h)[v] = (d^2 h / dy^2) v`` for v in Y;
* ``cross_xy(h)[v] = (d^2 h / dx dy) v`` in X for v in Y (the ``nabla^2_{xy} g v`` of AID,
  stocBiO and STABLE's x-update): the x-gradient of ``<grad_y h, v>``;
* ``cross_yx(h)[u] = (d^2 h / dy dx) u`` in Y for u in X: the directional derivative of
  ``grad_y h`` along x (used by STABLE's y-correction and by forward-mode Jacobians).

:class:`Counts` tallies samples and calls by kind; each solver adds what it used.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from bilevel.core.tree import tree_vdot

PyTree = Any

__all__ = [
    "Counts",
    "grad_x",
    "grad_y",
    "grads",
    "value_and_grads",
    "hvp_yy",
    "cross_xy",
    "cross_yx",
    "hvp_and_cross",
    "hessian_yy",
    "jacobian_xy",
    "jacobian_yx",
]


class Counts(NamedTuple):
    """Samples drawn and oracle calls made, by kind (int32 scalars; summed per step).

    A fused call (both partial gradients from one backward pass) counts once.
    """

    samples_outer: jax.Array  # data points of the outer (f) data drawn
    samples_inner: jax.Array  # data points of the inner (g) data drawn
    grad_f: jax.Array  # gradient evaluations of f (partial or fused)
    grad_g: jax.Array  # gradient evaluations of g
    value_f: jax.Array  # function evaluations of f (zeroth-order methods)
    value_g: jax.Array  # function evaluations of g
    hvp: jax.Array  # Hessian-vector products in y
    cross: jax.Array  # cross second-derivative products (either direction)
    dense: jax.Array  # dense Hessian / Jacobian evaluations

    @classmethod
    def zeros(cls) -> Counts:
        return cls(*[jnp.zeros((), jnp.int32) for _ in cls._fields])

    def add(self, **kinds: int) -> Counts:
        """A copy with ``kinds`` (static Python ints, or traced ints) added."""
        unknown = set(kinds) - set(self._fields)
        if unknown:
            raise ValueError(f"Counts.add: unknown kinds {sorted(unknown)}; use {self._fields}.")
        return self._replace(
            **{k: getattr(self, k) + jnp.asarray(v, jnp.int32) for k, v in kinds.items()}
        )

    @property
    def oracle_kinds(self) -> tuple[str, ...]:
        return tuple(k for k in self._fields if not k.startswith("samples"))


# ---- first order -----------------------------------------------------------------------------
def grad_x(fn, x, y, batch):
    """Partial gradient in x of ``fn(x, y, batch)``."""
    return jax.grad(fn, argnums=0)(x, y, batch)


def grad_y(fn, x, y, batch):
    """Partial gradient in y of ``fn(x, y, batch)``."""
    return jax.grad(fn, argnums=1)(x, y, batch)


def grads(fn, x, y, batch):
    """Both partial gradients ``(grad_x fn, grad_y fn)`` from one backward pass."""
    return jax.grad(fn, argnums=(0, 1))(x, y, batch)


def value_and_grads(fn, x, y, batch):
    """``(fn, (grad_x fn, grad_y fn))`` from one forward and one backward pass."""
    return jax.value_and_grad(fn, argnums=(0, 1))(x, y, batch)


# ---- second order ----------------------------------------------------------------------------
def hvp_yy(fn, x, y, batch, v):
    """``(d^2 fn / dy^2) v`` by forward-over-reverse (one JVP of the y-gradient)."""
    return jax.jvp(lambda y_: grad_y(fn, x, y_, batch), (y,), (v,))[1]


def cross_xy(fn, x, y, batch, v):
    """``(d^2 fn / dx dy) v`` in X for v in Y: ``grad_x <grad_y fn(x, y), v>``."""
    return jax.grad(lambda x_: tree_vdot(grad_y(fn, x_, y, batch), v))(x)


def cross_yx(fn, x, y, batch, u):
    """``(d^2 fn / dy dx) u`` in Y for u in X: the JVP of ``grad_y fn`` along x."""
    return jax.jvp(lambda x_: grad_y(fn, x_, y, batch), (x,), (u,))[1]


def hvp_and_cross(fn, x, y, batch, v):
    """``((d^2 fn/dx dy) v, (d^2 fn/dy^2) v)`` from one reverse pass through ``grad_y fn``.

    The pullback of ``(x, y) -> grad_y fn(x, y)`` at cotangent v gives both products at once,
    since the Hessian in y is symmetric.
    """
    _, pullback = jax.vjp(lambda x_, y_: grad_y(fn, x_, y_, batch), x, y)
    return pullback(v)


# ---- dense (small problems) -----------------------------------------------------------------
def hessian_yy(fn, x, y, batch):
    """Dense ``d^2 fn / dy^2`` as a (dim y, dim y) matrix over the flattened y."""
    flat_y, unravel = ravel_pytree(y)
    return jax.hessian(lambda fy: fn(x, unravel(fy), batch))(flat_y)


def jacobian_xy(fn, x, y, batch):
    """Dense ``d^2 fn / dx dy`` as a (dim x, dim y) matrix (row i: d/dx_i of grad_y fn)."""
    return jacobian_yx(fn, x, y, batch).T


def jacobian_yx(fn, x, y, batch):
    """Dense ``d^2 fn / dy dx`` as a (dim y, dim x) matrix: the Jacobian of grad_y in x."""
    flat_x, unravel_x = ravel_pytree(x)

    def flat_grad_y(fx):
        return ravel_pytree(grad_y(fn, unravel_x(fx), y, batch))[0]

    return jax.jacfwd(flat_grad_y)(flat_x)

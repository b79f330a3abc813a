"""Sample-dependent problems and a step's draws rebuilt from a solver state's key, for the
stochastic replicas (``tests/test_stochastic_replicas.py``; docs/testing.md, "Replicas").

A stochastic replica recomputes one solver step from the rows of the minibatches the step drew.
It can only see a sample fed to the wrong oracle if every oracle of the step depends on the
sample. On the finite-sum quadratic of ``bl.problems.quadratic(stochastic=True)`` (module
docstring there), per draw of rows S,

    g_S(x, y) = 1/2 y'A0 y + 1/2 mean_S (w_i'y)^2 - y'(B0 x + mean_S w_i v_i'x + mean_S b_i)
                + c_x/2 |x|^2
    f_S(x, y) = 1/2 |y - D x - mean_S e_j|^2 + rho/2 |x|^2,

the values of f and g, grad_y g (through b_i), grad_x g (through v_i w_i'y, for y != 0), the
Hessian-vector product (A0 + mean_S w_i w_i') u and the cross product -(B0 + mean_S w_i v_i')'u
(for u != 0), and both gradients of f (through e_j) all depend on S. The Hessians of f do not,
and no offline solver uses them. :class:`QuadraticOracles` writes these oracles out in numpy
from the data, independently of ``bilevel.oracles``; :func:`step_draws` rebuilds the rows of a
step's draws from the state's key with ``bilevel.core.sampling.minibatches``, as the solvers'
``step`` draw them; :func:`moved` puts a state at a point where every oracle above depends on its
sample (the start x0 = y0 = 0 of the quadratic does not: there grad_x g and the products with
v = 0 are the same for every sample).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import bilevel as bl
from bilevel.core import sampling

__all__ = [
    "DX",
    "DY",
    "N_SAMPLES",
    "BATCH",
    "stochastic_quadratic",
    "QuadraticOracles",
    "StepDraws",
    "step_draws",
    "moved",
]

#: the small instance every replica runs on: dim x, dim y, samples per level, minibatch size
DX, DY, N_SAMPLES, BATCH = 3, 4, 40, 5


def stochastic_quadratic(x_set: Any = None) -> bl.BilevelProblem:
    """``bl.problems.quadratic(dx=3, dy=4, stochastic=True, n_samples=40)``, with ``x_set`` (a
    bounded set for the Frank-Wolfe solvers) when given."""
    p = bl.problems.quadratic(dx=DX, dy=DY, stochastic=True, n_samples=N_SAMPLES)
    return p if x_set is None else p.replace(x_set=x_set)


@dataclasses.dataclass(frozen=True)
class QuadraticOracles:
    """The oracles of :func:`stochastic_quadratic` on a draw of rows, in numpy float64.

    ``rows``: an int array of data rows (one draw); every oracle is the mean over those rows
    (the module docstring's g_S and f_S), as the library's minibatch oracles are.
    """

    A0: np.ndarray
    B0: np.ndarray
    D: np.ndarray
    rho: float
    c_x: float
    w: np.ndarray  # (n, dy)
    v: np.ndarray  # (n, dx)
    b: np.ndarray  # (n, dy)
    e: np.ndarray  # (n, dy), the outer data

    @classmethod
    def of(cls, problem: bl.BilevelProblem) -> QuadraticOracles:
        ref, data = problem.reference, problem.inner_data
        w, v, b = (np.asarray(data[k], np.float64) for k in ("w", "v", "b"))
        n = len(w)
        return cls(
            A0=ref.A - w.T @ w / n,
            B0=ref.B - w.T @ v / n,
            D=ref.D,
            rho=ref.rho,
            c_x=ref.c_x,
            w=w,
            v=v,
            b=b,
            e=np.asarray(problem.outer_data["e"], np.float64),
        )

    # ---- g, on inner rows ---------------------------------------------------------------------
    def g(self, x, y, rows) -> float:
        w, v = self.w[rows], self.v[rows]
        lin = self.B0 @ x + w.T @ (v @ x) / len(rows) + self.b[rows].mean(0)
        quad = 0.5 * y @ self.A0 @ y + 0.5 * np.mean((w @ y) ** 2)
        return float(quad - y @ lin + 0.5 * self.c_x * x @ x)

    def grad_y_g(self, x, y, rows) -> np.ndarray:
        w, v = self.w[rows], self.v[rows]
        m = len(rows)
        return (
            self.A0 @ y + w.T @ (w @ y) / m - self.B0 @ x - w.T @ (v @ x) / m - self.b[rows].mean(0)
        )

    def grad_x_g(self, x, y, rows) -> np.ndarray:
        w, v = self.w[rows], self.v[rows]
        return -self.B0.T @ y - v.T @ (w @ y) / len(rows) + self.c_x * x

    def hessian_yy(self, rows) -> np.ndarray:
        """d2g/dy2 on the rows (the same at every point)."""
        w = self.w[rows]
        return self.A0 + w.T @ w / len(rows)

    def hvp(self, rows, u) -> np.ndarray:
        """(d2g/dy2) u."""
        return self.hessian_yy(rows) @ u

    def cross(self, rows, u) -> np.ndarray:
        """(d2g/dx dy) u in X: the x-gradient of <grad_y g, u>, -(B0 + mean w_i v_i')' u."""
        w, v = self.w[rows], self.v[rows]
        return -self.B0.T @ u - v.T @ (w @ u) / len(rows)

    # ---- f, on outer rows ---------------------------------------------------------------------
    def f(self, x, y, rows) -> float:
        r = y - self.D @ x - self.e[rows].mean(0)
        return float(0.5 * r @ r + 0.5 * self.rho * x @ x)

    def grads_f(self, x, y, rows) -> tuple[np.ndarray, np.ndarray]:
        """(grad_x f, grad_y f)."""
        r = y - self.D @ x - self.e[rows].mean(0)
        return -self.D.T @ r + self.rho * x, r


@dataclasses.dataclass(frozen=True)
class StepDraws:
    """The rows of one step's draws and the keys it split off besides the batch key."""

    outer: np.ndarray  # (outer draws, batch) rows of the outer data; outer[i] is draw i
    inner: np.ndarray  # (inner draws, batch) rows of the inner data
    next_key: jax.Array  # the key the step hands on to the next state
    others: tuple  # the split's keys after the batch key (a direction key, a Neumann key)

    def assert_distinct(self) -> None:
        """No two draws of a level hold the same rows, so that a draw fed to the wrong oracle
        changes the result (a coincidence has probability ~ (1/40)^5 per pair here)."""
        for level in (self.outer, self.inner):
            assert len({tuple(r) for r in level.tolist()}) == len(level)


def step_draws(
    problem: bl.BilevelProblem,
    key: jax.Array,
    batch_size: int,
    *,
    outer: int,
    inner: int,
    splits: int = 2,
) -> StepDraws:
    """The draws of a step taken from a state whose key is ``key``, rebuilt as every offline
    solver's ``step`` makes them: ``key`` split into ``splits`` keys (next key, batch key, then
    any others), and ``outer`` outer and ``inner`` inner i.i.d. minibatches of ``batch_size``
    rows drawn from the batch key by :func:`bilevel.core.sampling.minibatches`."""
    keys, outer_idx, inner_idx = _draw(
        key, problem.outer_data, problem.inner_data, batch_size, outer, inner, splits
    )
    return StepDraws(np.asarray(outer_idx), np.asarray(inner_idx), keys[0], tuple(keys[2:]))


@functools.partial(jax.jit, static_argnums=(3, 4, 5, 6))
def _draw(key, outer_data, inner_data, batch_size, outer, inner, splits):
    """The split keys and the draws' row indices (one compiled program: drawn eagerly, the
    sampler's small operations took 1.8 s to compile on their first call)."""
    keys = jax.random.split(key, splits)
    mb = sampling.minibatches(keys[1], outer_data, inner_data, batch_size, outer=outer, inner=inner)
    return keys, mb.outer_idx, mb.inner_idx


def moved(state, seed: int = 0, scale: float = 0.5, **fields):
    """``state`` with each field named in ``fields`` (value: its shape) replaced by a fixed
    random vector of that shape times ``scale``: a mid-run point where y, v, z != 0, so that
    grad_x g and the Hessian and cross products depend on the sample (module docstring)."""
    rng = np.random.default_rng(seed)
    values = {
        name: jnp.asarray(scale * rng.standard_normal(shape)) for name, shape in fields.items()
    }
    return state._replace(**values)

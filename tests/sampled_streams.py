r"""A stochastic online stream on which every oracle depends on the sample drawn (issue #34).

``bl.problems.drifting_quadratic(stochastic=True)`` (whose numbers feed reproductions, so it
stays as it is) moves only the centres c_t, b_t with the sample: there grad_x f = rho x,
grad_x g = -B^T y, the Hessian A and the cross term -B do not depend on the draw, and a
stochastic replica cannot see a draw reused or misplaced in those oracles. Here round t holds
``n`` inner samples (w_i, v_i, c_i) and ``n`` outer samples (D_j, b_j), and a batch's loss is
the mean of its samples' losses::

    g_{t,i}(x, y) = 1/2 y^T (A0 + w_i w_i^T) y - y^T (B0 x + w_i (v_i^T x) + c_i)
    f_{t,j}(x, y) = 1/2 ||y - D_j x - b_j||^2 + 1/2 rho ||x||^2

so on a batch with means  A = A0 + mean w w^T,  B = B0 + mean w v^T,  c = mean c::

    grad_y g = A y - B x - c     grad_x g = -B^T y     d2g/dy2 v = A v     d2g/dxdy v = -B^T v
    grad_y f = y - mean(D_j x + b_j)     grad_x f = -mean D_j^T (y - D_j x - b_j) + rho x

Every one of them moves with the draw. Every g sample is strongly convex (A0 has eigenvalues
evenly spaced in [1, cond], and w w^T >= 0). No online solver of the library takes second
derivatives of f (the penalty methods are first order; the hypergradient methods, ITD and CG
take grad f and second derivatives of g only), so f's curvature in y is the identity.

``problem.reference`` (:class:`SampledStreamReference`) holds the samples as numpy arrays, the
numpy oracles on a batch (for the replicas, which rebuild each round's draws from the state's
key with ``online_helpers``) and jit-able closed forms of round t's full problem (all of its
samples, what ``bl.solve_online`` evaluates the regret on): y*_t(x), F_t(x), grad F_t(x).
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

import bilevel as bl

__all__ = ["SampledStreamReference", "sampled_stream"]


@dataclasses.dataclass(frozen=True, eq=False)
class SampledStreamReference:
    """The samples and closed forms of a :func:`sampled_stream` (numpy float64).

    ``inner = {"w": (T, n, dy), "v": (T, n, dx), "c": (T, n, dy)}``, ``outer = {"D": (T, n,
    dy, dx), "b": (T, n, dy)}``; round t is row t - 1. The oracle methods take a batch as the
    solvers see it (a dict of arrays with a leading sample axis, jax or numpy); the closed
    forms take a traced round t."""

    A0: np.ndarray
    B0: np.ndarray
    rho: float
    inner: dict
    outer: dict
    x_set: object = None

    # ---- batch statistics ---------------------------------------------------------------
    @staticmethod
    def _np(batch) -> dict:
        return {k: np.asarray(v, float) for k, v in batch.items()}

    def inner_stats(self, batch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(A, B, c)`` of an inner batch: A0 + mean w w^T, B0 + mean w v^T, mean c."""
        b = self._np(batch)
        n = len(b["c"])
        A = self.A0 + b["w"].T @ b["w"] / n
        B = self.B0 + b["w"].T @ b["v"] / n
        return A, B, b["c"].mean(0)

    # ---- the numpy oracles on a batch -----------------------------------------------------
    def grad_y_g(self, x, y, batch) -> np.ndarray:
        A, B, c = self.inner_stats(batch)
        return A @ y - B @ x - c

    def grad_x_g(self, x, y, batch) -> np.ndarray:
        del x
        return -self.inner_stats(batch)[1].T @ y

    def hvp(self, v, batch) -> np.ndarray:
        """d2g/dy2 v (independent of x, y)."""
        return self.inner_stats(batch)[0] @ v

    def cross(self, v, batch) -> np.ndarray:
        """d2g/dxdy v = -B^T v (independent of x, y)."""
        return -self.inner_stats(batch)[1].T @ v

    def jacobian_step(self, batch) -> tuple[np.ndarray, np.ndarray]:
        """``(A, B)`` of the batch: one GD step y - a (A y - B x - c) has d/dx = -a(A J - B)."""
        A, B, _ = self.inner_stats(batch)
        return A, B

    def _residuals(self, x, y, batch):
        b = self._np(batch)
        return b["D"], y[None, :] - np.einsum("nij,j->ni", b["D"], x) - b["b"]

    def grad_y_f(self, x, y, batch) -> np.ndarray:
        return self._residuals(x, y, batch)[1].mean(0)

    def grad_x_f(self, x, y, batch) -> np.ndarray:
        D, r = self._residuals(x, y, batch)
        return -np.einsum("nij,ni->j", D, r) / len(r) + self.rho * x

    def hypergradient(self, x, v, y, bo, bi) -> np.ndarray:
        """grad_x f(x, y; bo) - d2g/dxdy v (bi): the implicit-function estimate."""
        return self.grad_x_f(x, y, bo) - self.cross(v, bi)

    def project(self, x) -> np.ndarray:
        """Proj_X in numpy (a ``bl.sets.Box`` or no set)."""
        if self.x_set is None:
            return x
        return np.clip(x, float(self.x_set.lower), float(self.x_set.upper))

    # ---- round t's full problem (numpy; concrete t) ------------------------------------------
    def round_batches(self, t: int) -> tuple[dict, dict]:
        """``(outer, inner)``: all of round t's samples."""
        return (
            {k: v[t - 1] for k, v in self.outer.items()},
            {k: v[t - 1] for k, v in self.inner.items()},
        )

    def grad_F_np(self, t: int, x) -> np.ndarray:
        """grad F_t(x) = grad_x f + (A^{-1} B)^T grad_y f at y*_t(x) = A^{-1} (B x + c)."""
        bo, bi = self.round_batches(t)
        A, B, c = self.inner_stats(bi)
        y = np.linalg.solve(A, B @ x + c)
        return self.grad_x_f(x, y, bo) + B.T @ np.linalg.solve(A, self.grad_y_f(x, y, bo))

    # ---- closed forms of round t (jit-able in a traced t) ---------------------------------
    def _jnp_round(self, t):
        i = jnp.asarray(t, jnp.int32) - 1
        w, v, c = (jnp.asarray(self.inner[k])[i] for k in ("w", "v", "c"))
        D, b = (jnp.asarray(self.outer[k])[i] for k in ("D", "b"))
        n = w.shape[0]
        A = jnp.asarray(self.A0) + w.T @ w / n
        B = jnp.asarray(self.B0) + w.T @ v / n
        return A, B, jnp.mean(c, 0), D, b

    def y_star(self, t, x):
        A, B, c, _, _ = self._jnp_round(t)
        return jnp.linalg.solve(A, B @ x + c)

    def F(self, t, x):
        _, _, _, D, b = self._jnp_round(t)
        r = self.y_star(t, x)[None, :] - jnp.einsum("nij,j->ni", D, x) - b
        return 0.5 * jnp.mean(jnp.sum(r**2, 1)) + 0.5 * self.rho * jnp.sum(x**2)

    def grad_F(self, t, x):
        A, B, c, D, b = self._jnp_round(t)
        y = jnp.linalg.solve(A, B @ x + c)
        r = y[None, :] - jnp.einsum("nij,j->ni", D, x) - b
        gx = -jnp.einsum("nij,ni->j", D, r) / r.shape[0] + self.rho * x
        return gx + B.T @ jnp.linalg.solve(A, jnp.mean(r, 0))


def _inner_loss(A0, B0):
    A0, B0 = jnp.asarray(A0), jnp.asarray(B0)

    def inner(t, x, y, batch):
        """Mean over the batch of g_{t,i} (module docstring); t enters through the data."""
        del t
        wy, vx = batch["w"] @ y, batch["v"] @ x
        return (
            0.5 * y @ (A0 @ y)
            + 0.5 * jnp.mean(wy**2)
            - y @ (B0 @ x)
            - jnp.mean(wy * vx)
            - y @ jnp.mean(batch["c"], 0)
        )

    return inner


def _outer_loss(rho: float):
    def outer(t, x, y, batch):
        """Mean over the batch of f_{t,j} (module docstring)."""
        del t
        r = y[None, :] - jnp.einsum("nij,j->ni", batch["D"], x) - batch["b"]
        return 0.5 * jnp.mean(jnp.sum(r**2, 1)) + 0.5 * rho * jnp.sum(x**2)

    return outer


def sampled_stream(
    dx: int = 3,
    dy: int = 4,
    horizon: int = 5,
    n_samples: int = 12,
    *,
    cond: float = 2.0,
    noise: float = 0.5,
    rho: float = 0.5,
    radius: float | None = None,
    seed: int = 0,
) -> bl.OnlineProblem:
    """A stream of ``horizon`` rounds with ``n_samples`` samples per round and level whose every
    derivative depends on the sample (module docstring).

    Args:
        dx, dy: dimensions of x and y (flat arrays; x0 = y0 = 0).
        horizon: T.
        n_samples: samples per round and level.
        cond: A0's eigenvalues are evenly spaced in [1, cond] (every g sample is then
            1-strongly convex).
        noise: the scale of the sample terms w_i, v_i, and of D_j around D0.
        rho: the outer ridge on x.
        radius: ``None`` (unconstrained) or X = ``bl.sets.Box(-radius, radius)``, a bounded
            set on which the projection can be active.
        seed: the instance seed.

    Returns:
        A ``bl.OnlineProblem`` with held ``inner_data = {"w", "v", "c"}`` and ``outer_data =
        {"D", "b"}`` of shape (T, n, ...), whose ``reference`` is a
        :class:`SampledStreamReference`.
    """
    rng = np.random.default_rng(seed)
    q, r = np.linalg.qr(rng.standard_normal((dy, dy)))
    q = q * np.sign(np.diag(r))
    A0 = (q * np.linspace(1.0, cond, dy)) @ q.T
    A0 = 0.5 * (A0 + A0.T)
    B0 = rng.standard_normal((dy, dx)) / np.sqrt(dx)
    D0 = rng.standard_normal((dy, dx)) / np.sqrt(dx)
    T, n = horizon, n_samples
    inner = {
        "w": noise * rng.standard_normal((T, n, dy)),
        "v": noise * rng.standard_normal((T, n, dx)),
        "c": rng.standard_normal((T, n, dy)),
    }
    outer = {
        "D": D0 + noise * rng.standard_normal((T, n, dy, dx)),
        "b": rng.standard_normal((T, n, dy)),
    }
    x_set = None if radius is None else bl.sets.Box(-radius, radius)
    ref = SampledStreamReference(
        A0=A0, B0=B0, rho=float(rho), inner=inner, outer=outer, x_set=x_set
    )
    return bl.OnlineProblem(
        outer=_outer_loss(float(rho)),
        inner=_inner_loss(A0, B0),
        horizon=horizon,
        x0=jnp.zeros(dx),
        y0=jnp.zeros(dy),
        x_set=x_set,
        outer_data=outer,
        inner_data=inner,
        name=f"sampled_stream(dx={dx}, dy={dy}, T={horizon}, n={n_samples})",
        reference=ref,
    )

r"""A drifting quadratic stream: an online bilevel problem with every quantity in closed form.

A test family of ours for the regret bounds of Jia & Chen, "Fully First-Order Algorithms for Online
Non-Convex Bilevel Optimization", arXiv:2602.11665 (Theorems 3.1 and 4.1, whose terms V_T and
H_{2,T} are its Eq. (4)); every term has a closed form here. Round t (from 1) of the stream::

    g_t(x, y) = 1/2 y^T A y - y^T (B x + c_t)          y*_t(x) = A^{-1} (B x + c_t)
    f_t(x, y) = 1/2 ||y - b_t||^2 + 1/2 rho_x ||x||^2

    F_t(x)      = 1/2 ||M x + u_t||^2 + 1/2 rho_x ||x||^2,   M = A^{-1} B,  u_t = A^{-1} c_t - b_t
    grad F_t(x) = M^T (M x + u_t) + rho_x x

A has eigenvalues evenly spaced in [1, cond] (mu_g = 1, L_g = cond); f_t is 1-smooth in y
(L_{f,1} = 1), so lam_1 > 2 L_{f,1}/mu_g = 2 meets Theorem 3.1. The centres drift as random
walks whose step at round t has length ``drift * t^-drift_decay`` in a uniformly random
direction: the drift of c_t moves y*_t (it controls H_{2,T}; H_{2,T} = sum ||A^{-1} dc_t||^2
exactly, whatever x), the drift of b_t moves F_t (it controls V_T). With ``drift_decay`` > 1/2
(resp. > 1) H_{2,T} (resp. V_T) stays O(1) as T grows; with no decay both grow like T.

The stochastic variant holds per-round samples ``c_{t,i}``, ``b_{t,i}`` whose round means are
exactly c_t and b_t (``noise`` scales their spread); a batch's losses use the batch means, so
minibatch gradients are unbiased and the full round is the deterministic problem exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from bilevel.analysis.metrics import Variation
from bilevel.core.online_problem import OnlineProblem

__all__ = ["drifting_quadratic", "DriftingQuadraticReference"]


@dataclasses.dataclass(frozen=True, eq=False)
class DriftingQuadraticReference:
    """Closed forms of a drifting quadratic stream. ``A, B, c, b`` are numpy float64 (``c``, ``b``
    of shape (T, dim y): row t - 1 is round t); the methods are jit-able in a traced round t and
    take and return x, y shaped as the problem's (pytrees with ``pytree=True``)."""

    A: np.ndarray
    B: np.ndarray
    c: np.ndarray
    b: np.ndarray
    rho_x: float
    unravel_x: Any = None  # flat x -> the problem's x (None: flat arrays)
    unravel_y: Any = None

    @property
    def M(self) -> np.ndarray:
        return np.linalg.solve(self.A, self.B)

    @property
    def u(self) -> np.ndarray:
        """u_t = A^{-1} c_t - b_t, per round (T, dim y)."""
        return np.linalg.solve(self.A, self.c.T).T - self.b

    def _jnp(self, name: str):
        return jnp.asarray(getattr(self, name))

    def _shaped(self, flat, unravel):
        return flat if unravel is None else unravel(flat)

    def y_star(self, t, x):
        """y*_t(x) = A^{-1} (B x + c_t)."""
        A, B, c = self._jnp("A"), self._jnp("B"), self._jnp("c")
        return self._shaped(jnp.linalg.solve(A, B @ _flat(x) + c[t - 1]), self.unravel_y)

    def F(self, t, x):
        x = _flat(x)
        res = self._jnp("M") @ x + self._jnp("u")[t - 1]
        return 0.5 * jnp.sum(res**2) + 0.5 * self.rho_x * jnp.sum(x**2)

    def grad_F(self, t, x):
        x, M = _flat(x), self._jnp("M")
        grad = M.T @ (M @ x + self._jnp("u")[t - 1]) + self.rho_x * x
        return self._shaped(grad, self.unravel_x)

    def y_star_penalty(self, t, x, lam):
        """y*_{lam,t}(x) = argmin_y f_t + lam g_t = (I + lam A)^{-1} (b_t + lam (B x + c_t))."""
        A, B = self._jnp("A"), self._jnp("B")
        rhs = self._jnp("b")[t - 1] + lam * (B @ _flat(x) + self._jnp("c")[t - 1])
        return self._shaped(jnp.linalg.solve(jnp.eye(A.shape[0]) + lam * A, rhs), self.unravel_y)

    def variation(self, x_set=None, radius: float | None = None) -> Variation:
        """The variation measures in closed form (``bl.metrics.variation``).

        H_{2,T}, E^f_{y,T} and E^g_{y,T} do not depend on x or y here (y*_t - y*_{t-1} =
        A^{-1} dc_t, grad_y f_t - grad_y f_{t-1} = -db_t, grad_y g_t - grad_y g_{t-1} = -dc_t).
        F_t - F_{t-1} = <a_t, x> + d_t is affine in x (a_t = M^T du_t, d_t = 1/2 (||u_t||^2 -
        ||u_{t-1}||^2)), so its sup over a bounded X comes from two linear minimization
        oracles; an unbounded X needs ``radius`` (the ball ||x|| <= radius), unless F_t does
        not drift along x.
        """
        dc, db, du = np.diff(self.c, axis=0), np.diff(self.b, axis=0), np.diff(self.u, axis=0)
        d = 0.5 * np.diff(np.sum(self.u**2, axis=1))
        a = du @ self.M  # rows a_t = M^T du_t
        dV, over = _affine_sup(a, d, x_set, radius, self.unravel_x)
        return Variation.from_increments(
            V=dV,
            H2=np.sum(np.linalg.solve(self.A, dc.T) ** 2, axis=0),
            E_f=np.sum(db**2, axis=1),
            E_g=np.sum(dc**2, axis=1),
            over=over,
        )


def _flat(tree):
    return ravel_pytree(tree)[0]


def _affine_sup(a: np.ndarray, d: np.ndarray, x_set, radius, unravel) -> tuple[np.ndarray, str]:
    """``sup_{x in X} |<a_t, x> + d_t|`` per row t, and where the sup was taken, in words.

    Over a bounded X: max(<a, lmo(-a)> + d, -(<a, lmo(a)> + d)), lmo = the set's linear
    minimization oracle; over the ball ||x|| <= radius: |d| + radius ||a||.
    """
    from bilevel.core import sets

    if radius is not None:
        return np.abs(d) + radius * np.linalg.norm(a, axis=1), f"the ball ||x|| <= {radius}"
    shaped = (lambda v: jnp.asarray(v)) if unravel is None else (lambda v: unravel(jnp.asarray(v)))

    def lmo(v):  # the set's LMO on the problem's x shape, flattened back
        return np.asarray(_flat(x_set.lmo(shaped(v))))

    if x_set is not None and sets.is_bounded(x_set, like=shaped(np.zeros(a.shape[1]))):
        low = np.array([row @ lmo(row) for row in a])
        high = np.array([row @ lmo(-row) for row in a])
        return np.maximum(high + d, -(low + d)), f"X = {type(x_set).__name__} (closed form)"
    if np.allclose(a, 0.0):
        return np.abs(d), "every x (F_t - F_{t-1} does not depend on x)"
    raise ValueError(
        "V_T is infinite over an unbounded X when F_t drifts along x; give radius= (the sup over "
        "the ball ||x|| <= radius), or a bounded x_set."
    )


def _start(n: int, dtype, pytree: bool):
    """Zeros of n entries: a flat array, or the nested dict the pytree variant uses."""
    if not pytree:
        return jnp.zeros(n, dtype)
    return {"a": jnp.zeros(n // 2, dtype), "b": {"c": jnp.zeros(n - n // 2, dtype)}}


def _drift(rng: np.random.Generator, start, horizon: int, speed: float, decay: float):
    """A random walk from ``start`` whose step at round t has length speed * t^-decay."""
    steps = rng.standard_normal((horizon - 1, start.size))
    steps /= np.linalg.norm(steps, axis=1, keepdims=True)
    steps *= speed * np.arange(2, horizon + 1)[:, None] ** -decay
    return start + np.concatenate([np.zeros((1, start.size)), np.cumsum(steps, axis=0)])


def _samples(rng: np.random.Generator, means: np.ndarray, n: int, noise: float) -> np.ndarray:
    """Per-round samples (T, n, dim) whose round means are exactly ``means`` (T, dim)."""
    spread = noise * rng.standard_normal((means.shape[0], n, means.shape[1]))
    return means[:, None, :] + spread - spread.mean(axis=1, keepdims=True)


def drifting_quadratic(
    dx: int = 5,
    dy: int = 10,
    horizon: int = 200,
    *,
    cond: float = 10.0,
    coupling: float = 1.0,
    rho_x: float = 0.1,
    drift_inner: float = 0.0,
    drift_outer: float = 0.0,
    drift_decay: float = 0.0,
    stochastic: bool = False,
    n_samples: int = 32,
    noise: float = 1.0,
    x_set=None,
    pytree: bool = False,
    seed: int = 0,
) -> OnlineProblem:
    """A drifting quadratic stream with closed-form y*_t, F_t, grad F_t (module docstring).

    Args:
        dx, dy: dimensions of x and y.
        horizon: T, the number of rounds.
        cond: condition number of the inner Hessian A (mu_g = 1, L_g = cond).
        coupling: scale of B (how strongly y*_t moves with x).
        rho_x: the outer ridge on x.
        drift_inner: step length of c_t's random walk (controls H_{2,T}).
        drift_outer: step length of b_t's random walk (controls V_T).
        drift_decay: the steps shrink like t^-drift_decay (0: constant speed).
        stochastic: hold ``n_samples`` samples per round and level (``inner_data = {"c": (T,
            n, dy)}``, ``outer_data = {"b": (T, n, dy)}``), spread by ``noise``, with exact
            round means.
        x_set: a ``bl.sets`` set for x (``None``: unconstrained); x0 = 0.
        pytree: x and y as nested dicts (``{"a": ..., "b": {"c": ...}}``) instead of flat
            arrays (the same problem).
        seed: instance seed (matrices, starting centres and drift directions).

    Returns:
        A :class:`bilevel.OnlineProblem` whose ``reference`` is a
        :class:`DriftingQuadraticReference` (of the mean problem) and whose ``metrics`` report
        ``grad_norm`` (||grad F_t(x_t)||), ``y_err`` (||y_t - y*_t(x_t)||) and ``F`` (F_t(x_t)).
    """
    _check_args(dx, dy, cond)
    rng = np.random.default_rng(seed)
    rounds = horizon if isinstance(horizon, int) and horizon >= 1 else 1
    A, B = _fixed_matrices(rng, dx, dy, cond, coupling)
    c = _drift(rng, rng.standard_normal(dy), rounds, drift_inner, drift_decay)
    b = _drift(rng, rng.standard_normal(dy), rounds, drift_outer, drift_decay)
    dtype = jnp.result_type(float)
    x0, y0 = _start(dx, dtype, pytree), _start(dy, dtype, pytree)
    unravel_x, unravel_y = (ravel_pytree(v)[1] if pytree else None for v in (x0, y0))
    ref = DriftingQuadraticReference(
        A=A, B=B, c=c, b=b, rho_x=float(rho_x), unravel_x=unravel_x, unravel_y=unravel_y
    )
    inner, outer = _levels(A, B, c, b, rho_x, dtype)
    inner_data = outer_data = None
    if stochastic:
        inner_data = {"c": _samples(rng, c, n_samples, noise).astype(dtype)}
        outer_data = {"b": _samples(rng, b, n_samples, noise).astype(dtype)}
    kind = ", stochastic" if stochastic else ""
    name = (  # every setting that changes the stream's difficulty, so messages tell them apart
        f"drifting_quadratic(dx={dx}, dy={dy}, T={horizon}, cond={cond:g}, rho_x={rho_x:g}, "
        f"coupling={coupling:g}, drift_inner={drift_inner}, drift_outer={drift_outer}, "
        f"seed={seed}{kind})"
    )
    return OnlineProblem(
        outer=outer,
        inner=inner,
        horizon=horizon,
        x0=x0,
        y0=y0,
        x_set=x_set,
        outer_data=outer_data,
        inner_data=inner_data,
        metrics=_closed_form_metrics(ref),
        name=name,
        reference=ref,
    )


def _check_args(dx, dy, cond) -> None:
    for name, v in (("dx", dx), ("dy", dy)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"drifting_quadratic({name}=...) must be a positive int, got {v!r}.")
    if not cond >= 1:
        raise ValueError(f"drifting_quadratic(cond=...) must be >= 1, got {cond}.")


def _fixed_matrices(rng: np.random.Generator, dx: int, dy: int, cond: float, coupling: float):
    """``(A, B)``: A with eigenvalues evenly spaced in [1, cond] in a random orthonormal
    basis, B of scale ``coupling`` (drawn in this order, before the centres)."""
    q, r = np.linalg.qr(rng.standard_normal((dy, dy)))
    q = q * np.sign(np.diag(r))
    A = (q * np.linspace(1.0, cond, dy)) @ q.T
    A = 0.5 * (A + A.T)
    B = coupling * rng.standard_normal((dy, dx)) / np.sqrt(dx)
    return A, B


def _levels(A, B, c, b, rho_x: float, dtype):
    """``(inner, outer)``: g_t and f_t of the module docstring; a batch (stochastic variant)
    replaces the centre c_t or b_t by its samples' mean."""
    Aj, Bj, cj, bj = (jnp.asarray(m, dtype) for m in (A, B, c, b))

    def inner(t, x, y, batch):
        x, y = _flat(x), _flat(y)
        centre = cj[t - 1] if batch is None else jnp.mean(batch["c"], axis=0)
        return 0.5 * y @ (Aj @ y) - y @ (Bj @ x + centre)

    def outer(t, x, y, batch):
        x, y = _flat(x), _flat(y)
        target = bj[t - 1] if batch is None else jnp.mean(batch["b"], axis=0)
        return 0.5 * jnp.sum((y - target) ** 2) + 0.5 * rho_x * jnp.sum(x**2)

    return inner, outer


def _closed_form_metrics(ref: DriftingQuadraticReference):
    """``grad_norm``, ``y_err`` and ``F`` of round t from the reference's closed forms."""

    def metrics(t, x, y):
        return {
            "grad_norm": jnp.linalg.norm(_flat(ref.grad_F(t, x))),
            "y_err": jnp.linalg.norm(_flat(y) - _flat(ref.y_star(t, x))),
            "F": ref.F(t, x),
        }

    return metrics

r"""The quadratic bilevel family: every quantity in closed form.

Lower level (strongly convex, mu_g = 1, L_g = ``cond``)::

    g(x, y) = 1/2 y^T A y - y^T (B x + b) + 1/2 c_x ||x||^2          y*(x) = A^{-1} (B x + b)

Upper level::

    f(x, y) = 1/2 ||y - D x - e||^2 + 1/2 rho ||x||^2

    grad F(x) = (A^{-1} B - D)^T (M x + r) + rho x,   M = A^{-1} B - D,  r = A^{-1} b - e
    x*        = -(M^T M + rho I)^{-1} M^T r

(a test family of ours, built so that every quantity of Kwon, Kwon, Wright, Nowak, ICML 2023,
Sec. 3 has a closed form: y*, F, the penalised minimiser y*_lam of eq. (2) and grad L*_lam of
Lemma 3.1. The ``c_x`` term does not change y* or F, but makes grad_x g non-zero, so a solver
that forgets the partial x-gradient of g is caught.)

The stochastic (finite-sum) version draws per-sample data whose averages are exactly A, B, b, e:
``g_i = 1/2 y^T A0 y + 1/2 (w_i^T y)^2 - y^T (B0 x + w_i v_i^T x + b_i) + 1/2 c_x ||x||^2`` with
``A = A0 + mean_i w_i w_i^T`` and ``B = B0 + mean_i w_i v_i^T``, so minibatch Hessians, cross
derivatives and gradients are all noisy and unbiased, and every sample g_i is strongly convex.
``f_j = 1/2 ||y - D x - e_j||^2 + 1/2 rho ||x||^2`` with ``mean_j e_j = e``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from bilevel.core.problem import BilevelProblem

__all__ = ["quadratic", "QuadraticReference"]


@dataclasses.dataclass(frozen=True, eq=False)
class QuadraticReference:
    """Closed forms of a quadratic instance (numpy float64, on flat vectors)."""

    A: np.ndarray
    B: np.ndarray
    b: np.ndarray
    D: np.ndarray
    e: np.ndarray
    rho: float
    c_x: float
    unravel_x: Any = None  # flat x -> pytree x (identity for array problems)
    unravel_y: Any = None

    @property
    def dx(self) -> int:
        return self.B.shape[1]

    @property
    def dy(self) -> int:
        return self.B.shape[0]

    @property
    def mu_g(self) -> float:
        return float(np.linalg.eigvalsh(self.A)[0])

    @property
    def L_g(self) -> float:
        return float(np.linalg.eigvalsh(self.A)[-1])

    def _M_r(self):
        Ainv_B = np.linalg.solve(self.A, self.B)
        return Ainv_B - self.D, np.linalg.solve(self.A, self.b) - self.e

    def y_star(self, x):
        return np.linalg.solve(self.A, self.B @ np.asarray(x, np.float64) + self.b)

    def F(self, x):
        x = np.asarray(x, np.float64)
        M, r = self._M_r()
        return 0.5 * np.sum((M @ x + r) ** 2) + 0.5 * self.rho * np.sum(x**2)

    def grad_F(self, x):
        x = np.asarray(x, np.float64)
        M, r = self._M_r()
        return M.T @ (M @ x + r) + self.rho * x

    @property
    def x_star(self) -> np.ndarray:
        M, r = self._M_r()
        return -np.linalg.solve(M.T @ M + self.rho * np.eye(self.dx), M.T @ r)

    @property
    def hessian_F(self) -> np.ndarray:
        M, _ = self._M_r()
        return M.T @ M + self.rho * np.eye(self.dx)

    # ---- F2SA's penalty surrogate L*_lam (Kwon et al., ICML 2023, Sec. 3) -----------------
    def y_star_penalty(self, x, lam: float):
        """y*_lam(x) = argmin_y f + lam g = (I + lam A)^{-1} (D x + e + lam (B x + b)) (eq. (2))."""
        x = np.asarray(x, np.float64)
        rhs = self.D @ x + self.e + lam * (self.B @ x + self.b)
        return np.linalg.solve(np.eye(self.dy) + lam * self.A, rhs)

    def grad_penalty(self, x, lam: float):
        """grad L*_lam(x) = -D^T (y_lam - D x - e) + rho x + lam B^T (y* - y_lam) (Lemma 3.1)."""
        x = np.asarray(x, np.float64)
        y_lam = self.y_star_penalty(x, lam)
        return (
            -self.D.T @ (y_lam - self.D @ x - self.e)
            + self.rho * x
            + lam * self.B.T @ (self.y_star(x) - y_lam)
        )

    def x_star_penalty(self, lam: float) -> np.ndarray:
        """The stationary point of L*_lam (a quadratic in x: its gradient is affine)."""
        h = self.grad_penalty(np.zeros(self.dx), lam)
        G = np.stack([self.grad_penalty(col, lam) - h for col in np.eye(self.dx)], axis=1)
        return np.linalg.solve(G, -h)


def _orthogonal(rng: np.random.Generator, n: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    return q * np.sign(np.diag(r))


def quadratic(
    dx: int = 10,
    dy: int = 50,
    *,
    cond: float = 10.0,
    coupling: float = 1.0,
    rho: float = 0.1,
    c_x: float = 0.1,
    stochastic: bool = False,
    n_samples: int = 2000,
    noise: float = 1.0,
    pytree: bool = False,
    seed: int = 0,
) -> BilevelProblem:
    """A quadratic bilevel problem with closed-form ``y*``, ``grad F`` and ``x*``.

    Args:
        dx, dy: dimensions of x and y.
        cond: condition number of the inner Hessian A (eigenvalues evenly spaced in [1, cond],
            so mu_g = 1 and L_g = cond).
        coupling: scale of B (how strongly y* moves with x).
        rho: the upper level's ridge on x (the conditioning of F).
        c_x: the lower level's x-only term 1/2 c_x ||x||^2.
        stochastic: finite-sum data with ``n_samples`` samples per level (see module doc);
            otherwise deterministic (``outer_data = inner_data = None``).
        noise: scale of the per-sample perturbations (stochastic only).
        pytree: x and y as nested dicts instead of flat arrays (same problem).
        seed: instance seed.

    Returns:
        A :class:`bilevel.BilevelProblem` whose ``reference`` is a :class:`QuadraticReference`
        and whose ``metrics`` report ``grad_norm`` (||grad F(x)||), ``x_err`` (||x - x*||),
        ``y_err`` (||y - y*(x)||) and ``F_gap`` (F(x) - F(x*)), all exact.
    """
    _check_sizes(dx, dy, cond)
    rng = np.random.default_rng(seed)
    A, B, D, b, e = _mean_matrices(rng, dx, dy, cond, coupling)
    dtype = jnp.result_type(float)
    outer_data = inner_data = samples = None
    if stochastic:
        samples = _finite_sum(rng, A, B, b, e, int(n_samples), noise, cond, coupling)
        inner_data, outer_data = samples.data(dtype)
    inner_flat, outer_flat = _flat_levels(A, B, b, D, e, samples, rho, c_x, dtype)
    x0, y0 = _starts(dx, dy, pytree, dtype)
    _, unravel_x = ravel_pytree(x0)
    _, unravel_y = ravel_pytree(y0)
    ref = QuadraticReference(
        A=A, B=B, b=b, D=D, e=e, rho=rho, c_x=c_x, unravel_x=unravel_x, unravel_y=unravel_y
    )

    def outer(x, y, batch):
        return outer_flat(_flat(x), _flat(y), batch)

    def inner(x, y, batch):
        return inner_flat(_flat(x), _flat(y), batch)

    name = f"quadratic(dx={dx}, dy={dy}, cond={cond}{', stochastic' if stochastic else ''})"
    return BilevelProblem(
        outer=outer,
        inner=inner,
        x0=x0,
        y0=y0,
        outer_data=outer_data,
        inner_data=inner_data,
        metrics=_exact_metrics(ref, dtype),
        name=name,
        reference=ref,
    )


def _check_sizes(dx, dy, cond) -> None:
    for name, v in (("dx", dx), ("dy", dy)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"quadratic({name}=...) must be a positive int, got {v!r}.")
    if not cond >= 1:
        raise ValueError(f"quadratic(cond=...) must be >= 1, got {cond}.")


def _mean_matrices(rng: np.random.Generator, dx: int, dy: int, cond: float, coupling: float):
    """``(A, B, D, b, e)`` of the mean problem, drawn in this order from ``rng``: A with
    eigenvalues evenly spaced in [1, cond] in a random orthonormal basis."""
    Q = _orthogonal(rng, dy)
    A = (Q * np.linspace(1.0, cond, dy)) @ Q.T
    A = 0.5 * (A + A.T)
    B = coupling * rng.standard_normal((dy, dx)) / np.sqrt(dx)
    D = rng.standard_normal((dy, dx)) / np.sqrt(dx)
    b = rng.standard_normal(dy)
    e = rng.standard_normal(dy)
    return A, B, D, b, e


@dataclasses.dataclass(frozen=True)
class _FiniteSum:
    """The per-sample data of the stochastic version (module docstring) and the deterministic
    parts ``A0 = A - mean_i w_i w_i^T`` and ``B0 = B - mean_i w_i v_i^T`` of each sample."""

    w: np.ndarray  # (n, dy)
    v: np.ndarray  # (n, dx)
    b: np.ndarray  # (n, dy), mean exactly b
    e: np.ndarray  # (n, dy), mean exactly e
    A0: np.ndarray
    B0: np.ndarray

    def data(self, dtype) -> tuple[dict, dict]:
        """``(inner_data, outer_data)`` in ``dtype``."""
        inner = {"w": self.w.astype(dtype), "v": self.v.astype(dtype), "b": self.b.astype(dtype)}
        return inner, {"e": self.e.astype(dtype)}


def _finite_sum(rng, A, B, b, e, n: int, noise: float, cond: float, coupling: float):
    """Per-sample data whose averages are exactly A, B, b, e (drawn after the mean matrices)."""
    dy, dx = B.shape
    # Rank-one Hessian noise w_i w_i^T with ||w_i||^2 ~ noise * cond, its mean kept <= mu/2
    # so that A0 = A - W stays positive definite and every sample g_i is strongly convex.
    w = rng.standard_normal((n, dy)) * np.sqrt(noise * cond / dy)
    W = w.T @ w / n
    scale = min(1.0, 0.5 / max(np.linalg.eigvalsh(W)[-1], 1e-12))
    w *= np.sqrt(scale)
    W = w.T @ w / n
    v = rng.standard_normal((n, dx)) * coupling / np.sqrt(dx)
    bi = rng.standard_normal((n, dy)) * noise
    bi += b - bi.mean(0)  # exact mean b
    ej = rng.standard_normal((n, dy)) * noise
    ej += e - ej.mean(0)
    return _FiniteSum(w=w, v=v, b=bi, e=ej, A0=A - W, B0=B - w.T @ v / n)


def _flat_levels(A, B, b, D, e, samples: _FiniteSum | None, rho, c_x, dtype):
    """``(inner_flat, outer_flat)``: g and f on flat x, y; a batch (stochastic version) gives
    the sample means of the module docstring's g_i and f_j, ``None`` the mean problem."""
    if samples is not None:
        A0j, B0j = jnp.asarray(samples.A0, dtype), jnp.asarray(samples.B0, dtype)
    Aj, Bj, bj, Dj, ej_ = (jnp.asarray(m, dtype) for m in (A, B, b, D, e))

    def inner_flat(x, y, batch):
        reg = 0.5 * c_x * jnp.sum(x**2)
        if batch is None:
            return 0.5 * y @ (Aj @ y) - y @ (Bj @ x + bj) + reg
        wy, vx = batch["w"] @ y, batch["v"] @ x
        lin = B0j @ x + jnp.mean(batch["w"] * vx[:, None], axis=0) + jnp.mean(batch["b"], axis=0)
        return 0.5 * y @ (A0j @ y) + 0.5 * jnp.mean(wy**2) - y @ lin + reg

    def outer_flat(x, y, batch):
        e_mean = ej_ if batch is None else jnp.mean(batch["e"], axis=0)
        return 0.5 * jnp.sum((y - Dj @ x - e_mean) ** 2) + 0.5 * rho * jnp.sum(x**2)

    return inner_flat, outer_flat


def _starts(dx: int, dy: int, pytree: bool, dtype):
    """Zero starts: flat arrays, or nested dicts holding the same entries."""
    x0, y0 = np.zeros(dx), np.zeros(dy)
    if pytree:
        hx, hy = dx // 2, dy // 2
        x0 = {"a": np.zeros(hx), "b": {"c": np.zeros(dx - hx)}}
        y0 = {"u": np.zeros(hy), "v": {"w": np.zeros(dy - hy)}}
    x0 = jax.tree.map(lambda a: jnp.asarray(a, dtype), x0)
    y0 = jax.tree.map(lambda a: jnp.asarray(a, dtype), y0)
    return x0, y0


def _flat(tree):
    return ravel_pytree(tree)[0]


def _exact_metrics(ref: QuadraticReference, dtype):
    """Exact metrics, jit-able: the float64 closed forms folded into matrices once."""
    M, r = ref._M_r()
    Mj, rj = jnp.asarray(M, dtype), jnp.asarray(r, dtype)
    AinvB, Ainvb = (jnp.asarray(np.linalg.solve(ref.A, m), dtype) for m in (ref.B, ref.b))
    xs = jnp.asarray(ref.x_star, dtype)
    F_star = ref.F(ref.x_star)
    rho = ref.rho

    def metrics(x, y):
        xf, yf = _flat(x), _flat(y)
        res = Mj @ xf + rj
        grad = Mj.T @ res + rho * xf
        F = 0.5 * jnp.sum(res**2) + 0.5 * rho * jnp.sum(xf**2)
        return {
            "grad_norm": jnp.linalg.norm(grad),
            "x_err": jnp.linalg.norm(xf - xs),
            "y_err": jnp.linalg.norm(yf - (AinvB @ xf + Ainvb)),
            "F_gap": F - F_star,
        }

    return metrics

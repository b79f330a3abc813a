r"""The 2-D coreset toy of the IBCG paper (Sec. 5.1, eq. (13), App. G.2; Figs. 1, 3, 4).

Abolfazli, Jiang, Mokhtari, Yazdandoost Hamedani, "An Inexact Conditional Gradient Method for
Constrained Bilevel Optimization" (preprint), Sec. 5.1 and App. G.2. Find the point
closest to a target ``x_0`` whose image under a linear map A lies in the convex hull of four
points ``x_1..x_4`` (the columns of X)::

    min_{lambda in simplex_4}  1/2 ||theta(lambda) - x_0||^2
    s.t.  theta(lambda) in argmin_{theta in R^2}  1/2 ||A theta - X lambda||^2

Upper variable x = lambda (4 weights on the simplex), lower y = theta (2-D). Everything is in
closed form: ``d2g/dy2 = A^T A`` (mu_g, L_g its eigenvalues), ``y*(x) = A^{-1} X x``,
``grad l(x) = X^T A^{-T} (A^{-1} X x - x_0)``; l is a convex quadratic (convex theory applies).

The paper is silent on four things; our choices are:

1. A: ``A = diag(sqrt(L_g), sqrt(mu_g)) Q^T`` with Q the rotation by ``angle`` (pi/6), so
   ``A^T A`` has eigenvalues exactly {L_g, mu_g} and its eigenvectors are not the axes;
2. the points x_1..x_4: the unit-square vertices (0,0), (1,0), (1,1), (0,1);
3. L_g: 4 (at L_g = mu_g = 1, A would be a rotation);
4. mu_g: the figure's value, 1 (Fig. 1) or 0.1 (Figs. 3-4), the factory's argument.

The target ``x_0 = (2, 2)``, ``theta_0 = (0, 0)`` and ``lambda_0 = 1_4/4`` are the paper's.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from bilevel.core.problem import BilevelProblem
from bilevel.core.sets import Simplex

__all__ = ["coreset_toy", "CoresetReference"]

#: the unit-square vertices x_1..x_4, the columns of X (a free choice: the paper gives none)
SQUARE = ((0.0, 1.0, 1.0, 0.0), (0.0, 0.0, 1.0, 1.0))
#: projected-gradient steps that certify lambda* (contraction reached to rounding, see below)
PG_STEPS = 20000


def _project_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection onto the probability simplex (sort-based, Held et al. 1974)."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u)
    j = np.arange(1, v.size + 1)
    r = np.max(np.nonzero(u * j > css - 1)[0])
    return np.maximum(v - (css[r] - 1) / (r + 1), 0)


@dataclasses.dataclass(frozen=True, eq=False)
class CoresetReference:
    """Closed forms of the toy (numpy float64)."""

    A: np.ndarray  # 2x2 map, A^T A has eigenvalues {L_g, mu_g}
    X: np.ndarray  # 2x4 points x_1..x_4 as columns
    target: np.ndarray  # x_0 = (2, 2)
    x_star: np.ndarray  # lambda*: a minimiser of l on the simplex (projected gradient)
    f_star: float  # l* = min over the simplex (unique even where lambda* is not)

    def y_star(self, lam: np.ndarray) -> np.ndarray:
        """``theta*(lambda) = A^{-1} X lambda``."""
        return np.linalg.solve(self.A, self.X @ lam)

    def F(self, lam: np.ndarray) -> float:
        """``l(lambda) = 1/2 ||theta*(lambda) - x_0||^2``."""
        return 0.5 * float(np.sum((self.y_star(lam) - self.target) ** 2))

    def grad_F(self, lam: np.ndarray) -> np.ndarray:
        """``X^T A (A^T A)^{-1} (theta*(lambda) - x_0)`` = ``X^T A^{-T} (...)``: the paper's
        hypergradient eq. (5) on problem (13)."""
        return self.X.T @ np.linalg.solve(self.A.T, self.y_star(lam) - self.target)

    @property
    def theta_star(self) -> np.ndarray:
        """``theta*(lambda*)``, the unique optimal lower-level point."""
        return self.y_star(self.x_star)


def _solve(A: np.ndarray, X: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, float]:
    """lambda* and l* by projected gradient with step 1/L_l on the convex quadratic l."""
    M = np.linalg.solve(A, X)  # theta*(lambda) = M lambda
    step = 1.0 / np.linalg.eigvalsh(M.T @ M)[-1]
    lam = np.full(X.shape[1], 1.0 / X.shape[1])
    for _ in range(PG_STEPS):
        lam = _project_simplex(lam - step * M.T @ (M @ lam - target))
    return lam, 0.5 * float(np.sum((M @ lam - target) ** 2))


def coreset_toy(mu_g: float = 1.0, L_g: float = 4.0, angle: float = math.pi / 6) -> BilevelProblem:
    """The toy problem (13) with ``A^T A`` of eigenvalues ``{mu_g, L_g}`` (see the module).

    Args:
        mu_g: strong convexity of g in theta: 1 (Fig. 1) or 0.1 (Figs. 3-4).
        L_g: smoothness of g in theta (the paper's is unstated; 4 by default).
        angle: rotation of A's singular vectors, in radians.

    Returns:
        A deterministic ``BilevelProblem`` on the simplex whose ``reference`` is a
        :class:`CoresetReference` and whose metrics are ``f_gap = f(lambda_k, theta_k) - f*``
        (the figures' measure, tracked theta: may be negative), ``F_gap = l(lambda_k) - f*``
        and ``y_err = ||theta_k - theta*(lambda_k)||``.
    """
    if not (0 < mu_g <= L_g):
        raise ValueError(f"coreset_toy needs 0 < mu_g <= L_g, got mu_g={mu_g}, L_g={L_g}.")
    c, s = math.cos(angle), math.sin(angle)
    Q = np.array([[c, -s], [s, c]])
    A = np.diag([math.sqrt(L_g), math.sqrt(mu_g)]) @ Q.T
    X = np.array(SQUARE)
    target = np.array([2.0, 2.0])
    lam_star, f_star = _solve(A, X, target)
    ref = CoresetReference(A, X, target, lam_star, f_star)
    A_j, X_j, t_j, M_j = map(jnp.asarray, (A, X, target, np.linalg.solve(A, X)))

    def outer(lam, theta, batch=None):
        del lam, batch
        return 0.5 * jnp.sum((theta - t_j) ** 2)

    def inner(lam, theta, batch=None):
        del batch
        return 0.5 * jnp.sum((A_j @ theta - X_j @ lam) ** 2)

    def metrics(lam, theta):
        y_star = M_j @ lam
        return {
            "f_gap": outer(lam, theta) - f_star,
            "F_gap": outer(lam, y_star) - f_star,
            "y_err": jnp.linalg.norm(theta - y_star),
        }

    return BilevelProblem(
        outer=outer,
        inner=inner,
        x0=jnp.full(4, 0.25),
        y0=jnp.zeros(2),
        x_set=Simplex(),
        metrics=metrics,
        name=f"coreset-toy(mu_g={mu_g:g})",
        reference=ref,
    )

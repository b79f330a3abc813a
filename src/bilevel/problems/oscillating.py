r"""The one-dimensional oscillating stream of Jia & Chen (arXiv:2602.11665, Sec. 4.2).

Round t (from 1), with x in X = [-1, 1] and y in R::

    f_t(x, y) = c exp(-y^2),        g_t(x, y) = mu_g/2 (y - (-1)^t x)^2

so y*_t(x) = (-1)^t x flips sign every round while F_t(x) = c exp(-x^2) never changes:
V_T = 0 and H_{2,T} = sum_{t=2}^T sup_{|x| <= 1} |2x|^2 = 4 (T - 1). The example separates
methods whose regret depends on H_{2,T} (fixed inner iterations: F2OBO, OBBO; linear regret)
from AF2OBO (O(log T) at tau = 1/2). grad F_t(x) = -2 c x exp(-x^2); the projected stationary
points are x = 0 (a maximum of F) and the boundaries +-1.

"c set appropriately" (the paper): f has L_{f,1} = 2c, so lam_1 > 2 L_{f,1}/mu_g = 4c/mu_g; the
default c = 1 with mu_g = 1 needs lam_1 > 4, which F2OBO's default lam_1 = 5 meets. The start
x0 = 0.5 is our choice (the paper gives none); x0 = 0 would sit at the stationary maximum.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from bilevel.analysis.metrics import Variation
from bilevel.core.online_problem import OnlineProblem

__all__ = ["oscillating", "OscillatingReference"]


def _sign(t):
    """(-1)^t for an int (possibly traced) t."""
    return 1 - 2 * (jnp.asarray(t) % 2)


@dataclasses.dataclass(frozen=True, eq=False)
class OscillatingReference:
    """Closed forms of the oscillating stream (jit-able in a traced round t)."""

    c: float
    mu_g: float
    horizon: int

    def y_star(self, t, x):
        return _sign(t) * x

    def F(self, t, x):
        return self.c * jnp.sum(jnp.exp(-(x**2)))

    def grad_F(self, t, x):
        return -2.0 * self.c * x * jnp.exp(-(x**2))

    def variation(self, x_set=None, radius: float | None = None) -> Variation:
        """V_T = 0; H_{2,T} = 4 (T - 1); E^f_{y,T} = 0; E^g_{y,T} = 4 mu_g^2 (T - 1), since
        grad_y g_t - grad_y g_{t-1} = -2 mu_g (-1)^t x; suprema over |x| <= R with R = 1 (X)
        or ``radius``."""
        R = 1.0 if radius is None else float(radius)
        ones = np.ones(self.horizon - 1)
        return Variation.from_increments(
            V=0.0 * ones,
            H2=4.0 * R**2 * ones,
            E_f=0.0 * ones,
            E_g=4.0 * self.mu_g**2 * R**2 * ones,
            over=f"|x| <= {R:g} (closed form)",
        )


def oscillating(
    horizon: int = 100, *, c: float = 1.0, mu_g: float = 1.0, x0: float = 0.5, y0: float = 0.0
) -> OnlineProblem:
    """The Sec. 4.2 stream over ``horizon`` rounds (module docstring).

    Returns:
        A :class:`bilevel.OnlineProblem` on x, y of shape (1,) with ``x_set = Box(-1, 1)``, an
        :class:`OscillatingReference` and ``metrics`` reporting ``grad_norm`` (|grad F_t(x_t)|)
        and ``y_err`` (|y_t - y*_t(x_t)|).
    """
    from bilevel.core import sets

    if not (c > 0 and mu_g > 0):
        raise ValueError(f"oscillating(c={c}, mu_g={mu_g}) needs c > 0 and mu_g > 0.")
    ref = OscillatingReference(c=float(c), mu_g=float(mu_g), horizon=horizon)

    def outer(t, x, y, batch):
        return c * jnp.sum(jnp.exp(-(y**2)))

    def inner(t, x, y, batch):
        return 0.5 * mu_g * jnp.sum((y - _sign(t) * x) ** 2)

    def metrics(t, x, y):
        return {
            "grad_norm": jnp.linalg.norm(ref.grad_F(t, x)),
            "y_err": jnp.linalg.norm(y - ref.y_star(t, x)),
        }

    dtype = jnp.result_type(float)
    return OnlineProblem(
        outer=outer,
        inner=inner,
        horizon=horizon,
        x0=jnp.full((1,), x0, dtype),
        y0=jnp.full((1,), y0, dtype),
        x_set=sets.Box(-1.0, 1.0),
        metrics=metrics,
        name=f"oscillating(T={horizon}, c={c}, mu_g={mu_g})",
        reference=ref,
    )

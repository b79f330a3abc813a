r"""SOBA: the stochastic single-loop method of Dagreou, Ablin, Vaiter & Moreau (NeurIPS 2022).

"A framework for bilevel optimization that enables stochastic and global variance reduction
algorithms" (arXiv:2201.13409). The inner iterate y, the adjoint v (the solution of the linear
system of the implicit function theorem) and x move at the same time, each along a direction
that is a *sum* over samples, so one sample gives an unbiased estimate of all three.

A preset of the implicit-gradient family (``hypergradient/implicit.py``), the composition of
two strategies: the :class:`~bilevel.solvers.hypergradient.adjoint.LinearSystemStep` adjoint
(one SGD step on the linear system, warm-started from the previous v) timed by a
:class:`~bilevel.solvers.hypergradient.timing.SingleLoop` (one y step, every direction at the
step's start, the Hessian product and the cross term on the y step's own sample).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from bilevel.solvers.hypergradient.adjoint import Adjoint, LinearSystemStep
from bilevel.solvers.hypergradient.implicit import AdjointState, ImplicitSolver
from bilevel.solvers.hypergradient.timing import SingleLoop, Timing
from bilevel.solvers.registry import register

__all__ = ["SOBA", "SOBAState", "SOBA_REGIMES"]

#: Step-size orders (a, b) for (gamma_k, rho_k) = (gamma_0, rho_0) (k0/(k+k0))^(a, b):
#: "constant" steps, and "decreasing", Theorem 1's gamma_t = gamma_0 t^-3/5 and
#: rho_t = rho_0 t^-2/5 (with k0 = 1, t = k + 1 exactly).
SOBA_REGIMES = {"constant": (0.0, 0.0), "decreasing": (3.0 / 5.0, 2.0 / 5.0)}

SOBAState = AdjointState  # x, y, v (see the class docstring), k, key, counts, outer_state


@register("soba")
@dataclasses.dataclass(frozen=True)
class SOBA(ImplicitSolver):
    r"""SOBA (Dagreou, Ablin, Vaiter, Moreau, NeurIPS 2022, Sec. 2-3, Theorem 1).

    The paper writes h(x) = F(z*(x), x) with z*(x) = argmin_z G(z, x), G = 1/n sum_i g_i,
    F = 1/m sum_j f_j, and the adjoint v*(x) = -[d2G/dz2]^{-1} grad_z F, so that
    grad h = grad_x F + d2G/dxdz v*. Its three directions at (z, v, x) are::

        D_z = grad_z G(z, x)
        D_v = d2G/dz2 (z, x) v + grad_z F(z, x)
        D_x = d2G/dxdz (z, x) v + grad_x F(z, x)

    and SOBA replaces each by its value on one inner sample i and one outer sample j (drawn
    uniformly and independently; the same i feeds the z-gradient, the Hessian product and the
    cross term, the same j both partials of f), then moves all three variables at once from
    (z^t, v^t, x^t): z^{t+1} = z^t - rho_t D_z^t, v^{t+1} = v^t - rho_t D_v^t,
    x^{t+1} = x^t - gamma_t D_x^t. The cross term uses the *old* v^t.

    This library keeps its own sign convention, v ~ +[d2g/dy2]^{-1} grad_y f (the paper's v
    is its negative) and hypergradient grad_x f - d2g/dxdy v, so per iteration k, with inner
    minibatch B_i and outer minibatch B_j::

        y_{k+1} = y_k - rho_k grad_y g(x_k, y_k; B_i)
        v_{k+1} = v_k - rho_k (d2g/dy2 (x_k, y_k; B_i) v_k - grad_y f(x_k, y_k; B_j))
        x_{k+1} = Proj_X(x_k - gamma_k [grad_x f(x_k, y_k; B_j) - d2g/dxdy (x_k, y_k; B_i) v_k])

    with v_0 = 0. Per step: one y-gradient of g, one Hessian-vector product, one cross product
    and one fused gradient of f, on one inner and one outer minibatch.

    Draws of one step (``inner(i)``, ``outer(i)`` of the step's minibatches; Sec. 2.1, eqs.
    (10a)-(10c): "the same indices" for the three directions)::

        inner(0)   sample i: the y-gradient, the Hessian product and the cross term
        outer(0)   sample j: both partials of f

    Step sizes. Theorem 1: with rho_t = rho_0 t^{-2/5} and gamma_t = gamma_0 t^{-3/5},
    inf_{t <= T} E||grad h(x^t)||^2 = O(log(T) T^{-2/5}) (``regime="decreasing"``, ``k0=1``).
    ``regime="constant"`` (default) keeps rho and gamma fixed, as benchopt's
    ``benchmark_bilevel`` runs SOBA; on a noisy problem it then stalls at a noise floor.

    Checked against the paper (2026-11-27), on the text that could be read: an anonymised
    version of arXiv:2201.13409 with Algorithm 1, eqs. (3)-(10) and Theorems 1-2 (neither the
    published version nor the appendix could be read):

    * samples: Sec. 2.1 and eqs. (10a)-(10c) draw one inner index i and one outer index j,
      uniformly and independently; G_i gives D_z, the Hessian product and the cross term, and
      F_j both partials of F. Here inner draw 0 feeds the y-gradient, the Hessian product and
      the cross term, and outer draw 0 the fused gradient of f, from two split keys; a
      minibatch of i.i.d. rows stands in for the single index. Agrees.
    * evaluation point: Algorithm 1 takes D_z^t, D_v^t, D_x^t at (z^t, v^t, x^t), and Sec. 2.1
      says all are "computed at the same point ... with the same indices": old iterates, the
      cross term with the old v^t. Here every direction is taken at (x_k, y_k, v_k). Agrees.
    * signs: Algorithm 1 subtracts rho^t D_z^t, rho^t D_v^t and gamma^t D_x^t, and eq. (3)
      defines v* = -H^{-1} grad_1 F; with v = -v_paper the updates above are Algorithm 1 term
      by term. y and v share the step rho (Sec. 2.1). Agrees. Proj_X is this library's
      extension (the paper has x in R^d); it is the identity without ``x_set``.
    * steps: "decreasing" has orders (3/5, 2/5) for (gamma, rho): with k0 = 1 these are
      Theorem 2's gamma^t = t^{-3/5}, rho^t = t^{-2/5} at t = k + 1 (t^{-a} is undefined at
      Algorithm 1's t = 0); the constants gamma_0, rho_0 are this library's (the theorem has
      1). Agrees. Theorem 1 takes constant steps rho = T^{-2/5}, gamma = T^{-3/5} for a horizon
      T, i.e. "constant" with lr_inner = T**-0.4, lr_outer = T**-0.6 (not the "auto" default).
    * v_0: Algorithm 1 takes v_0 as an input; v_0 = 0 here (as benchopt). Consistent.
    * could not be verified: the theorem number and the log(T) factor of "Step sizes" above;
      the text read states the decreasing-step result as Theorem 2, with O(T^{-2/5}) and the
      assumption that E[h(x^t)] stays bounded.

    Args:
        lr_outer: gamma (gamma_0 under "decreasing"), or a schedule ``k -> step``.
        lr_inner: rho, the step of both y and v (rho_0 under "decreasing"), or a schedule;
            ``"auto"`` (default) is 1/L_g from ``bl.diagnose``: y and v both run gradient
            descent on a function whose smoothness is L_g (g(x, .) and 1/2 v'Hv - v'grad_y f).
        batch_size: size of the inner and outer minibatches (None = full data).
        regime: "constant" (default) or "decreasing" (Theorem 1); a schedule is used as given.
        k0: offset of the decreasing steps, (k0/(k+k0))^power; 1 is the paper's t^-power.

    References:
        Dagreou, Ablin, Vaiter, Moreau. "A framework for bilevel optimization that enables
        stochastic and global variance reduction algorithms." NeurIPS 2022 (arXiv:2201.13409).

    Assumptions: g(x, .) strongly convex and smooth, f smooth, second derivatives Lipschitz.
    """

    lr_outer: Any = "auto"
    lr_inner: Any = "auto"
    batch_size: int | None = None
    regime: str = "constant"
    k0: float = 1.0

    name: ClassVar[str] = "soba"
    paper: ClassVar[str] = (
        "Dagreou, Ablin, Vaiter, Moreau. A framework for bilevel optimization that enables "
        "stochastic and global variance reduction algorithms. NeurIPS 2022."
    )
    regimes: ClassVar[dict[str, tuple[float, float]]] = SOBA_REGIMES

    def adjoint(self) -> Adjoint:
        return LinearSystemStep()  # lr = rho_k, the inner step of the same iteration

    def timing(self) -> Timing:
        # all directions at (x_k, y_k, v_k), applied together; one inner sample i for D_y, D_v
        # and D_x
        return SingleLoop(hessian_shares_step=True, **self._decay())

    def validate(self) -> None:
        self._check_regime()

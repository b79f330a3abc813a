r"""BSA: bilevel stochastic approximation, a double-loop baseline of STABLE.

Ghadimi & Wang. "Approximation Methods for Bilevel Programming." arXiv:1802.02246, 2018
(Algorithm 2 with the inner SGD of Algorithm 1 and the Hessian-inverse estimate of
Algorithm 3). Run as a baseline in the STABLE paper (Chen, Sun, Xiao, Yin, AISTATS 2022,
Sec. 4, Fig. 1). A preset of the implicit-gradient family (``hypergradient/implicit.py``): the
Neumann or randomised-Neumann adjoint timed by a ``DoubleLoop`` of T inner steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from bilevel.solvers.base import IterateState
from bilevel.solvers.hypergradient.implicit import StochasticApproximation
from bilevel.solvers.hypergradient.timing import DoubleLoop, Timing
from bilevel.solvers.registry import register

__all__ = ["BSA", "BSAState", "BSA_REGIMES"]

#: "constant": constant alpha (Ghadimi & Wang's nonconvex result, alpha ~ 1/sqrt(K)) and
#: constant inner step; "strongly-convex": alpha_k, beta_k ~ 1/(k + k0) (see the BSA docstring).
BSA_REGIMES = {"constant": (0.0, 0.0), "strongly-convex": (1.0, 1.0)}


BSAState = IterateState  # x, y (see the class docstring), k, key, counts, outer_state


@register("bsa")
@dataclasses.dataclass(frozen=True)
class BSA(StochasticApproximation):
    r"""BSA (Ghadimi & Wang 2018, Algorithm 2), as run in the STABLE paper's Sec. 4.

    Per outer iteration k::

        y   <- T SGD steps on g(x_k, .) from the previous y (warm start), step beta_k   (Alg. 1)
        v   ~ [d^2 g/dy^2 (x_k, y)]^{-1} grad_y f(x_k, y; xi_k)                          (Alg. 3)
        x_{k+1} = P_X(x_k - alpha_k [grad_x f(x_k, y; xi_k) - d2g/dxdy(x_k, y; phi_(0)) v])

    Every oracle has its own independent minibatch: T for the inner steps, N - 1 Hessian
    samples for v, one for the cross term (phi_(0)) and one outer one (xi_k, both f-gradients).

    Draws of one step (``inner(i)``, ``outer(i)`` of the step's minibatches; third key of the
    step's split)::

        inner(t), t < T               inner SGD step t (Alg. 1)
        inner(T + j - 1), 1 <= j < N  the Hessian of factor j (Alg. 3)
        inner(T + N - 1)              the cross term, phi_(0)
        outer(0)                      xi_k: both partials of f
        third key                     p of the "random" product (split whichever estimate runs)

    The Hessian-inverse estimate (``hessian_inverse``) is the same as TTSA's: Ghadimi & Wang's
    randomised product N eta prod_{i=1}^{p}(I - eta H_i), p ~ U{0..N-1} ("random"), or the
    Neumann sum with the same mean ("sum", default: noise-free on deterministic problems and of
    fixed cost; with it a BSA step has the structure of a stocBiO step -- Ji et al. 2021 replaced
    exactly this estimator -- and the methods differ in batch size, O~(1) here).

    NOT IN PAPER (choices made here): Ghadimi & Wang grow the inner loop, t_k ~ sqrt(k + 1)
    (nonconvex) or ~ k + 1 (strongly convex), to shrink the inner error. A compiled step has a
    fixed length, so T = ``inner_steps`` is fixed, as in benchopt's BSA; under
    "strongly-convex" the inner step beta_k ~ 1/(k + k0) shrinks instead (SGD with steps ~ 1/k
    has the same O(1/k) mean-square error as 1/k more steps). The STABLE paper gives neither
    the inner-loop length nor N.

    Args:
        lr_outer: alpha (initial value under "strongly-convex"), or a schedule.
        lr_inner: inner SGD step beta, or a schedule; "auto" (default) is 1/L_g (bl.diagnose).
        batch_size: size of every minibatch (None = full data).
        inner_steps: T, inner SGD steps per outer iteration (benchopt's BSA default, 10).
        neumann_steps: N (see ``TTSA``; default 50).
        neumann_lr: eta = 1/L_g in Ghadimi & Wang; "auto" (default) estimates L_g.
        hessian_inverse: "sum" (default) or "random" (the paper's estimator).
        regime: "constant" or "strongly-convex" (alpha_k, beta_k = value * k0/(k + k0)).
        k0: offset of the decaying schedules.

    References:
        Ghadimi & Wang. "Approximation Methods for Bilevel Programming." arXiv:1802.02246, 2018.
        Chen, Sun, Xiao, Yin. "A Single-Timescale Method for Stochastic Bilevel Optimization."
        AISTATS 2022 (the comparison this baseline is for).

    Assumptions: g(x, .) strongly convex and smooth; X closed convex.
    """

    lr_outer: Any = "auto"
    lr_inner: Any = "auto"
    batch_size: int | None = None
    inner_steps: int = 10
    neumann_steps: int = 50
    neumann_lr: Any = "auto"
    hessian_inverse: str = "sum"
    regime: str = "constant"
    k0: float = 100.0

    name: ClassVar[str] = "bsa"
    paper: ClassVar[str] = (
        "Ghadimi, Wang. Approximation Methods for Bilevel Programming. arXiv:1802.02246, 2018, "
        "Algorithm 2."
    )
    regimes: ClassVar[dict[str, tuple[float, float]]] = BSA_REGIMES

    def timing(self) -> Timing:
        # warm-started from the previous inner output, T steps, then Alg. 3 at the new y
        return DoubleLoop(inner_steps=self.inner_steps, **self._timing_options())

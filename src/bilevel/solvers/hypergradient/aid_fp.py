r"""AID-FP: approximate implicit differentiation with fixed-point iterations (baseline).

Grazzi, Franceschi, Pontil, Salzo. "On the Iteration Complexity of Hypergradient Computation."
ICML 2020 (AID-FP, hypertorch ``fixed_point``). The PZOBO paper (Sow, Ji & Liang, NeurIPS 2022,
App. B.1) runs it warm-started and deterministic (Sec. 4.1, 4.4) and stochastic (Sec. 4.2,
App. B.3).

The adjoint ``v = [d^2 g/dy^2]^{-1} grad_y f`` is approximated by K fixed-point iterations
``v <- v - eta (H v - grad_y f)`` (gradient descent on the quadratic). Hypertorch writes them as
``v <- (dPsi/dy)^T v + grad_y f`` for the inner map Psi(y) = y - eta grad_y g, which is the same
iteration scaled by eta. A preset of the implicit-gradient family (``hypergradient/implicit.py``):
the ``FixedPoint`` adjoint timed by a ``DoubleLoop``.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from bilevel.solvers.hypergradient.adjoint import Adjoint, FixedPoint
from bilevel.solvers.hypergradient.implicit import AID
from bilevel.solvers.registry import register

__all__ = ["AIDFP"]


@register("aid-fp")
@dataclasses.dataclass(frozen=True)
class AIDFP(AID):
    r"""AID-FP (Grazzi et al., ICML 2020): the adjoint by K fixed-point iterations
    ``v <- v - fp_lr ([d^2 g/dy^2] v - grad_y f)`` from the previous step's v
    (``linsolve.fixed_point``).

    The iteration and its draws (the "Draws" table) are
    :class:`~bilevel.solvers.hypergradient.implicit.AID`'s.

    Args:
        lr_outer, lr_inner, batch_size, inner_steps, warm_start, fresh_hessian, warm_adjoint: as
            :class:`~bilevel.solvers.hypergradient.aid_cg.AIDCG`.
        linsolve_steps: K, fixed-point iterations (K = N = 20 in the PZOBO paper's App. B.2).
            From v = 0 the truncation leaves a bias ``(I - fp_lr H)^K`` on the adjoint;
            ``warm_adjoint`` carries v over so that successive steps' iterations add up.
        fp_lr: step of the fixed-point iteration, below 2/L_g; None = ``lr_inner`` (the map
            Psi(y) = y - lr_inner grad_y g of hypertorch's formulation).

    References:
        Grazzi, Franceschi, Pontil, Salzo. "On the Iteration Complexity of Hypergradient
        Computation." ICML 2020.

    Assumptions: g(x, .) strongly convex, fp_lr < 2 / L_g.
    """

    fp_lr: float | None = None

    name: ClassVar[str] = "aid-fp"

    def validate(self) -> None:
        super().validate()
        self._check_adjoint_lr("fp_lr")

    def adjoint(self) -> Adjoint:
        lr = self._adjoint_lr("fp_lr")
        return FixedPoint(
            self.linsolve_steps, fresh=self.fresh_hessian, warm=self.warm_adjoint, lr=lr
        )

r"""AID-CG: approximate implicit differentiation with conjugate gradient (baseline).

Grazzi, Franceschi, Pontil, Salzo. "On the Iteration Complexity of Hypergradient Computation."
ICML 2020 (AID-CG, hypertorch ``CG``); Rajeswaran, Finn, Kakade, Levine. "Meta-Learning with
Implicit Gradients." NeurIPS 2019. The PZOBO paper (Sow, Ji & Liang, NeurIPS 2022, App. B.1)
runs it warm-started and deterministic (Sec. 4.1, 4.4) and stochastic (Sec. 4.2, App. B.3).

By the implicit function theorem, ``grad F(x) = grad_x f - (d^2 g/dx dy) [d^2 g/dy^2]^{-1}
grad_y f`` at ``y*(x)``. AID approximates y*(x) by N inner gradient steps and the adjoint
``v = [d^2 g/dy^2]^{-1} grad_y f`` by K iterations of a linear solver that uses only
Hessian-vector products, here conjugate gradient. A preset of the implicit-gradient family
(``hypergradient/implicit.py``): the ``ConjugateGradient`` adjoint timed by a ``DoubleLoop``.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from bilevel.solvers.base import IterateState
from bilevel.solvers.hypergradient.adjoint import Adjoint, ConjugateGradient
from bilevel.solvers.hypergradient.implicit import AID
from bilevel.solvers.registry import register

__all__ = ["AIDCG", "AIDState"]

AIDState = IterateState  # x, y (see the class docstring), k, key, counts, outer_state


@register("aid-cg")
@dataclasses.dataclass(frozen=True)
class AIDCG(AID):
    r"""AID-CG (Grazzi et al., ICML 2020; Rajeswaran et al., NeurIPS 2019): the adjoint by K
    conjugate-gradient iterations on ``[d^2 g/dy^2] v = grad_y f`` (``linsolve.cg``, from the
    previous step's v).

    The iteration and its draws (the "Draws" table) are
    :class:`~bilevel.solvers.hypergradient.implicit.AID`'s.

    Args:
        lr_outer: x step, float or schedule.
        lr_inner: inner (S)GD step, float or schedule; ``"auto"`` (default) is ``1/L_g``
            (``bl.diagnose``).
        batch_size: size of every minibatch (None = full data, the deterministic AID).
        inner_steps: N, inner steps per outer iteration (10: hypertorch / Grazzi et al.).
        linsolve_steps: K, CG iterations (K = N = 20 in the PZOBO paper's App. B.2).
        warm_start: start the inner loop from the previous y (hypertorch, PZOBO code) instead
            of ``problem.y0``.
        fresh_hessian: a fresh minibatch for every Hessian-vector product (hypertorch's
            ``stochastic=True``); default False, one shared minibatch per step.
        warm_adjoint: start the K iterations from the previous step's adjoint v (default;
            Ji, Yang & Liang, ICML 2021, Alg. 1) instead of v = 0 (hypertorch). From 0, K
            iterations leave the adjoint truncated where ``L_g / mu_g`` is far above K, and
            the hypergradient biased: on a per-feature ridge whose ``L_g / mu_g`` reaches 1850
            along the path, AID-FP with K = 20 stalled at 0.15 of its start's ``||grad F||``.
            With ``fresh_hessian`` AID-CG starts from 0 (its first residual would need a
            Hessian sample of its own); AID-FP starts warm either way.

    References:
        Grazzi, Franceschi, Pontil, Salzo. "On the Iteration Complexity of Hypergradient
        Computation." ICML 2020. Ghadimi, Wang. "Approximation Methods for Bilevel
        Programming." arXiv 2018.

    Assumptions: g(x, .) strongly convex (the Hessian in y is positive definite).
    """

    name: ClassVar[str] = "aid-cg"

    def adjoint(self) -> Adjoint:
        return ConjugateGradient(
            self.linsolve_steps, fresh=self.fresh_hessian, warm=self.warm_adjoint
        )

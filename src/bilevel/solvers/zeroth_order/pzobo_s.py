r"""PZOBO-S: the stochastic PZOBO (Algorithm 2, Appendix A).

Sow, Ji, Liang. "On the Convergence Theory for Hessian-Free Bilevel Algorithms." NeurIPS 2022
(arXiv:2110.07004), Algorithm 2 and Theorem 2. The estimator, its options and the shared draws
of the Q + 1 inner paths are PZOBO's (``pzobo.py``); PZOBO-S differs in its defaults only:
minibatches of 256 (Appendix B.3) and the inner step of Theorem 2.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from bilevel.analysis.diagnose import diagnose
from bilevel.core.problem import BilevelProblem
from bilevel.solvers.base import _is_auto
from bilevel.solvers.common import fastest_contraction_step
from bilevel.solvers.registry import register
from bilevel.solvers.zeroth_order.pzobo import PZOBO, auto_smoothness

__all__ = ["PZOBOS"]


@register("pzobo-s")
@dataclasses.dataclass(frozen=True)
class PZOBOS(PZOBO):
    r"""PZOBO-S (Sow, Ji, Liang, NeurIPS 2022, Algorithm 2, Appendix A).

    Per outer iteration k, with u_j ~ N(0, I_p) drawn first::

        for t = 1..N:  draw ONE minibatch S_{t-1}, shared by all Q + 1 paths
                       Y^t   = Y^{t-1}   - alpha grad_y G(x_k,          Y^{t-1};   S_{t-1})
                       Y_j^t = Y_j^{t-1} - alpha grad_y G(x_k + mu u_j, Y_j^{t-1}; S_{t-1})
        delta_j = (Y_j^N - Y^N) / mu;  draw D_F independently of S_0..S_{N-1}
        gradhat = grad_x F(x_k, Y^N; D_F) + (1/Q) sum_j <delta_j, grad_y F(x_k, Y^N; D_F)> u_j
        x_{k+1} = x_k - beta gradhat                                             (eq. 7)

    Same arguments as :class:`PZOBO`, with two defaults changed: ``batch_size=256`` (Appendix
    B.3: "minibatch size B = 256") and ``lr_inner="auto"`` = 2/(L + mu_g) (Theorem 2:
    alpha = 2/(L + mu_g) with L = max(L_f, L_g), :func:`auto_smoothness`; mu_g from
    ``bl.diagnose``; 1/L if g does not look strongly convex), half of it when the run draws
    minibatches (not in the paper: that step has no margin, and each path step sees a new
    minibatch Hessian; :func:`bilevel.solvers.common.fastest_contraction_step` has the
    measurement). The inner and outer minibatches have the same size.

    Draws: those of :class:`PZOBO` (its table): inner(t) for step t of every path (S_t above),
    outer(0) for D_F, the third key of the step's split for the directions u_j.

    References:
        Sow, Ji, Liang. "On the Convergence Theory for Hessian-Free Bilevel Algorithms."
        NeurIPS 2022 (arXiv:2110.07004).

    Assumptions: as PZOBO, for every sample G(., .; zeta), F(., .; xi); bounded variance (A4).
    """

    batch_size: int | None = 256

    name: ClassVar[str] = "pzobo-s"
    paper: ClassVar[str] = (
        "Sow, Ji, Liang. On the Convergence Theory for Hessian-Free Bilevel Algorithms. "
        "NeurIPS 2022, Algorithm 2."
    )

    def resolve(self, problem: BilevelProblem) -> PZOBOS:
        """``lr_inner="auto"`` = 2/(L + mu_g), L = max(L_f, L_g) (Theorem 2), half of it when
        the run draws minibatches (:func:`bilevel.solvers.common.fastest_contraction_step`);
        ``num_directions="auto"`` (:meth:`with_directions`)."""
        solver = self.with_directions(problem).with_counts()
        if not _is_auto(solver.lr_inner):
            return solver
        L, d = auto_smoothness(problem, self.curvature_batch(problem)), diagnose(problem)
        if not d.strongly_convex:
            return dataclasses.replace(solver, lr_inner=1.0 / L)
        step = fastest_contraction_step(d.mu_g, L, self.draws_minibatches(problem))
        return dataclasses.replace(solver, lr_inner=float(step))

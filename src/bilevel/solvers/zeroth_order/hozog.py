r"""HOZOG: a fully zeroth-order hypergradient of F_N(x) = f(x, y^N(x)) (baseline of PZOBO).

Gu, Liu, Zhang, Geng, Huang. "Optimizing Large-Scale Hyperparameters via Automated Learning
Algorithm." arXiv:2102.09026, 2021 (the reference of the PZOBO paper, Sow, Ji, Liang, NeurIPS
2022, which compares against it in Sec. 4.1 and App. C with its own implementation, App. B.1:
"uses evolution strategies to estimate the entire hypergradient").

HOZOG treats the inner solver as a black box ``x -> y^N(x)`` and estimates the whole
hypergradient from values of the outer loss (Gaussian smoothing, Nesterov & Spokoiny 2017)::

    gradhat = (c / (mu Q)) sum_j [f(x + mu u_j, y^N(x + mu u_j)) - f(x, y^N(x))] u_j,

c = 1 for Gaussian u, c = p for unit-sphere u. The perturbation enters f in BOTH arguments: no
gradient of f is ever taken (only Q + 1 values), which is what separates it from PZOBO, whose
estimate uses the analytic partial gradients of f and differences only the inner solutions.

On a quadratic F_N the Gaussian estimate is unbiased for grad F_N at every mu (the smoothed
quadratic has the same gradient; the third moments of u vanish), and its error covariance is
``||grad F_N||^2 I + grad F_N grad F_N^T`` plus the smoothing term
``(mu^2/4) E[(u^T H u)^2 u u^T]`` (H the Hessian of F_N): so near the minimiser of F_N the noise
does not vanish but falls to an O(mu^2 p^3 ||H||^2) floor.

This implementation shares PZOBO's inner machinery (the same inner solver and N, as in the
official code) and all its options: ``directions`` (the official code uses per-tensor
unit directions with c = 1, "sphere_unscaled_per_tensor"), ``warm_start``, ``inner_optimizer``,
``outer_optimizer``. With minibatches (our extension: the PZOBO paper notes HOZOG has no
stochastic version) all paths share the inner draws and all Q + 1 values of f use the same outer
draw, since independent draws would add noise of order sigma / mu to each difference.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from bilevel.core.tree import tree_zeros_like
from bilevel.solvers.registry import register
from bilevel.solvers.zeroth_order.pzobo import PathDifferenceSolver


@register("hozog")
@dataclasses.dataclass(frozen=True)
class HOZOG(PathDifferenceSolver):
    r"""HOZOG (Gu et al., 2021): zeroth-order hypergradient of x -> f(x, y^N(x)).

    Per outer iteration k::

        y^N   = N inner steps on g(x_k, .) from y_0
        for j = 1..Q:  u_j ~ N(0, I_p);  Y_j^N = N inner steps on g(x_k + mu u_j, .) from y_0
        gradhat = (c / (mu Q)) sum_j [f(x_k + mu u_j, Y_j^N) - f(x_k, y^N)] u_j
        x_{k+1} = x_k - beta gradhat

    Draws of one step with ``batch_size`` (our extension; ``inner(i)``, ``outer(i)`` of the
    step's minibatches; third key of the step's split)::

        inner(t), t < N   inner step t of all Q + 1 paths (``shared_batches=False``:
                          inner(jN + t) for path j, 0 = unperturbed)
        outer(0)          all Q + 1 values of f, so each difference sees one sample
        third key         the directions u_1..u_Q

    Hyperparameters: the same as :class:`~bilevel.solvers.zeroth_order.pzobo.PZOBO` (defaults:
    lr_outer "auto", tuned by ``bl.solve``; lr_inner "auto" = 1/L_g; full batches, N = 20,
    ``num_directions="auto"`` (Q = p + 1 for an x of p <= 15 numbers, else 1:
    :func:`~bilevel.solvers.zeroth_order.pzobo.auto_directions`; the PZOBO paper's Appendix B.2
    runs HOZOG with Q = 1), mu = 0.01 as there, Gaussian directions, plain
    GD inside and outside, warm start on, as PZOBO's).

    References:
        Gu, Liu, Zhang, Geng, Huang. "Optimizing Large-Scale Hyperparameters via Automated
        Learning Algorithm." arXiv:2102.09026, 2021.
        Sow, Ji, Liang. "On the Convergence Theory for Hessian-Free Bilevel Algorithms."
        NeurIPS 2022 (the baseline as run there).

    Assumptions: g(x, .) strongly convex (so y^N(x) is a good, smooth proxy of y*(x)); f smooth.
    """

    name: ClassVar[str] = "hozog"
    paper: ClassVar[str] = (
        "Gu, Liu, Zhang, Geng, Huang. Optimizing Large-Scale Hyperparameters via Automated "
        "Learning Algorithm. arXiv:2102.09026, 2021."
    )
    auto_inner_factor: ClassVar[float] = 1.0

    def _unperturbed(self, problem, batch_f, x, y_n):
        # no direct term: the whole hypergradient is estimated from values of f
        return tree_zeros_like(x), problem.outer(x, y_n, batch_f)

    def _coefficient(self, problem, batch_f, x_pert, y_pert, y_n, f_value):
        # the perturbation enters f in both arguments: HOZOG differences values of f, where
        # PZOBO differences only the inner solutions
        return (problem.outer(x_pert, y_pert, batch_f) - f_value) / self.smoothing

    def _oracle_counts(self) -> dict:
        return {"value_f": self.num_directions + 1}

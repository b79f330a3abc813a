r"""stocBiO: stochastic bilevel optimizer with a Neumann-series hypergradient (baseline).

Ji, Yang, Liang. "Bilevel Optimization: Convergence Analysis and Enhanced Design." ICML 2021,
Algorithms 2 and 3. The F2SA paper (Kwon et al., ICML 2023) runs it as "SOBO" with Neumann
degree Q = 5. A preset of the implicit-gradient family (``hypergradient/implicit.py``): the
``Neumann`` adjoint timed by a ``DoubleLoop`` of D inner steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from bilevel.solvers.base import IterateState
from bilevel.solvers.hypergradient.adjoint import Adjoint, Neumann
from bilevel.solvers.hypergradient.implicit import ImplicitSolver
from bilevel.solvers.hypergradient.timing import DoubleLoop, Timing
from bilevel.solvers.registry import register

StocBiOState = IterateState  # x, y (see the class docstring), k, key, counts, outer_state


@register("stocbio")
@dataclasses.dataclass(frozen=True)
class StocBiO(ImplicitSolver):
    r"""stocBiO (Ji, Yang, Liang, ICML 2021, Algorithm 2).

    Per iteration k::

        y <- D SGD steps on g(x_k, .) from the previous y (warm start), step lr_inner
        v  = eta sum_{q=0}^{Q} prod_{j=1}^{q} (I - eta H_j) grad_y f(x_k, y; D_F)   (Alg. 3)
        x <- Proj_X(x_k - lr_outer [grad_x f(x_k, y; D_F) - (d^2 g/dx dy)(x_k, y; D_G) v])

    with an independent minibatch Hessian H_j = d^2 g/dy^2 (x_k, y; B_j) for every factor:
    the family's :class:`~bilevel.solvers.hypergradient.adjoint.Neumann` adjoint with Q + 1
    terms, timed by a :class:`~bilevel.solvers.hypergradient.timing.DoubleLoop` of D steps.

    Draws of one step (``inner(i)``, ``outer(i)`` of the step's minibatches), each fresh as
    Algorithms 2-3 draw them::

        inner(t), t < D                 inner SGD step t
        inner(D + j - 1), 1 <= j <= Q   the Hessian H_j of Neumann factor j, B_j (Alg. 3)
        inner(D + Q)                    the cross product, D_G
        outer(0)                        both partials of f, D_F

    Args:
        lr_outer: x step (alpha), float or schedule.
        lr_inner: inner SGD step (beta), float or schedule; ``"auto"`` (default) is ``1/L_g``
            estimated by ``bl.diagnose`` (the paper's beta <= 1/L).
        batch_size: size of every minibatch (D_F, D_G, B_j and the inner SGD batches).
        inner_steps: D, inner SGD steps per outer iteration, warm-started: each leaves a
            tracking error ``(1 - beta mu_g)^D`` of the last one, so D must grow as beta falls
            too: ``"auto"`` (default) starts at 10 and follows beta as ``neumann_steps`` does.
            On ``benchmarks/defaults.py``'s ``ridge_raw`` with batches of 32 (beta falls 36x
            along the path) stocBiO ended at 0.145 / 0.031 / 0.103 of its start's
            ``||grad F||`` (seeds 0-2) with D = 10, at 0.085 / 0.032 / 0.089 following
            (measured 2026-11-29).
        neumann_steps: Q, the Neumann degree (Q Hessian-vector products per iteration). Its
            truncation bias, the tail ``eta sum_{q > Q} (I - eta H)^q``, decays as
            (1 - eta mu_g)^Q, so Q must grow as eta falls: ``"auto"`` (default) starts at 5
            (the F2SA paper's experiment), and where ``bl.solve`` lowers the ``"auto"`` eta as
            L_g rises it multiplies Q by the same factor (in powers of 2, at most 8:
            :mod:`bilevel.drivers.curvature`). A number is kept as given.
        neumann_lr: eta of the Neumann series, at most 1/L_g (the series converges for eta <
            2/L_g); None = ``lr_inner`` (its "auto" is 1/L_g).

    References:
        Ji, Yang, Liang. "Bilevel Optimization: Convergence Analysis and Enhanced Design."
        ICML 2021.
    """

    lr_outer: Any = "auto"
    lr_inner: Any = "auto"
    batch_size: int | None = None
    inner_steps: int | str = "auto"
    neumann_steps: int | str = "auto"
    neumann_lr: float | None = None

    name: ClassVar[str] = "stocbio"
    paper: ClassVar[str] = (
        "Ji, Yang, Liang. Bilevel Optimization: Convergence Analysis and Enhanced Design. "
        "ICML 2021, Algorithm 2."
    )
    auto_counts: ClassVar[dict[str, int]] = {"inner_steps": 10, "neumann_steps": 5}

    def validate(self) -> None:
        q = self.neumann_steps
        if q != "auto" and (isinstance(q, bool) or not isinstance(q, int) or q < 0):
            raise ValueError(f"neumann_steps must be an int >= 0, got {self.neumann_steps!r}.")
        self._check_adjoint_lr("neumann_lr")

    def adjoint(self) -> Adjoint:
        return Neumann(lr=self._adjoint_lr("neumann_lr"), num_terms=self.neumann_steps + 1)

    def timing(self) -> Timing:
        return DoubleLoop(inner_steps=self.inner_steps)  # y_k^0 = y_{k-1}^D: warm (Algorithm 2)

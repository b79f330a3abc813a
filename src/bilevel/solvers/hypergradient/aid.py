r"""AID-CG and AID-FP: approximate implicit differentiation (baselines).

Ghadimi, Wang. "Approximation Methods for Bilevel Programming." arXiv:1802.02246, 2018 (BA).
Grazzi, Franceschi, Pontil, Salzo. "On the Iteration Complexity of Hypergradient Computation."
ICML 2020 (AID-FP and AID-CG, hypertorch ``fixed_point`` / ``CG``). The PZOBO paper (spec
``shared/specs/pzobo.md`` section 3.5) runs both, warm-started, deterministic (E1, E2, E5) and
stochastic (E3).

By the implicit function theorem, ``grad F(x) = grad_x f - (d^2 g/dx dy) [d^2 g/dy^2]^{-1}
grad_y f`` at ``y*(x)``. AID approximates y*(x) by N inner gradient steps and the adjoint
``v = [d^2 g/dy^2]^{-1} grad_y f`` by K iterations of a linear solver that uses only
Hessian-vector products: conjugate gradient (CG) or the fixed-point iteration
``v <- v - eta (H v - grad_y f)`` (FP, gradient descent on the quadratic; hypertorch writes it as
``v <- (dPsi/dy)^T v + grad_y f`` for the inner map Psi(y) = y - eta grad_y g, which is the same
iteration scaled by eta). Both are presets of the implicit-gradient family
(``solvers/implicit.py``) with the ``ConjugateGradient`` or ``FixedPoint`` strategy.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from bilevel.solvers.base import IterateState
from bilevel.solvers.hypergradient.implicit import (
    Adjoint,
    ConjugateGradient,
    FixedPoint,
    ImplicitSolver,
)
from bilevel.solvers.registry import register

AIDState = IterateState  # x, y (see the class docstring), k, key, counts, outer_state


@dataclasses.dataclass(frozen=True)
class _AID(ImplicitSolver):
    r"""The fields AID-CG and AID-FP share (they differ only in the linear solver).

    Per iteration k, with an independent minibatch for every oracle when ``batch_size`` is set::

        y   <- N (S)GD steps on g(x_k, .) from the previous y (warm start), step lr_inner
        v   ~ [d^2 g/dy^2 (x_k, y; B_H)]^{-1} grad_y f(x_k, y; D_F)       K CG or FP iterations
        x   <- Proj_X(x_k - lr_outer [grad_x f(x_k, y; D_F) - d^2 g/dx dy (x_k, y; B_C) v])

    The adjoint starts from v = 0 every iteration (hypertorch). By default the K Hessian-vector
    products share one minibatch B_H, so CG solves one consistent linear system;
    ``fresh_hessian=True`` draws a new minibatch for every product instead (hypertorch's
    ``stochastic=True``, the "stochastic AID" of the PZOBO paper's E3): K Hessian samples per
    step instead of one, so N + K + 1 inner minibatches.
    """

    lr_outer: Any = 0.01
    lr_inner: Any = "auto"
    batch_size: int | None = None
    inner_steps: int = 10
    linsolve_steps: int = 20
    warm_start: bool = True
    fresh_hessian: bool = False

    paper: ClassVar[str] = "Grazzi, Franceschi, Pontil, Salzo. ICML 2020"

    def validate(self) -> None:
        K = self.linsolve_steps
        if isinstance(K, bool) or not isinstance(K, int) or K < 1:
            raise ValueError(
                f"{type(self).__name__}(linsolve_steps=...) must be a positive int, got {K!r}."
            )


@register("aid-cg")
@dataclasses.dataclass(frozen=True)
class AIDCG(_AID):
    r"""AID-CG (Grazzi et al., ICML 2020; Rajeswaran et al., NeurIPS 2019): the adjoint by K
    conjugate-gradient iterations on ``[d^2 g/dy^2] v = grad_y f`` (``linsolve.cg``, from 0).

    Args:
        lr_outer: x step, float or schedule.
        lr_inner: inner (S)GD step, float or schedule; ``"auto"`` (default) is ``1/L_g``
            (``bl.diagnose``).
        batch_size: size of every minibatch (None = full data, the deterministic AID).
        inner_steps: N, inner steps per outer iteration (10: hypertorch / Grazzi et al.).
        linsolve_steps: K, CG iterations (the PZOBO paper's E1 uses K = N = 20).
        warm_start: start the inner loop from the previous y (hypertorch, PZOBO code) instead
            of ``problem.y0``.
        fresh_hessian: a fresh minibatch for every Hessian-vector product (hypertorch's
            ``stochastic=True``); default False, one shared minibatch per step.

    References:
        Grazzi, Franceschi, Pontil, Salzo. "On the Iteration Complexity of Hypergradient
        Computation." ICML 2020. Ghadimi, Wang. "Approximation Methods for Bilevel
        Programming." arXiv 2018.

    Assumptions: g(x, .) strongly convex (the Hessian in y is positive definite).
    """

    name: ClassVar[str] = "aid-cg"

    def adjoint(self) -> Adjoint:
        return ConjugateGradient(self.linsolve_steps, fresh=self.fresh_hessian)


@register("aid-fp")
@dataclasses.dataclass(frozen=True)
class AIDFP(_AID):
    r"""AID-FP (Grazzi et al., ICML 2020): the adjoint by K fixed-point iterations
    ``v <- v - fp_lr ([d^2 g/dy^2] v - grad_y f)`` from v = 0 (``linsolve.fixed_point``).

    Args:
        lr_outer, lr_inner, batch_size, inner_steps, warm_start, fresh_hessian: as
            :class:`AIDCG`.
        linsolve_steps: K, fixed-point iterations (K = N = 20 in the PZOBO paper's E1). The
            truncation leaves a bias ``(I - fp_lr H)^K`` on the adjoint.
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
        return FixedPoint(self.linsolve_steps, fresh=self.fresh_hessian, lr=lr)

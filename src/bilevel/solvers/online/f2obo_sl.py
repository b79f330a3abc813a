r"""F2OBO-SL: single-loop F2OBO (Algorithm 1 with K = 1, Theorem 3.2).

Jia & Chen, "Fully First-Order Algorithms for Online Non-Convex Bilevel Optimization",
arXiv:2602.11665 (2026), Theorem 3.2 and eq. (8): F2OBO (``f2obo.py``) with one z step and one
y step per round, a multiplier that grows more slowly (tau < 1/2) and an x step that decays
like t^-tau.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from bilevel.solvers.online.f2obo import F2OBO
from bilevel.solvers.registry import register

__all__ = ["F2OBOSingleLoop"]


@register("f2obo-sl")
@dataclasses.dataclass(frozen=True)
class F2OBOSingleLoop(F2OBO):
    r"""Single-loop F2OBO (Jia & Chen, arXiv:2602.11665, Theorem 3.2): Algorithm 1 with K = 1.

    One z step and one y step per round, with Theorem 3.2's schedules: lam_t = lam1 t^tau with
    tau in (0, 1/2); gamma_t = lr_outer t^-tau (the theorem's gamma_t ~ 1/(lam_1 t^tau));
    beta_t = lr_lagrangian / lam_t with the default lr_lagrangian = lr_inner / 2 giving the
    theorem's beta_t = 1/(2 lam_t L_g) at lr_inner = 1/L_g.

    The default ``tau = 0.1``. The theorem's bound O(T^tau (1 + V_T) + T^(1 - 2 tau) + T^(2 tau)
    P_T) is least at tau = 1/4, O(T^(1/2)), when the variations V_T and P_T are bounded but not
    zero (eq. (8)'s tau = 1/3 gives T^(1/3) only where the inner problem does not move at all).
    But tau also sets how fast gamma_t decays, and on horizons of hundreds of rounds that
    decides how far x gets: t^-tau is 0.22 at t = 400 with 1/4 and 0.55 with 0.1. Measured on
    ``drifting_quadratic(horizon=400, ...)`` with ``lr_outer`` left "auto" (the seven streams of
    docs/online.md, 2026-11-29), the regret over that of standing still at x0 went with tau =
    1/4 -> 0.1 from 0.011 / 0.060 / 0.005 / 0.073 / 0.004 / 0.155 / 0.48 to 0.009 / 0.038 /
    0.010 / 0.043 / 0.004 / 0.083 / 0.25 (on the constructor's stream with drift 0.02, the
    fourth, 0.103 with 1/3); 0.05 went further on three of them (0.037 / 0.068 / 0.20) at the
    cost of a multiplier lam_t = lam1 t^tau that barely grows. Pass ``tau=1/4`` for the
    theorem's best bound, ``tau=1/3`` for eq. (8).
    ``inner_steps`` must stay 1 (use ``"f2obo"`` for K > 1). Nothing here depends on the
    horizon T (Theorem 3.2's schedules are in t), so no default follows it; ``lr_outer`` is
    ``"auto"`` as for F2OBO (gamma_1, the step of round 1, which bounds every later gamma_t).

    Draws of round t: F2OBO's (Algorithm 3's layout) with K = 1::

        inner(0)   zeta_t^0: grad_y g at z AND grad_y g at y, the inner step (line 7)
        outer(0)   xi_t^0: grad_y f at y, the inner step (line 7)
        outer(1)   xi_t: grad_x f of ghat (line 10)
        inner(1)   zeta_t: both grad_x g terms of ghat (line 10)
    """

    inner_steps: int = 1
    tau: float = 0.1

    name: ClassVar[str] = "f2obo-sl"
    paper: ClassVar[str] = (
        "Jia, Chen. Fully First-Order Algorithms for Online Non-Convex Bilevel Optimization. "
        "arXiv:2602.11665, 2026, Theorem 3.2."
    )
    outer_decays: ClassVar[bool] = True

    def outer_step_hint(self) -> str:
        return ""

    def settling_hint(self) -> str:
        return (
            f"a smaller tau (now {self.tau:g}; the step decays like t^-tau: on "
            "drifting_quadratic(cond=20, drift 0.02) tau=0.1 ended at 0.083 of standing still's "
            "regret where 1/4 ended at 0.155), 'f2obo' with more inner steps, or a longer horizon"
        )

    def validate(self) -> None:
        super().validate()
        if self.inner_steps != 1:
            raise ValueError(
                f"F2OBOSingleLoop(inner_steps={self.inner_steps}) must be 1: F2OBO-SL is the "
                "single-loop variant; use 'f2obo' for K > 1 inner steps."
            )

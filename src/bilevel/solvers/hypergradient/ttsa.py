r"""TTSA: two-timescale stochastic approximation for bilevel problems (baseline of STABLE).

Hong, Wai, Wang, Yang. "A Two-Timescale Stochastic Algorithm Framework for Bilevel
Optimization: Complexity Analysis and Application to Actor-Critic." SIAM J. Optim. 2023
(arXiv:2007.05170, 2020). Implemented as the STABLE paper (Chen, Sun, Xiao, Yin, AISTATS 2022)
writes it in its eq. (7) and runs it in its Sec. 4.

One stochastic gradient step on y and one projected hypergradient step on x per iteration, with
no correction for the motion of y*(x): the x step must be on a slower timescale,
alpha_k / beta_k -> 0. A preset of the implicit-gradient family (``hypergradient/implicit.py``):
the Neumann or randomised-Neumann adjoint timed by a ``SingleLoop``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax.numpy as jnp

from bilevel.core.problem import BilevelProblem
from bilevel.solvers.base import IterateState
from bilevel.solvers.hypergradient.adjoint import Adjoint
from bilevel.solvers.hypergradient.implicit import StochasticApproximation
from bilevel.solvers.hypergradient.timing import SingleLoop, Timing
from bilevel.solvers.registry import register

__all__ = ["TTSA", "TTSAState", "TTSA_REGIMES"]

#: Step-size orders of Hong et al.: "constant" (the nonconvex theorem: alpha ~ K^-3/5 and
#: beta ~ K^-2/5 for a horizon K, constant in k, so the user scales the constants), and
#: "strongly-convex" (alpha_k ~ 1/(k + k0), beta_k ~ (k + k0)^-2/3).
TTSA_REGIMES = {"constant": (0.0, 0.0), "strongly-convex": (1.0, 2.0 / 3.0)}


TTSAState = IterateState  # x, y (see the class docstring), k, key, counts, outer_state


@register("ttsa")
@dataclasses.dataclass(frozen=True)
class TTSA(StochasticApproximation):
    r"""TTSA as written in the STABLE paper, eq. (7) (Hong et al. 2020, Algorithm 1).

    Per iteration k, with one inner sample phi^k and one outer sample xi^k::

        y^{k+1} = y^k - beta_k grad_y g(x^k, y^k; phi^k)                                   (7a)
        x^{k+1} = P_X(x^k - alpha_k [grad_x f(x^k, y^k; xi^k)
                                     - d2g/dxdy(x^k, y^k; phi^k) v^k])                     (7b)
        v^k ~ [d^2 g/dy^2 (x^k, y^k)]^{-1} grad_y f(x^k, y^k; xi^k)

    with the Neumann estimate v^k on N - 1 further independent inner samples (N =
    ``neumann_steps``, eta = ``neumann_lr`` = c_h / L_g):

    * ``hessian_inverse="sum"`` (default): v = eta sum_{q<N} prod_{j<=q}(I - eta H_j) grad_y f,
      N - 1 Hessian-vector products (the stocBiO form, ``linsolve.neumann``);
    * ``"random"``: Hong et al.'s (and Ghadimi & Wang's) v = N eta prod_{j=1}^{p}(I - eta H_j)
      grad_y f with p ~ U{0..N-1}: p products, so the per-step counts vary with p.

    Both have the same mean, eta sum_{q<N}(I - eta A)^q grad_y f (bias (1 - eta mu_g)^N).
    "sum" is the default because the random product stays noisy on noise-free problems (so no
    deterministic convergence) and its cost is random; "random" is the papers' literal estimator.

    Draws of one step (``inner(i)``, ``outer(i)`` of the step's minibatches; third key of the
    step's split)::

        inner(0)               phi^k: the y-gradient (7a) and the cross term (7b)
        inner(j), 1 <= j < N   the Hessian of factor j, each its own sample ("growing": only
                               j < t_max(k); the other declared draws are neither used nor
                               counted)
        outer(0)               xi^k: both partials of f
        third key              p of the "random" product (split whichever estimate runs)

    Fidelity notes: the STABLE paper's (7) evaluates both updates at (x^k, y^k) and uses the
    y-gradient's sample phi^k in the cross term; that is what is run here. benchopt's TTSA
    evaluates the hypergradient at the updated y^{k+1} (Gauss-Seidel order), which we believe
    matches Hong et al.'s Algorithm 1 (not checked against their text here); not offered.

    Args:
        lr_outer: alpha (initial value under "strongly-convex"), or a schedule.
        lr_inner: beta, or a schedule; ``"auto"`` (default) is 1/L_g from ``bl.diagnose``.
        batch_size: size of every minibatch (None = full data).
        neumann_steps: N, terms of the Neumann series (N - 1 Hessian samples). NOT IN PAPER:
            the papers take N = O((L_g/mu_g) log(1/eps)); 50 gives a relative bias
            (1 - mu_g/L_g)^50 = 5e-3 at condition number 10. ``"growing"``: TTSA as the IBCG
            paper runs it (Abolfazli et al., App. G.1), N at iteration k is
            ``t_max(k) = max(1, ceil((L_g/mu_g) log(k + 1)))`` (the paper writes no rounding,
            and t_max(0) = 0: ceil and the floor at 1 are ours), at most ``max_neumann``.
        max_neumann: the cap of the growing length, and the Hessian samples declared per step
            under ``neumann_steps="growing"`` (those past t_max(k) are not drawn, nor counted).
            1000 reaches past t_max(10^4) = 921 at L_g/mu_g = 100.
        condition_number: L_g/mu_g of t_max(k); ``None`` (default): from ``bl.diagnose`` at
            (x0, y0) when ``neumann_steps="growing"`` (unused otherwise).
        neumann_lr: eta = c_h / L_g with c_h in (0, 1]; "auto" (default) is 1/L_g (c_h = 1).
        hessian_inverse: "sum" or "random" (see above).
        regime: "constant" (nonconvex theorem: constant alpha ~ K^-3/5, beta ~ K^-2/5) or
            "strongly-convex" (alpha_k = alpha_0 k0/(k+k0), beta_k = beta_0 (k0/(k+k0))^(2/3)).
        k0: offset of the decaying schedules.

    References:
        Hong, Wai, Wang, Yang. "A Two-Timescale Stochastic Algorithm Framework for Bilevel
        Optimization: Complexity Analysis and Application to Actor-Critic." SIAM J. Optim.
        33(1), 2023 (arXiv:2007.05170, 2020). Chen, Sun, Xiao, Yin. "A Single-Timescale Method
        for Stochastic Bilevel Optimization." AISTATS 2022, eq. (7).

    Assumptions: g(x, .) strongly convex and smooth; X closed convex; alpha_k / beta_k -> 0.
    """

    lr_outer: Any = "auto"
    lr_inner: Any = "auto"
    batch_size: int | None = None
    neumann_steps: int | str = 50
    neumann_lr: Any = "auto"
    hessian_inverse: str = "sum"
    regime: str = "constant"
    k0: float = 100.0
    max_neumann: int = 1000
    condition_number: float | None = None

    name: ClassVar[str] = "ttsa"
    paper: ClassVar[str] = (
        "Hong, Wai, Wang, Yang. A Two-Timescale Stochastic Algorithm Framework for Bilevel "
        "Optimization: Complexity Analysis and Application to Actor-Critic. SIAM J. Optim. 2023 "
        "(arXiv:2007.05170, 2020)."
    )
    regimes: ClassVar[dict[str, tuple[float, float]]] = TTSA_REGIMES

    @property
    def growing(self) -> bool:
        """Whether the Neumann length grows as t_max(k) (the IBCG paper's TTSA)."""
        return self.neumann_steps == "growing"

    def timing(self) -> Timing:
        return SingleLoop(**self._timing_options())  # (7a), (7b) at (x^k, y^k), phi^k in both

    def adjoint(self) -> Adjoint:
        if not self.growing:
            return super().adjoint()
        # the declared strategy: max_neumann terms bound the Hessian samples of a step
        return dataclasses.replace(self, neumann_steps=self.max_neumann).adjoint()

    def neumann_length(self, k) -> Any:
        """``t_max(k) = max(1, ceil(kappa log(k + 1)))``, at most ``max_neumann`` (traced)."""
        if self.condition_number is None:
            raise ValueError(
                "TTSA(neumann_steps='growing') needs condition_number = L_g/mu_g: call "
                "solver.resolve(problem) (bl.solve does it) or give it."
            )
        kf = jnp.asarray(k, dtype=jnp.result_type(float))
        t = jnp.ceil(self.condition_number * jnp.log(kf + 1.0)).astype(jnp.int32)
        return jnp.clip(t, 1, self.max_neumann)

    def adjoint_at(self, k) -> Adjoint:
        if not self.growing or k is None:
            return self.adjoint()
        return dataclasses.replace(self.adjoint(), active_terms=self.neumann_length(k))

    def validate(self) -> None:
        if not self.growing:
            return super().validate()
        m = self.max_neumann
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"TTSA(max_neumann=...) must be an int >= 1, got {m!r}.")
        kappa = self.condition_number
        if kappa is not None and not (isinstance(kappa, int | float) and kappa >= 1):
            raise ValueError(f"TTSA(condition_number=...) must be L_g/mu_g >= 1, got {kappa!r}.")
        return dataclasses.replace(self, neumann_steps=m).validate()

    def resolve(self, problem: BilevelProblem) -> TTSA:
        solver = super().resolve(problem)
        if solver.growing and solver.condition_number is None:
            from bilevel.analysis.diagnose import strong_convexity

            mu_g, L_g = strong_convexity(
                problem, "TTSA(neumann_steps='growing') needs L_g/mu_g", "give condition_number"
            )
            solver = dataclasses.replace(solver, condition_number=L_g / mu_g)
        return solver

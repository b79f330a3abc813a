r"""TTSA: two-timescale stochastic approximation for bilevel problems (baseline of STABLE).

Hong, Wai, Wang, Yang. "A Two-Timescale Stochastic Algorithm Framework for Bilevel
Optimization: Complexity Analysis and Application to Actor-Critic." SIAM J. Optim. 2023
(arXiv:2007.05170, 2020). Implemented as the STABLE paper (Chen, Sun, Xiao, Yin, AISTATS 2022)
writes it in its eq. (7) and runs it in its Sec. 4; spec ``shared/specs/stable.md`` Sec. 2.4.

One stochastic gradient step on y and one projected hypergradient step on x per iteration, with
no correction for the motion of y*(x): the x step must be on a slower timescale,
alpha_k / beta_k -> 0.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from ... import oracles
from ..._tree import tree_axpy
from ...problem import BilevelProblem
from ...sampling import batch_count
from ..base import IterateState, Solver, _is_auto
from ..common import implicit_hypergradient, neumann_adjoint
from ..registry import register

PyTree = Any

__all__ = ["TTSA", "TTSAState", "NeumannBaseline", "TTSA_REGIMES"]

#: Step-size orders of Hong et al.: "constant" (the nonconvex theorem: alpha ~ K^-3/5 and
#: beta ~ K^-2/5 for a horizon K, constant in k, so the user scales the constants), and
#: "strongly-convex" (alpha_k ~ 1/(k + k0), beta_k ~ (k + k0)^-2/3).
TTSA_REGIMES = {"constant": (0.0, 0.0), "strongly-convex": (1.0, 2.0 / 3.0)}


class NeumannBaseline(Solver):
    """Pieces TTSA and BSA share: the (randomised) Neumann inverse-Hessian estimate of Ghadimi &
    Wang (2018, Alg. 3) and its step size ``neumann_lr = c_h / L_g`` with ``"auto"`` = 1/L_g.

    Not registered; subclasses declare ``neumann_steps``, ``neumann_lr``, ``hessian_inverse``.
    """

    #: exponents (a, b) of alpha_k = alpha_0 (k0/(k+k0))^a and beta_k = beta_0 (k0/(k+k0))^b
    regimes: ClassVar[dict[str, tuple[float, float]]] = {"constant": (0.0, 0.0)}

    def _validate_neumann(self) -> None:
        cls = type(self).__name__
        n = self.neumann_steps
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{cls}(neumann_steps=...) must be an int >= 1, got {n!r}.")
        lr = self.neumann_lr
        if lr != "auto" and (isinstance(lr, bool) or not isinstance(lr, int | float) or not lr > 0):
            raise ValueError(
                f"{cls}(neumann_lr=...) must be a positive float below 1/L_g or 'auto' (1/L_g "
                f"from bl.diagnose), got {lr!r}."
            )
        if self.hessian_inverse not in ("sum", "random"):
            raise ValueError(
                f"{cls}(hessian_inverse={self.hessian_inverse!r}) is unknown; use 'sum' "
                "(Neumann sum, fixed cost) or 'random' (Ghadimi & Wang's randomised product)."
            )
        if self.regime not in self.regimes:
            raise ValueError(
                f"{cls}(regime={self.regime!r}) is unknown; use one of {sorted(self.regimes)}."
            )
        if not (isinstance(self.k0, int | float) and self.k0 > 0):
            raise ValueError(f"{cls}(k0=...) must be > 0, got {self.k0!r}.")

    def resolve(self, problem: BilevelProblem):
        solver = super().resolve(problem)
        if _is_auto(solver.neumann_lr):
            from ...diagnose import auto_inner_step

            solver = dataclasses.replace(solver, neumann_lr=auto_inner_step(problem, 1.0))
        return solver

    def step_sizes(self, k) -> tuple[jax.Array, jax.Array]:
        """``(alpha_k, beta_k)``: floats decay by the regime's orders, schedules are as given."""
        kf = jnp.asarray(k, dtype=jnp.result_type(float))
        a, b = self.regimes[self.regime]
        ratio = self.k0 / (kf + self.k0)

        def rate(value, power):
            return value(kf) if callable(value) else value * ratio**power

        return rate(self.lr_outer, a), rate(self.lr_inner, b)

    def adjoint(self, problem, mb, x, y, rhs, first: int, key):
        """``(v, hvps)``: v ~ [d^2 g/dy^2]^{-1} rhs from inner draws ``first, first + 1, ...``."""
        return neumann_adjoint(
            problem,
            mb,
            x,
            y,
            rhs,
            lr=self.neumann_lr,
            num_terms=self.neumann_steps,
            first=first,
            randomized=self.hessian_inverse == "random",
            key=key,
        )

    def unused_draws(self, problem: BilevelProblem, hvps) -> Any:
        """Inner samples declared for Hessian factors the random estimator did not use."""
        return (self.neumann_steps - 1 - hvps) * batch_count(problem.inner_data, self.batch_size)


TTSAState = IterateState  # x, y (see the class docstring), k, key, counts, outer_state


@register("ttsa")
@dataclasses.dataclass(frozen=True)
class TTSA(NeumannBaseline):
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
            (1 - mu_g/L_g)^50 = 5e-3 at condition number 10.
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

    lr_outer: Any = 0.01
    lr_inner: Any = "auto"
    batch_size: int | None = None
    neumann_steps: int = 50
    neumann_lr: Any = "auto"
    hessian_inverse: str = "sum"
    regime: str = "constant"
    k0: float = 100.0

    name: ClassVar[str] = "ttsa"
    regimes: ClassVar[dict[str, tuple[float, float]]] = TTSA_REGIMES

    def validate(self) -> None:
        self._validate_neumann()

    def init(self, problem: BilevelProblem, key: jax.Array) -> TTSAState:
        return self.initial_state(problem, key)

    def step(self, problem: BilevelProblem, state: TTSAState) -> TTSAState:
        f, g = problem.outer, problem.inner
        x, y, N = state.x, state.y, self.neumann_steps
        key, batch_key, p_key = jax.random.split(state.key, 3)
        # inner draw 0 is phi^k (y-gradient and, as in (7b), the cross term); draws 1..N-1 are
        # the Hessian samples of the Neumann estimate; one outer draw xi^k for both f-gradients
        mb = self.minibatches(problem, batch_key, outer=1, inner=N)
        phi = mb.inner(0)
        alpha, beta = self.step_sizes(state.k)

        h_g = oracles.grad_y(g, x, y, phi)
        grad_x_f, grad_y_f = oracles.grads(f, x, y, mb.outer(0))
        v, hvps = self.adjoint(problem, mb, x, y, grad_y_f, first=1, key=p_key)
        hypergrad = implicit_hypergradient(problem, x, y, v, grad_x_f, phi)  # (7b)
        x_new, outer_state = self.outer_step(problem, x, hypergrad, state.outer_state, alpha)
        y_new = tree_axpy(-beta, h_g, y)  # (7a)

        counts = state.counts.add(
            samples_outer=mb.samples_outer,
            samples_inner=mb.samples_inner - self.unused_draws(problem, hvps),
            grad_f=1,
            grad_g=1,
            hvp=hvps,
            cross=1,
        )
        return TTSAState(
            x=x_new, y=y_new, k=state.k + 1, key=key, counts=counts, outer_state=outer_state
        )

r"""OBBO: the online Bregman bilevel optimizer with ITD hypergradients (baseline), and the round
SOBBO (``sobbo.py``) shares.

Bohne, Rosenberg, Kazantsev, Polak. "Online Nonconvex Bilevel Optimization with Bregman
Divergences." arXiv:2409.10470 (2024). The F2OBO paper (Jia & Chen, arXiv:2602.11665) runs OBBO
in its Experiment 1 (K = 5) and SOBBO in its Experiment 2 (w = 50, K = 5), Appendix A, and
describes OBBO as using "iterative differentiation (ITD) to compute hypergradients" (Sec. 1.2).

Round t, from the warm start y_t::

    y_t^{k+1} = y_t^k - alpha grad_y g_t(x_t, y_t^k; zeta_k),   k < K   (y_{t+1} = y_t^K)
    h_t       = d/dx f_t(x, y_t^K(x); xi) at x_t                      (ITD: reverse mode)
    x_{t+1}   = argmin_{u in X} <(1/W) sum_{i<w} eta^i h_{t-i}, u> + D_phi(u, x_t) / gamma

With the Euclidean divergence D_phi(u, x) = ||u - x||^2 / 2 the Bregman step is the projected
step Proj_X(x_t - gamma avg_t), which is what is implemented (``self.outer_step``); other
mirror maps (an entropy on the simplex, a scaled norm) are not offered. SOBBO's
"weighted average of recent stochastic approximations of hypergradients", which the abstract
says obviates "additional stochastic gradient samples at each timestep", is read as the
average of the *stored* estimates h_{t-i} made at rounds t - i (``online/window.py``'s ``Window``),
weighed like SOBOW's window (eta^i / W); OBBO is the same round with w = 1.

Not verified against the paper's pseudocode (its algorithm pages could not be read here): the
exact weights of SOBBO's average (eta^i / W is SOBOW's) and whether OBBO's inner loop is warm
started (it is here, as in every online baseline). The per-round K follows the horizon,
K = O(log T) (F2OBO's Table 1 gives OBBO O(T log T) gradient calls); the experiments' K = 5
is ``inner_steps=5``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax

from bilevel.core.oracles import Counts
from bilevel.core.schedules import round_step_size
from bilevel.solvers.base import OuterState
from bilevel.solvers.common import Levels
from bilevel.solvers.hypergradient.itd import unrolled_hypergradient
from bilevel.solvers.online import auto
from bilevel.solvers.online.base import OnlineSolver
from bilevel.solvers.online.window import Window, check_window
from bilevel.solvers.registry import register

PyTree = Any

__all__ = ["OBBO", "OBBOState"]


class OBBOState(NamedTuple):
    x: PyTree  # x_t, committed for round t
    y: PyTree  # y_t, the inner decision: K GD steps on g_{t-1} from y_{t-1}
    t: jax.Array  # the round about to be played (int32, from 1)
    key: jax.Array  # PRNG key
    counts: Counts  # samples and oracle calls so far
    outer_state: OuterState  # the outer optimiser's state
    window: Window  # the ITD hypergradient estimates h_{t-1}, ..., h_{t-w} of the last w rounds


@register("obbo")
@dataclasses.dataclass(frozen=True)
class OBBO(OnlineSolver):
    r"""OBBO (Bohne et al., arXiv:2409.10470): a Euclidean Bregman (projected) x step along the
    ITD hypergradient through K warm-started inner GD steps (module docstring).

    Draws of round t (the second key of ``split(state.key)``; the unrolled steps' zeta_k and the
    hypergradient's xi of the module docstring's round, not checked against the paper's
    pseudocode)::

        inner(k), k < K   zeta_k: grad_y g of unrolled step k, and its d2g/dy2 and d2g/dxdy
                          products in the reverse pass
        outer(0)          xi: both partials of f at y_t^K (the ITD hypergradient h_t)

    Args:
        lr_outer: gamma, the x step (float or schedule of t). Default ``"auto"``: tuned by
            ``bl.solve_online`` on the first rounds, below the stable bound of the round map
            (``bilevel.drivers.online``); a number above the bound is refused. (F2OBO's
            Experiment 1 used 0.001 for "all algorithms".)
        lr_inner: alpha, the inner GD step, also the step of the unrolled map. Default
            ``"auto"`` = 1/L_g of round 1 (``bl.diagnose``); Experiment 1 used 0.1.
        batch_size: minibatch size of every draw (``None`` = the whole round): unrolled step k
            uses its own inner batch zeta_k, the hypergradient one outer batch xi.
        inner_steps: K, unrolled GD steps per round. Default ``"auto"``: the least K with
            T rho^K <= 1 for the run's horizon T, rho = 1 - alpha mu_g (mu_g from
            ``bl.diagnose``), so that the truncation error of the ITD hypergradient, which
            shrinks like rho^K, sums to O(1) in the regret: K = O(log T), the O(T log T)
            gradient calls of F2OBO's Table 1 for OBBO (``auto.unrolled_inner_steps``).
            Experiments 1 and 2 used 5, which leaves a bias floor on an ill-conditioned g.
        window: w, hypergradient estimates averaged (static). Default 1 (OBBO: no average).
        eta: lag i weighs eta^i / W. Default 1.0 (a plain average).
        window_start: ``"zeros"`` (missing rounds t - i < 1 count as zero, W = sum of all w
            weights) or ``"renormalize"`` (W over the rounds present); see
            ``bilevel.solvers.online.window``.

    Per-round counts (ITD): ``grad_f = 1``, ``grad_g = K``, ``hvp = K``, ``cross = K``;
    samples: K inner draws and 1 outer draw.
    """

    lr_outer: Any = "auto"
    lr_inner: Any = "auto"
    batch_size: int | None = None
    inner_steps: int | str = "auto"
    window: int = 1
    eta: float = 1.0
    window_start: str = "zeros"

    name: ClassVar[str] = "obbo"
    #: the ITD hypergradient holds the warm start y_t constant with ``stop_gradient``, so the
    #: round map's dependence on y_t is seen by differences only (``stable_outer_step``)
    linearise_by_differences: ClassVar[bool] = True
    paper: ClassVar[str] = (
        "Bohne, Rosenberg, Kazantsev, Polak. Online Nonconvex Bilevel Optimization with Bregman "
        "Divergences. arXiv:2409.10470, 2024."
    )

    def validate(self) -> None:
        check_window(self)

    def resolve_settings(self, problem) -> OBBO:
        """``lr_inner="auto"`` as every online solver, then ``inner_steps="auto"``: the least
        K with T rho^K <= 1, rho = 1 - alpha mu_g (``auto.unrolled_inner_steps``)."""
        solver = super().resolve_settings(problem)
        if solver.inner_steps == "auto":
            from bilevel.analysis.diagnose import strong_convexity

            mu, L = strong_convexity(
                problem.round_problem(1),
                f"{type(self).__name__}(inner_steps='auto') needs mu_g and L_g",
                "give inner_steps as an int",
            )
            alpha = float(round_step_size(solver.lr_inner, 1))  # a schedule: round 1's
            rho = auto.inner_contraction(alpha, mu, L)
            steps = auto.unrolled_inner_steps(problem.horizon, rho)
            solver = dataclasses.replace(solver, inner_steps=steps)
        return solver

    def init(self, problem, key: jax.Array) -> OBBOState:
        return OBBOState(
            **self.first_round(problem, key),
            window=Window.zeros(problem.x0, self.window),
        )

    def round(self, problem, state: OBBOState) -> OBBOState:
        t, K = state.t, self.inner_steps
        key, batch_key = jax.random.split(state.key)
        mb = self.round_batches(problem, t, batch_key, outer=1, inner=K)
        lr = round_step_size(self.lr_inner, t)
        h, y = unrolled_hypergradient(Levels(*problem.at_round(t)), mb, state.x, state.y, lr, K)
        window = state.window.push(h, t)
        direction = window.average(t, self.eta, self.window_start)
        x, outer_state = self.outer_step(
            problem, state.x, direction, state.outer_state, self.outer_lr(t)
        )
        counts = state.counts.add(
            samples_outer=mb.samples_outer,
            samples_inner=mb.samples_inner,
            grad_f=1,
            grad_g=K,
            hvp=K,
            cross=K,
        )
        return OBBOState(x, y, t + 1, key, counts, outer_state, window)

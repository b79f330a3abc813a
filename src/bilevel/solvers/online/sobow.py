r"""SOBOW: the single-loop online bilevel optimizer with window averaging (baseline).

Lin, Sow, Ji, Liang, Shroff. "Non-Convex Bilevel Optimization with Time-Varying Objective
Functions." NeurIPS 2023 (arXiv:2308.03811). The abstract: SOBOW "updates the outer-level
decision based on a window average of the most recent hypergradient estimations stored in the
memory" and "does not need to know previous functions". Round t, from the warm starts y_t, v_t::

    y_{t+1} = K GD steps y <- y - alpha grad_y g_t(x_t, y)                   (K = 1: single loop)
    v_{t+1} = N GD steps on the linear system, from v_t:
              v <- v - beta (d2g_t/dy2 (x_t, y_{t+1}) v - grad_y f_t(x_t, y_{t+1}))
    h_t     = grad_x f_t(x_t, y_{t+1}) - d2g_t/dxdy (x_t, y_{t+1}) v_{t+1}  (stored)
    x_{t+1} = Proj_X(x_t - gamma (1/W) sum_{i<w} eta^i h_{t-i}),  W = sum_{i<w} eta^i

The window is ``online/window.py``'s ``Window`` (estimates of rounds before 1 count as zero with the
default ``window_start="zeros"``). The N linear-system steps are ``linsolve.fixed_point`` warm
started at v_t (the F2OBO paper's Experiment 1 ran "5 linear-system solving steps"); the
Stochastic-OBO paper of Nazari et al. (2025) describes SOBOW's solver as conjugate gradient,
which is not offered here. Not verified against the paper's own pseudocode (its algorithm page
could not be read here): the step count of the y and v updates per round, and whether v is
warm-started (it is here).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax

from bilevel.core.oracles import Counts
from bilevel.core.schedules import round_step_size
from bilevel.core.tree import tree_zeros_like
from bilevel.solvers.base import OuterState
from bilevel.solvers.common import Levels, inner_sgd, linear_system_hypergradient
from bilevel.solvers.online.base import OnlineSolver
from bilevel.solvers.online.window import Window, check_window
from bilevel.solvers.registry import register

PyTree = Any

__all__ = ["SOBOW", "SOBOWState"]


class SOBOWState(NamedTuple):
    x: PyTree  # x_t, committed for round t
    y: PyTree  # y_t, tracks y*_{t-1}(x_{t-1}); the inner decision
    v: PyTree  # v_t, tracks [d2g/dy2]^{-1} grad_y f at (x_{t-1}, y_t)
    t: jax.Array  # the round about to be played (int32, from 1)
    key: jax.Array  # PRNG key
    counts: Counts  # samples and oracle calls so far
    outer_state: OuterState  # the outer optimiser's state
    window: Window  # the stored estimates h_{t-1}, ..., h_{t-w}


@register("sobow")
@dataclasses.dataclass(frozen=True)
class SOBOW(OnlineSolver):
    r"""SOBOW (Lin et al., NeurIPS 2023): single-loop y and linear-system steps, x along the
    eta-weighted window average of the last w stored hypergradient estimates (module docstring).

    Draws of round t (the second key of ``split(state.key)``; the layout is ours, the paper's
    pseudocode could not be read: module docstring)::

        inner(k), k < K   grad_y g of y step k
        inner(K)          every d2g/dy2 product of the N linear-system steps (one system)
        inner(K + 1)      the cross term d2g/dxdy v_{t+1} of h_t
        outer(0)          both partials of f at y_{t+1} (grad_y f of the system, grad_x f)

    Args:
        lr_outer: gamma, the x step. Default ``"auto"``: tuned by ``bl.solve_online`` below
            the stable bound of the round map, which the window of stored estimates lowers
            about w-fold (``bilevel.drivers.online``); a number above it is refused. (F2OBO's
            Experiment 1 used 0.001.)
        lr_inner: alpha, the y step. Default ``"auto"`` = 1/L_g of round 1 (``bl.diagnose``);
            Experiment 1 used 0.1.
        lr_linsys: beta, the linear-system step; ``None`` (default) = ``lr_inner`` (beta <
            2 / L_g is needed for the steps to contract).
        batch_size: minibatch size of every draw (``None`` = the whole round): y step k uses
            inner draw k, the N linear-system products share one inner draw (one consistent
            system), the cross term has its own, and one outer draw serves both partials of f.
        inner_steps: K, y steps per round. Default 1 (single loop).
        linsolve_steps: N, linear-system steps per round. Default 5 (F2OBO Experiment 1).
        window: w, stored estimates averaged (static). Default 10; neither paper reports the
            window of the F2OBO experiment.
        eta: lag i weighs eta^i / W, ``0 < eta <= 1``. Default 1.0 (a plain average).
        window_start: ``"zeros"`` or ``"renormalize"`` (``bilevel.solvers.online.window``).

    Per-round counts: ``grad_f = 1``, ``grad_g = K``, ``hvp = N``, ``cross = 1``.
    """

    lr_outer: Any = "auto"
    lr_inner: Any = "auto"
    lr_linsys: Any = None
    batch_size: int | None = None
    inner_steps: int = 1
    linsolve_steps: int = 5
    window: int = 10
    eta: float = 1.0
    window_start: str = "zeros"

    name: ClassVar[str] = "sobow"
    paper: ClassVar[str] = (
        "Lin, Sow, Ji, Liang, Shroff. Non-Convex Bilevel Optimization with Time-Varying "
        "Objective Functions. NeurIPS 2023."
    )
    optional_step_sizes: ClassVar[tuple[str, ...]] = ("lr_linsys",)

    def validate(self) -> None:
        check_window(self)
        n = self.linsolve_steps
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"SOBOW(linsolve_steps=...) must be a positive int, got {n!r}.")

    def init(self, problem, key: jax.Array) -> SOBOWState:
        return SOBOWState(
            **self.first_round(problem, key),
            v=tree_zeros_like(problem.y0),  # v_1 = 0
            window=Window.zeros(problem.x0, self.window),
        )

    def round(self, problem, state: SOBOWState) -> SOBOWState:
        t, x, K, N = state.t, state.x, self.inner_steps, self.linsolve_steps
        levels = Levels(*problem.at_round(t))
        key, batch_key = jax.random.split(state.key)
        # inner draws: K y steps, then the linear system's Hessian sample, then the cross term's
        mb = self.round_batches(problem, t, batch_key, outer=1, inner=K + 2)
        alpha = round_step_size(self.lr_inner, t)
        beta = round_step_size(self.lr_inner if self.lr_linsys is None else self.lr_linsys, t)
        y = inner_sgd(levels, mb, x, state.y, alpha, K)
        v, h = linear_system_hypergradient(  # one Hessian sample for the N steps
            *levels,
            x,
            y,
            state.v,
            lr=beta,
            num_steps=N,
            outer_batch=mb.outer(0),
            hessian_batch=lambda _: mb.inner(K),
            cross_batch=mb.inner(K + 1),
        )
        window = state.window.push(h, t)
        direction = window.average(t, self.eta, self.window_start)
        x_new, outer_state = self.outer_step(
            problem, x, direction, state.outer_state, self.outer_lr(t)
        )
        counts = state.counts.add(
            samples_outer=mb.samples_outer,
            samples_inner=mb.samples_inner,
            grad_f=1,
            grad_g=K,
            hvp=N,
            cross=1,
        )
        return SOBOWState(x_new, y, v, t + 1, key, counts, outer_state, window)

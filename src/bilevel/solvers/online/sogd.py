r"""SOGD: stochastic online bilevel optimization with a momentum search direction.

Nazari, Hou, Tarzanagh, Shen & Michailidis, "Stochastic Regret Guarantees for Online Zeroth- and
First-Order Bilevel Optimization", arXiv:2511.01126 (2025; reference [23] of F2OBO,
arXiv:2602.11665). From its abstract: "we introduce a novel search direction and show that both
first- and zeroth-order (ZO) stochastic OBO algorithms leveraging this direction achieve
sublinear stochastic bilevel regret without window smoothing ... our framework enhances
efficiency by: (i) reducing oracle dependence in hypergradient estimation, (ii) updating inner
and outer variables alongside the linear system solution, and (iii) employing ZO-based
estimation of Hessians, Jacobians, and gradients". This is the first-order method.

What could and could not be checked: the abstract above; the F2OBO paper's Table 2 (O(T)
gradient and HVP queries; regret O(T^{1/3}(sigma^2 + Delta_T) + T^{2/3} Psi_T) with Psi_T =
P_T + E^f_{x,T} + E^g_{xy,T} + E^g_{yy,T}), its Section 5 ("SOGD [23] establishes results under
the standard local regret by employing variance reduction techniques and achieve a
O(T^{1/3} sigma^2)"; it needs bounded variance of the stochastic d2g/dxdy and d2g/dy2) and its
Appendix A (Experiment 2: "For SOGD, we set the momentum coefficient to eta = 0.9 and the
linear-system learning rate to beta = 0.1", inner step 0.1, outer step 0.001). The paper's own
pseudocode and code were not reachable (no public repository found), so the exact recursion is
NOT verified. The default ``direction="storm"`` is a STORM-type recursive momentum (Cutkosky &
Orabona, NeurIPS 2019), chosen because the F2OBO paper calls SOGD's mechanism variance
reduction and the T^{1/3} sigma^2 term is the STORM rate (plain heavy-ball averaging gives
T^{1/2}); ``direction="heavy_ball"`` is the other reading, d_t = eta d_{t-1} + (1 - eta) h_t.
In both, eta is the weight on the past (the "momentum coefficient 0.9" of deep learning).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax

from bilevel.core import oracles
from bilevel.core.oracles import Counts
from bilevel.core.schedules import round_step_size
from bilevel.core.tree import tree_axpy, tree_scale, tree_sub, tree_where, tree_zeros_like
from bilevel.solvers.base import OuterState
from bilevel.solvers.common import Levels, implicit_hypergradient, linear_system_hypergradient
from bilevel.solvers.online.base import OnlineSolver
from bilevel.solvers.registry import register

PyTree = Any

__all__ = ["SOGD", "SOGDState"]


class SOGDState(NamedTuple):
    x: PyTree  # x_t, committed for round t
    y: PyTree  # y_t, committed for round t: the inner iterate
    v: PyTree  # v_t, the adjoint: tracks [d2g/dy2]^{-1} grad_y f at (x_{t-1}, y_t)
    d: PyTree  # d_{t-1}, the search direction of the last round (zeros before round 1)
    x_prev: PyTree  # x_{t-1}: with y_t, v_t the point where d_{t-1}'s h_{t-1} was evaluated
    t: jax.Array  # the round about to be played (int32, from 1)
    key: jax.Array  # PRNG key
    counts: Counts  # samples and oracle calls so far
    outer_state: OuterState  # the outer optimiser's state


@register("sogd")
@dataclasses.dataclass(frozen=True)
class SOGD(OnlineSolver):
    r"""SOGD (Nazari, Hou, Tarzanagh, Shen & Michailidis, arXiv:2511.01126), first order.

    Round t, with one inner sample zeta_t (y step, Hessian product, cross terms: separate
    draws) and one outer sample xi_t, all of round t, from (x_t, y_t, v_t, d_{t-1})::

        y_{t+1} = y_t - alpha grad_y g_t(x_t, y_t)
        v_{t+1} = v_t - beta (d2g_t/dy2 (x_t, y_{t+1}) v_t - grad_y f_t(x_t, y_{t+1}))
        h_t(x, y, v) = grad_x f_t(x, y; xi_t) - d2g_t/dxdy (x, y; zeta_t) v
        d_t = h_t(x_t, y_{t+1}, v_{t+1})
              + eta (d_{t-1} - h_t(x_{t-1}, y_t, v_t))            ("storm", default)
        d_t = eta d_{t-1} + (1 - eta) h_t(x_t, y_{t+1}, v_{t+1})  ("heavy_ball")
        x_{t+1} = Proj_X(x_t - gamma d_t)

    with d_1 = h_1(x_1, y_2, v_2) in both, y_1 = y0, v_1 = 0. The STORM correction re-evaluates
    round t's estimator, on round t's samples, at the previous round's evaluation point
    (x_{t-1}, y_t, v_t), so d_t - grad F_t carries eta times the previous error plus the
    gradient variation of round t - 1 to t (the E terms of the regret). The exact recursion
    and the order of the updates are NOT verified against the paper (module docstring).

    Draws of round t (the second key of ``split(state.key)``; zeta_t and xi_t above, the layout
    ours)::

        inner(0)   grad_y g of the y step
        inner(1)   the Hessian product d2g/dy2 v_t of the v step
        inner(2)   the cross term of h_t AND of the correction h_t(x_{t-1}, y_t, v_t)
        outer(0)   every f gradient: grad_y f of the v step, grad_x f of h_t and of the
                   correction

    Args:
        lr_outer: gamma, default ``"auto"`` (tuned by ``bl.solve_online`` below the stable
            bound of the round map; F2OBO paper, Appendix A, Experiment 2: 0.001).
        lr_inner: alpha, default ``"auto"`` = 1/L_g of round 1 (Experiment 2: 0.1).
        lr_linear: beta, the linear-system step, default ``None`` = ``lr_inner`` (the system's
            matrix is d2g/dy2, whose curvature is L_g's; Experiment 2: "the linear-system
            learning rate beta = 0.1").
        momentum: eta, the weight on the past, in [0, 1), default 0.9 (Experiment 2: "the
            momentum coefficient eta = 0.9"). A float leaf.
        direction: ``"storm"`` (default) or ``"heavy_ball"`` (static; see the module docstring).
        batch_size: ``None`` (default) = the whole round; else inner draws 0 (y step), 1
            (Hessian product), 2 (both cross terms) and outer draw 0 (every f gradient).

    Per-round counts, "storm": ``grad_g = 1``, ``grad_f = 2`` (one fused call at the new point,
    one grad_x f at the old), ``hvp = 1``, ``cross = 2``; "heavy_ball": ``grad_f = 1``,
    ``cross = 1``. Round 1 evaluates the correction and discards it (d_1 = h_1), so every
    round costs the same.
    """

    lr_outer: Any = "auto"
    lr_inner: Any = "auto"
    lr_linear: Any = None
    momentum: float = 0.9
    direction: str = "storm"
    batch_size: int | None = None

    name: ClassVar[str] = "sogd"
    paper: ClassVar[str] = (
        "Nazari, Hou, Tarzanagh, Shen, Michailidis. Stochastic Regret Guarantees for Online "
        "Zeroth- and First-Order Bilevel Optimization. arXiv:2511.01126, 2025."
    )
    directions: ClassVar[tuple[str, ...]] = ("storm", "heavy_ball")
    optional_step_sizes: ClassVar[tuple[str, ...]] = ("lr_linear",)

    def validate(self) -> None:
        self._check_choices(direction=self.directions)
        if not 0 <= self.momentum < 1:
            raise ValueError(
                f"SOGD(momentum={self.momentum!r}) must be in [0, 1): the weight on the past "
                "direction (Experiment 2 used 0.9)."
            )

    def init(self, problem, key: jax.Array) -> SOGDState:
        return SOGDState(
            **self.first_round(problem, key),
            v=tree_zeros_like(problem.y0),
            d=tree_zeros_like(problem.x0),
            x_prev=problem.x0,
        )

    def round(self, problem, state: SOGDState) -> SOGDState:
        t, x = state.t, state.x
        f, g = problem.at_round(t)
        key, batch_key = jax.random.split(state.key)
        mb = self.round_batches(problem, t, batch_key, outer=1, inner=3)
        alpha = round_step_size(self.lr_inner, t)
        beta = round_step_size(self.lr_inner if self.lr_linear is None else self.lr_linear, t)
        y = tree_axpy(-alpha, oracles.grad_y(g, x, state.y, mb.inner(0)), state.y)
        v, h = linear_system_hypergradient(
            f,
            g,
            x,
            y,
            state.v,
            lr=beta,
            num_steps=1,
            outer_batch=mb.outer(0),
            hessian_batch=lambda i: mb.inner(1),
            cross_batch=mb.inner(2),
        )
        eta, first = self.momentum, t == 1
        if self.direction == "storm":
            # round t's estimator, same samples, at round t-1's point (x_{t-1}, y_t, v_t)
            old_fx = oracles.grad_x(f, state.x_prev, state.y, mb.outer(0))
            h_old = implicit_hypergradient(
                Levels(f, g), state.x_prev, state.y, state.v, old_fx, mb.inner(2)
            )
            d = tree_axpy(eta, tree_sub(state.d, h_old), h)
            extra = 1
        else:
            d = tree_axpy(eta, state.d, tree_scale(1 - eta, h))
            extra = 0
        d = tree_where(first, h, d)
        x_new, outer_state = self.outer_step(problem, x, d, state.outer_state, self.outer_lr(t))
        counts = state.counts.add(
            samples_outer=mb.samples_outer,
            samples_inner=mb.samples_inner,
            grad_f=1 + extra,
            grad_g=1,
            hvp=1,
            cross=1 + extra,
        )
        return SOGDState(
            x=x_new,
            y=y,
            v=v,
            d=d,
            x_prev=x,
            t=t + 1,
            key=key,
            counts=counts,
            outer_state=outer_state,
        )

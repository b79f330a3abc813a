r"""OAGD: online alternating (time-averaged) gradient descent for online bilevel problems.

Tarzanagh, Nazari, Hou, Shen, Balzano. "Online Bilevel Optimization: Regret Analysis of Online
Alternating Gradient Methods." AISTATS 2024 (arXiv:2207.02829; code
github.com/bojianhou/oagd). Round t, at the committed x_t, from the warm start y_t::

    y_{t+1} = K GD steps y <- y - alpha grad_y g_t(x_t, y)
    x_{t+1} = Proj_X(x_t - gamma (1/W) sum_{i<w} eta^i h_{t-i}(x_t, y_{t+1}))
    h_r(x, y) = grad_x f_r(x, y) - d2g_r/dxdy (x, y) [d2g_r/dy2 (x, y)]^{-1} grad_y f_r(x, y)

i.e. the window's members are the *past rounds' functions re-evaluated* at the current
(x_t, y_{t+1}) (``problem.at_round(t - i)``, t traced), the time-averaged gradient of the
window-smoothed objective F_{t,w}(x, y) = (1/W) sum_i eta^i f_{t-i}(x, y) (the form the
Stochastic-OBO paper of Nazari et al. quotes). The public code does the same: in
``Hyperparameter-Optimization/core/trainer.py`` (``train_epoch_online``) the hypergradient of
every batch of the window is taken at the current model and hyperparameters and summed with
``momentum_list = [gamma ** i ...]`` divided by ``W = sum(momentum_list)``, the last entry for
the current batch. The paper assumes the linear system solved exactly; here it is
``linsolve_steps`` conjugate-gradient iterations (exact in dim y iterations on a quadratic; the
code used 5 Neumann terms). Rounds t - i < 1 are left out (weight 0, no calls), with W by
``window_start``: ``"zeros"`` (the paper's f_t = 0 for t <= 0) or ``"renormalize"`` (the
code's ``W`` over the batches present).

Differences from the code, by choice: its inner loop runs one SGD step (momentum 0.9) on each
batch of the window, where the paper (and this class) runs K GD steps on g_t only; its y is
the network itself, here the warm-started y_t.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from bilevel.core import oracles
from bilevel.core.oracles import Counts
from bilevel.core.schedules import round_step_size
from bilevel.solvers.base import OuterState
from bilevel.solvers.common import Levels, implicit_hypergradient, inner_sgd
from bilevel.solvers.hypergradient.adjoint import ConjugateGradient
from bilevel.solvers.online.base import OnlineSolver
from bilevel.solvers.online.window import check_window, lag_weights, weighted_sum
from bilevel.solvers.registry import register

PyTree = Any

__all__ = ["OAGD", "OAGDState"]


class OAGDState(NamedTuple):
    x: PyTree  # x_t, committed for round t
    y: PyTree  # y_t: K GD steps on g_{t-1}(x_{t-1}, .) from y_{t-1}; the inner decision
    t: jax.Array  # the round about to be played (int32, from 1)
    key: jax.Array  # PRNG key
    counts: Counts  # samples and oracle calls so far
    outer_state: OuterState  # the outer optimiser's state


@register("oagd")
@dataclasses.dataclass(frozen=True)
class OAGD(OnlineSolver):
    r"""OAGD (Tarzanagh et al., AISTATS 2024): inner GD on g_t, then a projected x step along the
    eta-weighted average of the hypergradients of the last w rounds' functions at the current
    (x_t, y_{t+1}) (module docstring).

    Draws of round t (keys ``(next, batch_key, window_key) = split(state.key, 3)``; the
    minibatch layout is ours, not checked against the paper's pseudocode)::

        batch_key: inner(k), k < K         grad_y g_t of y step k (round t's samples)
        split(window_key, w)[i]: outer(0)  grad_x f, grad_y f of member i (round t - i's)
        split(window_key, w)[i]: inner(0)  every CG product d2g/dy2 and the cross term of
                                           member i (round t - i's samples)

    Args:
        lr_outer: gamma, the x step. Default ``"auto"``: tuned by ``bl.solve_online`` below
            the stable bound of the round map (``bilevel.drivers.online``); a number above it
            is refused. (The OAGD code's ``outer_lr`` and the F2OBO paper's: 0.001.)
        lr_inner: alpha, the y step. Default ``"auto"`` = 1/L_g of round 1 (the code's
            ``inner_lr`` is 0.1).
        batch_size: minibatch size (``None`` = whole rounds): y step k uses inner draw k of
            round t; window member i draws one outer and one inner batch of round t - i (the
            inner one for both its Hessian and its cross term).
        inner_steps: K, y steps per round. Default 5 (the F2OBO paper's K for OBBO/F2OBO; the
            theory takes K = O(kappa_g log kappa_g)).
        linsolve_steps: CG iterations per member for the linear system. Default 10.
        window: w, rounds re-evaluated (static). Default 5 (the code's ``--win_size``).
        eta: lag i weighs eta^i / W. Default 0.9 (the code's ``--gamma``).
        window_start: ``"zeros"`` (default) or ``"renormalize"`` (the code's).

    Per-round counts with n = min(t, w) members: ``grad_f = n``, ``grad_g = K``,
    ``hvp = n * linsolve_steps``, ``cross = n``; samples of round t's K inner draws and of each
    member's draws. The counts grow over the first w rounds (``adaptive``).
    """

    lr_outer: Any = "auto"
    lr_inner: Any = "auto"
    batch_size: int | None = None
    inner_steps: int = 5
    linsolve_steps: int = 10
    window: int = 5
    eta: float = 0.9
    window_start: str = "zeros"

    name: ClassVar[str] = "oagd"
    paper: ClassVar[str] = (
        "Tarzanagh, Nazari, Hou, Shen, Balzano. Online Bilevel Optimization: Regret Analysis of"
        " Online Alternating Gradient Methods. AISTATS 2024."
    )
    #: the members re-evaluated per round grow from 1 to w over the first w rounds
    adaptive: ClassVar[bool] = True

    def validate(self) -> None:
        check_window(self)
        n = self.linsolve_steps
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"OAGD(linsolve_steps=...) must be a positive int, got {n!r}.")

    def init(self, problem, key: jax.Array) -> OAGDState:
        return OAGDState(
            **self.first_round(problem, key),
        )

    def member(self, problem, x, y, r, key) -> PyTree:
        """h_r(x, y): the hypergradient of round r's functions at (x, y) on one outer and one
        inner draw of round r (r may be traced)."""
        levels = Levels(*problem.at_round(r))
        mb = self.round_batches(problem, r, key, outer=1, inner=1)
        grad_x_f, grad_y_f = oracles.grads(levels.outer, x, y, mb.outer(0))

        def hessian(j):  # the member's one inner draw for every product
            del j
            return functools.partial(oracles.hvp_yy, levels.inner, x, y, mb.inner(0))

        v, _ = ConjugateGradient(self.linsolve_steps).solve(hessian, grad_y_f, None)
        return implicit_hypergradient(levels, x, y, v, grad_x_f, mb.inner(0))

    def round(self, problem, state: OAGDState) -> OAGDState:
        t, x, K, w = state.t, state.x, self.inner_steps, self.window
        key, batch_key, window_key = jax.random.split(state.key, 3)
        mb = self.round_batches(problem, t, batch_key, outer=0, inner=K)
        alpha = round_step_size(self.lr_inner, t)
        y = inner_sgd(Levels(*problem.at_round(t)), mb, x, state.y, alpha, K)
        rounds = jnp.maximum(t - jnp.arange(w), 1)  # rounds before 1: evaluated at 1, weighed 0
        hs = jax.vmap(lambda r, k: self.member(problem, x, y, r, k))(
            rounds, jax.random.split(window_key, w)
        )
        direction = weighted_sum(hs, lag_weights(t, w, self.eta, self.window_start))
        x_new, outer_state = self.outer_step(
            problem, x, direction, state.outer_state, self.outer_lr(t)
        )
        n = jnp.minimum(t, w)  # the members that exist; only theirs are counted
        member_draws = self.round_batches(problem, t, window_key, outer=1, inner=1)  # sizes
        counts = state.counts.add(
            samples_outer=n * member_draws.samples_outer,
            samples_inner=mb.samples_inner + n * member_draws.samples_inner,
            grad_f=n,
            grad_g=K,
            hvp=n * self.linsolve_steps,
            cross=n,
        )
        return OAGDState(x_new, y, t + 1, key, counts, outer_state)

r"""IBCG: the inexact bilevel conditional gradient method (Algorithm 1).

Abolfazli, Jiang, Mokhtari, Yazdandoost Hamedani. "An Inexact Conditional Gradient Method for
Constrained Bilevel Optimization." Preprint (U. Arizona / UT Austin), arXiv:2306.02429, 2023;
the paper's text names no venue.

A projection-free (Frank-Wolfe) method for ``min_{x in X} l(x) = f(x, y*(x))`` with a compact
convex X reached only through its linear minimization oracle (LMO). One loop, no inner loops:
``y`` tracks ``y*(x)`` by one gradient step on g per iteration, ``w`` tracks the adjoint
``v(x) = [d^2 g/dy^2]^{-1} grad_y f`` (eq. (7b)) by one gradient step on the quadratic (8), and
the hypergradient estimate (7a) feeds the LMO. Two Hessian-type products per iteration, with
different vectors (w_k, w_{k+1}), so O(m^2) per step with no kappa or log K factor (Table 1).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from bilevel.analysis.metrics import inner_solution
from bilevel.core import oracles
from bilevel.core.oracles import Counts
from bilevel.core.problem import BilevelProblem
from bilevel.core.sampling import Minibatches
from bilevel.core.schedules import TracedSchedule, step_size
from bilevel.core.tree import tree_axpy, tree_norm, tree_sub, tree_zeros_like
from bilevel.solvers.base import OuterState, _is_auto
from bilevel.solvers.common import fastest_contraction_step, implicit_hypergradient, inner_sgd
from bilevel.solvers.frank_wolfe.base import (
    FrankWolfeSolver,
    dense_adjoint,
    frank_wolfe_step,
    merge_counts,
)
from bilevel.solvers.registry import register

PyTree = Any

#: inner draws of one step: the HVP of line 4, the cross product of line 5, the y step of line 8
HVP_DRAW, CROSS_DRAW, STEP_DRAW = 0, 1, 2
#: Newton steps of the exact inner solve (``inner_solve="exact"``; exact for quadratic g)
NEWTON_STEPS = 30
#: the ``"auto"`` adjoint step is this fraction of 2/(mu_g + L_g): eta must be strictly below it
ADJOINT_FRACTION = 0.99


class IBCGState(NamedTuple):
    x: PyTree  # upper iterate x_k (in X: a convex combination of x_0 and LMO points)
    y: PyTree  # inner iterate y_k, tracks y*(x_k)
    w: PyTree  # adjoint iterate w_k, tracks v(x_{k-1}) = [d2g/dy2]^{-1} grad_y f (w_0 = y_0)
    k: jax.Array  # iteration count
    key: jax.Array  # PRNG key
    counts: Counts  # samples and oracle calls so far
    outer_state: OuterState  # its direction_norm is ||d_{k-1}||, the last LMO input's norm
    fw_gap_estimate: jax.Array  # <d_{k-1}, x_{k-1} - s_{k-1}>: the FW gap of the LMO input
    lmo_start: jax.Array  # the LMO's last top singular vector (NuclearBall), else a dummy 0
    direction: PyTree  # d_k, the LMO's input: F_k, or its running average (``averaging``)


def horizon_step(horizon: float, rule: str) -> float:
    """The paper's constant FW step for horizon K: ``log K / K`` (convex l, Corollary 4.2) or
    ``1/sqrt(K)`` (nonconvex l, Corollary 4.4; also the start of ``"last-iterate"``)."""
    return math.log(horizon) / horizon if rule == "convex" else 1.0 / math.sqrt(horizon)


#: ``"last-iterate"`` keeps the constant step for this share of the horizon, then decays it
#: like ``k^-TAIL_POWER``
TAIL_START, TAIL_POWER = 0.1, 1.5


def averaging_weight(k) -> jax.Array:
    r"""``rho_k = min(1, 4 / (k + 8)^{2/3})``: the weight of the new estimate in the running
    average ``d_k = (1 - rho_k) d_{k-1} + rho_k F_k`` of stochastic Frank-Wolfe (Mokhtari,
    Hassani, Karbasi, "Stochastic Conditional Gradient Methods: From Convex Minimization to
    Submodular Maximization", JMLR 21, 2020, Algorithm 1 with their ``rho_t``). ``k`` from 0."""
    kf = jnp.asarray(k, dtype=jnp.result_type(float))
    return jnp.minimum(1.0, 4.0 / (kf + 8.0) ** (2.0 / 3.0))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LastIterateGamma(TracedSchedule):
    r"""``gamma_k = gamma min(1, (k_1 / (k + 1))^{3/2})`` with ``k_1 = TAIL_START K``: Corollary
    4.4's constant ``gamma = 1/sqrt(K)`` for the first tenth of the horizon, then decaying like
    ``k^{-3/2}`` (:data:`TAIL_POWER`; IBCG's ``gamma_rule="last-iterate"``, not in the paper).

    Why: a constant step leaves the *last* iterate zigzagging between vertices at the step's
    scale (Theorem 4.3 bounds the best iterate's gap), so the gap of ``x_K`` stalls (measured
    on a per-feature ridge problem over a box: 0.19 of its start; 0.051 with a ``1/sqrt(k)``
    tail, 0.024 with ``k^{-3/4}``, 0.012 with ``1/k``, 0.007 with this rule).
    The theorem's argument still applies: the best gap is at most ``(l(x_0) - l* + C sum_k
    gamma_k^2) / sum_k gamma_k``, and here ``sum gamma_k >= 0.23 sqrt(K)`` (K >= 100), ``sum
    gamma_k^2 <= 0.15`` (against ``sqrt(K)`` and 1 for the constant step): the same
    ``O(1/sqrt(K))`` order, since the tail starts at a fixed share of K.
    A schedule ``k -> gamma_k`` (``bilevel.core.schedules.step_size`` calls it) whose numbers
    are traced leaves of the solver, so runs of different horizons share one compiled program.
    """

    gamma: float
    horizon: float

    def __call__(self, k):
        kf = jnp.asarray(k, dtype=jnp.result_type(float))
        tail = (TAIL_START * self.horizon / (kf + 1.0)) ** TAIL_POWER
        return self.gamma * jnp.minimum(1.0, tail)


@register("ibcg")
@dataclasses.dataclass(frozen=True)
class IBCG(FrankWolfeSolver):
    r"""IBCG (Abolfazli et al., Algorithm 1); per iteration k, from ``w_0 = y_0``::

        w_{k+1} = w_k - eta (d2g/dy2(x_k, y_k) w_k - grad_y f(x_k, y_k))     (line 4)
        F_k     = grad_x f(x_k, y_k) - d2g/dxdy(x_k, y_k) w_{k+1}             (line 5, eq. 7a)
        s_k     = argmin_{s in X} <d_k, s>,  d_k = F_k                        (line 6, the LMO)
        x_{k+1} = x_k + gamma (s_k - x_k)                                     (line 7)
        y_{k+1} = y_k - alpha grad_y g(x_{k+1}, y_k)                          (line 8: NEW x)

    With minibatches (``batch_size``; the paper is deterministic) the LMO's input is by default
    the running average ``d_k = (1 - rho_k) d_{k-1} + rho_k F_k`` of stochastic Frank-Wolfe
    (``averaging``), and each oracle gets its own draw (``inner(i)``, ``outer(i)`` of the
    step's minibatches)::

        inner(0)   the HVP of line 4 (the dense Hessian with ``hessian_inverse="exact"``)
        inner(1)   the cross product of line 5
        inner(2)   the y step of line 8, at x_{k+1}
        outer(0)   both partials of f at (x_k, y_k)

    ``output`` is the last iterate ``(x_K, y_K)``; Theorem 4.3 bounds the best-gap iterate, which
    ``solve``'s history shows through ``fw_gap`` (exact, small problems) and
    ``fw_gap_estimate`` (this method's ``<F_k, x_k - s_k>``, free).

    Args:
        lr_outer: gamma, the Frank-Wolfe step in (0, 1] (a float: constant gamma; or a
            schedule). ``"auto"``: by ``gamma_rule`` for the horizon K = ``horizon``: the
            paper's constant ``log K / K`` or ``1/sqrt(K)``, or ``1/sqrt(K)`` decaying after
            the first tenth (:class:`LastIterateGamma`).
        lr_inner: alpha, the y step (line 8). ``"auto"``: ``2/(mu_g + L_g)`` (Lemma B.1) with
            mu_g, L_g estimated by ``bl.diagnose`` at (x0, y0). When the run draws minibatches
            (not in the paper): half of that
            (:func:`bilevel.solvers.common.fastest_contraction_step`), with L_g the
            minibatches' where theirs is larger (``Solver.curvature_batch``).
        lr_adjoint: eta, the w step (line 4); theory asks ``eta < (1 - beta)/mu_g =
            2/(mu_g + L_g)`` strictly (Lemma 3.1, Theorems 4.1 and 4.3). ``"auto"``: 0.99 of
            that bound (halved with minibatches, as ``lr_inner``).
        gamma_rule: for ``lr_outer="auto"``: ``"convex"`` (l convex, Theorem 4.1: gamma =
            log K / K), ``"nonconvex"`` (Theorem 4.3: gamma = 1/sqrt(K), which assumes
            nothing), or ``"last-iterate"`` (the default, not in the paper: Theorem 4.3's
            gamma for the first K/10 steps, then ``~ 1/sqrt(k)``, so that the last iterate's
            gap falls too; :class:`LastIterateGamma`). The reproductions name the paper's rule.
        horizon: K, the run's length, for ``lr_outer="auto"``; ``None``: ``bl.solve`` fills in
            its ``steps``. Must be >= 2 when it sets gamma (log 1 = 0).
        batch_size: minibatch size of every oracle (None = full data).
        hessian_inverse: ``"recursion"`` (line 4, one HVP) or ``"exact"`` (w_{k+1} =
            [d2g/dy2(x_k, y_k)]^{-1} grad_y f by a dense solve, O(m^3): the eq. (6) scheme).
        inner_solve: ``"step"`` (line 8) or ``"exact"`` (y_{k+1} = y*(x_{k+1}) by Newton on the
            full data, small problems). ``hessian_inverse="exact", inner_solve="exact"`` is
            Frank-Wolfe on l with the exact hypergradient, the reference of eq. (6).
        w0: ``"y0"`` (Algorithm 1's literal ``w^0 <- y^0``) or ``"zero"``; only the constant
            ``||w_0 - v(x_0)||`` of Lemma B.3 depends on it.
        averaging: the LMO's input d_k. ``"none"``: the estimate F_k itself (Algorithm 1).
            ``"sfw"``: its running average with :func:`averaging_weight`'s ``rho_k =
            4/(k+8)^{2/3}`` (stochastic Frank-Wolfe's averaging, Mokhtari et al. 2020; not in
            the IBCG paper), which takes the minibatch noise out of the vertex choice.
            ``"auto"`` (default): ``"sfw"`` when the run draws minibatches, else ``"none"``.
            Measured with minibatches on a box (``benchmarks/defaults.py``, with the
            ``"last-iterate"`` gamma): FW gap of ``x_K`` 0.03-0.05 of its start on a
            per-feature ridge (batch 32) and 0.006-0.010 on a hyper-cleaning, against 0.14-0.19
            and 0.23 with ``"none"``, where every noisy F_k picks its own vertex.
        lmo_warm_start: on a set with ``lmo_warm`` (``bl.sets.NuclearBall``), start the LMO's
            Lanczos from the previous step's top singular vector (kept in the state); other sets
            ignore it. Measured on matrix completion 250x250 (``benchmarks/
            ibcg_lmo_warm_start.py``) it is exact (vertex values to 1e-15 at the default 48
            Lanczos steps, as cold) but buys nothing: consecutive top vectors are nearly
            orthogonal (|cos| ~ 0.01), since the FW step toward ``-r u v^T`` removes that
            direction from the next F, so 16 steps are needed warm or cold.
    """

    lr_outer: Any = "auto"
    lr_inner: Any = "auto"
    lr_adjoint: Any = "auto"
    gamma_rule: str = "last-iterate"
    horizon: float | None = None
    batch_size: int | None = None
    hessian_inverse: str = "recursion"
    inner_solve: str = "step"
    w0: str = "y0"
    averaging: str = "auto"
    lmo_warm_start: bool = True

    name: ClassVar[str] = "ibcg"
    paper: ClassVar[str] = (
        "Abolfazli, Jiang, Mokhtari, Yazdandoost Hamedani. An Inexact Conditional Gradient "
        "Method for Constrained Bilevel Optimization. Preprint, arXiv:2306.02429, 2023, "
        "Algorithm 1."
    )
    auto_step_sizes: ClassVar[tuple[str, ...]] = ("lr_outer", "lr_inner", "lr_adjoint")
    auto_in_step: ClassVar[tuple[str, ...]] = ("averaging",)

    def validate(self) -> None:
        cls = type(self).__name__
        self._check_choices(
            gamma_rule=("convex", "nonconvex", "last-iterate"),
            hessian_inverse=("recursion", "exact"),
            inner_solve=("step", "exact"),
            w0=("y0", "zero"),
            averaging=("auto", "none", "sfw"),
        )
        gamma = self.lr_outer
        if isinstance(gamma, int | float) and not isinstance(gamma, bool) and gamma > 1:
            raise ValueError(
                f"{cls}(lr_outer={gamma}) is a Frank-Wolfe step gamma and must lie in (0, 1]: "
                "x_{k+1} = x_k + gamma (s_k - x_k) leaves X for gamma > 1."
            )
        h = self.horizon
        number = isinstance(h, int | float) and not isinstance(h, bool)
        if h is not None and not (number and h >= 1):
            raise ValueError(f"{cls}(horizon={h!r}) must be a number of steps >= 1 or None.")
        self._check_plain_steps()

    def resolve(self, problem: BilevelProblem) -> IBCG:
        """Fill ``"auto"`` steps: gamma from the horizon, alpha and eta from ``bl.diagnose``."""
        changes = {}
        if _is_auto(self.lr_outer):
            if self.horizon is None:
                raise ValueError(
                    "IBCG(lr_outer='auto') is the paper's gamma for the horizon K: give "
                    "horizon=K (bl.solve fills it with steps) or lr_outer as a number."
                )
            if self.horizon < 2:  # Corollaries 4.2, 4.4: log K / K = 0 at K = 1
                raise ValueError(
                    f"IBCG(lr_outer='auto') needs a horizon K >= 2 (log 1 = 0), got "
                    f"{self.horizon:g}; run more steps or give lr_outer."
                )
            gamma = horizon_step(float(self.horizon), self.gamma_rule)
            if self.gamma_rule == "last-iterate":
                gamma = LastIterateGamma(gamma, float(self.horizon))
            changes["lr_outer"] = gamma
        if _is_auto(self.lr_inner) or _is_auto(self.lr_adjoint):
            from bilevel.analysis.diagnose import strong_convexity

            mu_g, L_g = strong_convexity(
                problem,
                "IBCG's 'auto' steps are 2/(mu_g + L_g)",
                "give lr_inner and lr_adjoint",
                self.curvature_batch(problem),
            )
            # half with minibatches: the curvature varies with the draw
            step = fastest_contraction_step(mu_g, L_g, self.draws_minibatches(problem))
            if _is_auto(self.lr_inner):
                changes["lr_inner"] = step
            if _is_auto(self.lr_adjoint):
                changes["lr_adjoint"] = ADJOINT_FRACTION * step
        return dataclasses.replace(self, **changes) if changes else self

    def init(self, problem: BilevelProblem, key: jax.Array) -> IBCGState:
        w = problem.y0 if self.w0 == "y0" else tree_zeros_like(problem.y0)
        x0 = problem.x0
        zero = jnp.zeros_like(tree_norm(x0))
        start = problem.x_set.warm_start_like(x0) if self._warm(problem.x_set) else zero
        return IBCGState(
            x0, problem.y0, w, jnp.zeros((), jnp.int32), key, Counts.zeros(),
            self.outer_init(x0), zero, start, tree_zeros_like(x0),
        )  # fmt: skip

    def averages(self, problem: BilevelProblem) -> bool:
        """Whether the LMO gets the running average of the estimates (``averaging``, with
        ``"auto"`` read off the run: averaged when it draws minibatches)."""
        if self.averaging == "auto":
            return self.draws_minibatches(problem)
        return self.averaging == "sfw"

    def _direction(self, problem: BilevelProblem, state: IBCGState, hypergrad):
        """d_k: F_k, or ``(1 - rho_k) d_{k-1} + rho_k F_k`` (``rho_0 = 1``, so ``d_0 = F_0``)."""
        if not self.averages(problem):
            return hypergrad
        rho = averaging_weight(state.k)
        return tree_axpy(rho, tree_sub(hypergrad, state.direction), state.direction)

    def _warm(self, x_set) -> bool:
        """Whether the LMO is warm-started (``lmo_warm_start`` and a set offering it)."""
        return self.lmo_warm_start and callable(getattr(x_set, "lmo_warm", None))

    def _lmo(self, x_set, direction, start):
        """``(s_k, next start)``: line 6, from the last singular vector where warm-started."""
        if self._warm(x_set):
            return x_set.lmo_warm(direction, start)
        return x_set.lmo(direction), start

    def _adjoint(self, problem: BilevelProblem, x, y, w, grad_y_f, batch, eta):
        """``(w_{k+1}, counts)``: line 4, or the exact ``[d2g/dy2]^{-1} grad_y f`` (eq. (6))."""
        if self.hessian_inverse == "exact":
            return dense_adjoint(problem, x, y, grad_y_f, batch), {"dense": 1}
        residual = tree_sub(oracles.hvp_yy(problem.inner, x, y, batch, w), grad_y_f)
        return tree_axpy(-eta, residual, w), {"hvp": 1}

    def _inner(self, problem: BilevelProblem, mb: Minibatches, x_new, y, alpha):
        """``(y_{k+1}, counts)``: line 8 at the NEW x, or the exact ``y*(x_{k+1})``."""
        if self.inner_solve == "exact":
            y_new = inner_solution(problem, x_new, y, newton_steps=NEWTON_STEPS)
            return y_new, {"grad_g": NEWTON_STEPS, "dense": NEWTON_STEPS}
        return inner_sgd(problem, mb, x_new, y, alpha, 1, first=STEP_DRAW), {"grad_g": 1}

    def step(self, problem: BilevelProblem, state: IBCGState) -> IBCGState:
        key, batch_key = jax.random.split(state.key)
        mb = self.minibatches(problem, batch_key, outer=1, inner=3)
        gamma = step_size(self.lr_outer, state.k)
        alpha = step_size(self.lr_inner, state.k)
        eta = step_size(self.lr_adjoint, state.k)
        x, y = state.x, state.y
        grad_x_f, grad_y_f = oracles.grads(problem.outer, x, y, mb.outer(0))
        w, adjoint_counts = self._adjoint(
            problem, x, y, state.w, grad_y_f, mb.inner(HVP_DRAW), eta
        )  # line 4: w_{k+1} from (x_k, y_k, w_k)
        hypergrad = implicit_hypergradient(problem, x, y, w, grad_x_f, mb.inner(CROSS_DRAW))
        direction = self._direction(problem, state, hypergrad)
        vertex, start = self._lmo(problem.x_set, direction, state.lmo_start)  # line 6
        x_new, gap = frank_wolfe_step(problem, x, direction, gamma, vertex)  # line 7
        y_new, inner_counts = self._inner(problem, mb, x_new, y, alpha)  # line 8
        counts = state.counts.add(
            samples_outer=mb.samples_outer,
            samples_inner=mb.samples_inner,
            grad_f=1,  # both partials of f, fused
            cross=1,
            **merge_counts(adjoint_counts, inner_counts),
        )
        outer_state = OuterState(state.outer_state.opt, tree_norm(direction))
        return IBCGState(
            x_new, y_new, w, state.k + 1, key, counts, outer_state, gap, start, direction
        )

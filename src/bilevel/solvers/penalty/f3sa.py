r"""F3SA: F2SA with STORM-type momentum estimators, single loop (Algorithm 2).

Kwon, Kwon, Wright, Nowak. "A Fully First-Order Method for Stochastic Bilevel Optimization."
ICML 2023 (arXiv:2301.10945), Algorithm 2, Appendix C, Theorem 4.3 and Corollary 4.4, read with
three corrections: the first term of (8b) is the product ``2 (gamma_{k-1} - gamma_k) /
gamma_{k-1}`` (the proof in C.6 needs it; a power of 2 would force eta = 1), ``eta_0 = eta_1 = 1``
as (8b) asks (where (9a) alone gives eta_1 = 2^(-2c)), and ``lam_k = gamma_k / alpha_k``
(from (9b), without F2SA's factor 2).

The direction is F2SA's penalty gradient (Lemma 3.1), but every raw gradient is replaced by a
STORM estimator (Cutkosky & Orabona, NeurIPS 2019) that evaluates the *same* sample at the current
and at the previous point:

    ht^k = grad h(p_k; s_k) + (1 - eta_k) (ht^{k-1} - grad h(p_{k-1}; s_k)),

so the noise of consecutive estimates cancels up to the movement ``p_k - p_{k-1}``. This needs
per-sample smoothness (A6) and is why the state keeps the previous iterates.

``shared_inner_sample=True``: ht_gz and ht_gy take one sample where Algorithm 2 draws phi_z^k
and phi_y^k apart, for F2SA's reason (its module docstring): y - z, which lam multiplies in the
x-direction, then carries less of the samples' noise, and with a y step on g equal to the z
step (beta_k = gamma_k here) their noises nearly cancel. On ``benchmarks/defaults.py``'s
minibatch rows (3000 steps; the ratio of the final to the start's ``||grad F||``, shared
against independent, mean over seeds): ridge / 32 0.028 against 0.070 (six seeds, at most
0.041 against 0.096), ``ridge_raw`` / 32 0.058 against 0.073, logistic / 64 0.017 against
0.020, ``logistic_split`` / 64 0.036 both, and cleaning / 32 0.010 against 0.004 (at most
0.022 against 0.004: the one row that rose; three seeds each; measured 2026-11-29).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from bilevel.core import oracles
from bilevel.core.oracles import Counts
from bilevel.core.problem import BilevelProblem
from bilevel.core.schedules import step_size
from bilevel.core.tree import tree_axpy, tree_sub, tree_zeros_like
from bilevel.solvers.base import OuterState, Solver
from bilevel.solvers.penalty.f2sa import F2SA, F2SA_REGIMES, penalty_advice, resolve_regime
from bilevel.solvers.registry import register

PyTree = Any

#: Corollary 4.4 exponents (a, c) of alpha_k ~ k^-a and gamma_k ~ k^-c, by noise regime
#: (lam_k grows as k^(a - c), eta_k = (k+1)^(-2c)). "constant" is the Sec. 4.4 variant, as for
#: F2SA: lam_k = lam0 with alpha_k, gamma_k ~ k^(-1/2); (9a) then gives eta_k = (k+1)^(-1),
#: the order (8b) asks (eta_{k+1} >= c_eta (l_{g,1}^3/mu_g) gamma_k^2 ~ 1/k).
F3SA_REGIMES: dict[str, tuple[float, float]] = {
    "stochastic": (3 / 5, 2 / 5),  # (a) sigma_f, sigma_g > 0: E||grad F||^2 ~ log K / K^(2/5)
    "outer-noise": (1 / 2, 1 / 4),  # (b) sigma_f > 0, sigma_g = 0: ~ log K / K^(1/2)
    "deterministic": (1 / 3, 0.0),  # (c) eta_k = 1: ||grad F(x_K)||^2 ~ log K / K^(2/3)
    "constant": (1 / 2, 1 / 2),  # Sec. 4.4: constant lam, alpha_k, gamma_k ~ k^(-1/2)
}
assert F3SA_REGIMES.keys() == F2SA_REGIMES.keys()  # F2SA.validate checks the regime names


#: the smallest lambda_0 of ``lam0="auto"`` with sampled inner gradients
LAM0_NOISY_FLOOR = 1.0
#: the y step's share of f's curvature there: alpha_0 L_f = gamma_0 L_f / lambda_0 <= 1/4
Y_STEP_F_SHARE = 0.25


def noisy_penalty_start(problem: BilevelProblem, lr_inner) -> float:
    r"""lambda_0 of ``lam0="auto"`` when F3SA samples its inner gradients:
    ``max(1, 4 gamma_0 L_f)``, with gamma_0 the z step (``lr_inner`` at k = 0) and L_f the
    outer curvature in y at ``(x0, y0)`` (:func:`bilevel.analysis.diagnose.outer_smoothness`).

    Why small: the x-direction ``lam (ht_gxy - ht_gxz)`` carries the noise of the single-step
    iterates y and z times lam, and the bias it removes is O(1/lam) only. With batches of 32 on
    a per-feature ridge (diabetes) F3SA ended at 0.59 / 0.45 / 0.67 of its start's
    ``||grad F||`` (seeds 0-2) with lam0 = 10, 0.09 / 0.18 / 0.12 with 3 and 0.09 / 0.10 /
    0.05 with 1; on an iris hyper-cleaning with batches of 16 at 0.098, 0.007 (3) and 0.004
    (1), on a logistic regression with one log-penalty (batches of 64) at 0.04 / 0.03 / 0.08,
    0.04 / 0.07 / 0.04 and 0.03 / 0.10 / 0.04 (measured 2026-11-29).

    Why not smaller: the y step is ``alpha_k = gamma_k / lam_k`` on f (eq. (9b)) and gamma_k
    on g, so a small lam makes y's step on f large. ``4 gamma_0 L_f`` keeps alpha_0 L_f <= 1/4
    and, with gamma_0 <= 1/(2 L_g) (the ``"auto"`` z step), y's whole step on f + lam g below
    3/4 of its curvature's inverse, whatever the scale of f against g. This is a step-size
    rule, not (9b)'s ``2 l_{f,1} / mu_g``, which makes f + lam g strongly convex when f is not
    convex in y: give lam0 for such problems.
    """
    from bilevel.analysis.diagnose import outer_smoothness

    gamma0 = float(step_size(lr_inner, jnp.asarray(0.0)))
    return max(LAM0_NOISY_FLOOR, gamma0 * outer_smoothness(problem) / Y_STEP_F_SHARE)


def momentum_weight(k, c: float, eta=None):
    """The STORM weight eta_k of iteration k: eq. (9a) ``(k+1)^(-2c)`` with (8b)'s
    ``eta_0 = eta_1 = 1`` (the literal (9a) would give eta_1 = 2^(-2c); (8b) asks 1).

    ``eta`` (a float in (0, 1] or a schedule ``k -> eta``) replaces the power law for k >= 2.
    """
    kf = jnp.asarray(k, dtype=jnp.result_type(float))
    if eta is None:
        # (9a): step_size's family with k0 = 1, written out so that its rounding does not move
        later = (kf + 1.0) ** (-2.0 * c)
    else:  # a float in (0, 1] or a schedule (called with k as a float, as always here)
        later = step_size(eta, kf)
    return jnp.where(kf <= 1.0, jnp.ones_like(kf), later)


def storm(eta, grad_now: PyTree, previous_estimate: PyTree, grad_previous: PyTree) -> PyTree:
    """``grad_now + (1 - eta) (previous_estimate - grad_previous)``: the STORM recursion, not
    heavy-ball averaging (Appendix C: (1 - eta_k) multiplies the previous estimate minus the
    previous point's gradient). Both gradients must use the same sample."""
    return tree_axpy(1.0 - eta, tree_sub(previous_estimate, grad_previous), grad_now)


class F3SAEstimators(NamedTuple):
    """The six momentum estimators ht^k of Appendix C (raw gradients: lam multiplies later)."""

    gz: PyTree  # ht_gz ~ grad_y g(x_k, z_k)
    fy: PyTree  # ht_fy ~ grad_y f(x_k, y_k)
    gy: PyTree  # ht_gy ~ grad_y g(x_k, y_k)
    fx: PyTree  # ht_fx ~ grad_x f(x_k, y_{k+1})
    gxy: PyTree  # ht_gxy ~ grad_x g(x_k, y_{k+1})
    gxz: PyTree  # ht_gxz ~ grad_x g(x_k, z_{k+1})


class F3SAState(NamedTuple):
    x: PyTree  # upper iterate x_k
    y: PyTree  # penalised lower iterate y_k, tracks y*_lam(x) = argmin_y f + lam g
    z: PyTree  # plain lower iterate z_k, tracks y*(x) = argmin_y g
    x_prev: PyTree  # x_{k-1} (x_0 at k = 0, where eta_0 = 1 cancels it)
    y_prev: PyTree  # y_{k-1}
    z_prev: PyTree  # z_{k-1}
    est: F3SAEstimators  # the estimators of iteration k-1 (zeros at k = 0)
    k: jax.Array  # iteration count
    key: jax.Array  # PRNG key
    counts: Counts  # samples and oracle calls so far
    outer_state: OuterState  # the outer optimiser's state


@register("f3sa")
@dataclasses.dataclass(frozen=True)
class F3SA(Solver):
    r"""F3SA (Kwon et al., ICML 2023, Algorithm 2): single-loop F2SA with STORM momentum.

    Per iteration k (T = 1), each ``ht`` a momentum estimator (module docstring)::

        z_{k+1} = z_k - gamma_k ht_gz^k                           ht_gz at (x_k, z_k)
        y_{k+1} = y_k - alpha_k (ht_fy^k + lam_k ht_gy^k)          ht_fy, ht_gy at (x_k, y_k)
        x_{k+1} = Proj_X(x_k - xi alpha_k [ht_fx^k + lam_k (ht_gxy^k - ht_gxz^k)])
                  ht_fx, ht_gxy at (x_k, y_{k+1}); ht_gxz at (x_k, z_{k+1})
        lam_k = gamma_k / alpha_k                                 (9b), closed form

    The previous points of the recursions are (x_{k-1}, z_{k-1}), (x_{k-1}, y_{k-1}) for the
    y-estimators and (x_{k-1}, y_k), (x_{k-1}, z_k) for the x-estimators: the points the
    estimator of step k-1 was evaluated at. Each estimator has one sample per step, used at
    both of its points (Appendix C; ``inner(i)``, ``outer(i)`` of the step's minibatches)::

        outer(0)   zeta_y: ht_fy          outer(1)   zeta_x: ht_fx
        inner(0)   phi_z: ht_gz, and ht_gy (``shared_inner_sample``, the default); otherwise
                   inner(1) phi_y for ht_gy; s = 1 or 2 draws
        inner(s)   phi_x: ht_gxy and ht_gxz (``shared_x_sample``, the default); otherwise
                   ht_gxy, with inner(s + 1) for ht_gxz

    Schedules (9a): alpha_k ~ (k+k0)^-a, gamma_k ~ (k+k0)^-c, eta_k = (k+1)^(-2c) with
    eta_0 = eta_1 = 1. The y step on the g part is beta_k = alpha_k lam_k = gamma_k (F2SA:
    gamma_k / 2).

    Args:
        lr_outer: initial x step ``xi * alpha_0`` (then ``* (k0/(k+k0))^a``), or a schedule.
        lr_inner: initial z step ``gamma_0`` (then ``* (k0/(k+k0))^c``), or a schedule. The
            default ``"auto"`` is ``0.5 / L_g`` (``bl.diagnose``): (8a) asks gamma_k <=
            1/(16 L_g) for the proof; 0.5/L_g makes the y step on the g part (beta = gamma)
            equal to F2SA's default (gamma/2 with gamma = 1/L_g).
        batch_size: minibatch size of every estimator's sample (None = full data).
        lam0: lambda_0; (9b) asks lambda_0 >= 2 l_{f,1}/mu_g. ``"auto"``: 100 with exact
            inner gradients, as F2SA's (:meth:`F2SA.penalty_start`); with sampled ones the
            smallest value that keeps the y step's f part at a quarter of f's curvature,
            ``max(1, 4 gamma_0 L_f)`` (:meth:`resolve`, :func:`noisy_penalty_start`).
        regime: Corollary 4.4 exponents (a, c): "stochastic" (3/5, 2/5), "outer-noise"
            (1/2, 1/4), "deterministic" (1/3, 0; no momentum), "constant" (1/2, 1/2: Sec.
            4.4's constant lam, eta_k = (k+1)^-1), or "auto" (by the problem's noise, as F2SA).
            ``a``, ``c`` override it.
        k0: offset k_0 of the power laws ((9c) gives a large theoretical value); ``"auto"``
            is F2SA's (the run's horizon), not the default here: with it F3SA's minibatch
            rows of ``benchmarks/defaults.py``'s logistic regressions ended at 0.17 and 0.15
            of their start's ``||grad F||``, with 100 at 0.02 and 0.04.
        lam_rule: "closed" (lam_k = gamma_k/alpha_k) or "lagged" (literal (9b):
            lam_{k+1} = gamma_k/alpha_k, so lam_1 = lam_0).
        shared_x_sample: one sample phi_x^k for ht_gxy and ht_gxz (Appendix C, the default) or
            two independent ones (Algorithm 1's notation).
        shared_inner_sample: one sample for ht_gz and ht_gy (the default, as F2SA's, whose
            module docstring says why) or Algorithm 2's phi_z^k and phi_y^k.
        eta: None for (9a)'s ``(k+1)^(-2c)``; a float in (0, 1] or a schedule ``k -> eta``
            replaces it for k >= 2 (eta_0 = eta_1 = 1 always: the estimators start at zero).

    References:
        Kwon, Kwon, Wright, Nowak. "A Fully First-Order Method for Stochastic Bilevel
        Optimization." ICML 2023. Cutkosky, Orabona. "Momentum-Based Variance Reduction in
        Non-Convex SGD." NeurIPS 2019 (STORM).

    Assumptions: g(x, .) strongly convex; f, g smooth for every sample (A1-A3, A6).
    """

    lr_outer: Any = "auto"
    lr_inner: Any = "auto"
    batch_size: int | None = None
    lam0: float | str = "auto"
    regime: str = "auto"
    a: float | None = None
    c: float | None = None
    k0: float | str = 100.0
    lam_rule: str = "closed"
    shared_x_sample: bool = True
    shared_inner_sample: bool = True
    eta: Any = None

    name: ClassVar[str] = "f3sa"
    paper: ClassVar[str] = (
        "Kwon, Kwon, Wright, Nowak. A Fully First-Order Method for Stochastic Bilevel "
        "Optimization. ICML 2023, Algorithm 2."
    )
    lam_ratio: ClassVar[float] = 1.0  # lam_k = gamma_k / alpha_k, eq. (9b)
    auto_inner_factor: ClassVar[float] = 0.5
    auto_in_step: ClassVar[tuple[str, ...]] = ("regime", "lam0", "k0")  # noise; horizon
    divergence_advice: ClassVar[str] = penalty_advice("max(1, 4 gamma_0 L_f)")

    def validate(self) -> None:
        F2SA.validate(self)  # regime, lam_rule, lam0, k0, a >= c: the same options and names
        eta = self.eta
        if eta is not None and not callable(eta):
            if isinstance(eta, bool) or not isinstance(eta, int | float) or not 0 < eta <= 1:
                raise ValueError(
                    f"F3SA(eta={eta!r}) must be None (the (k+1)^(-2c) schedule), a float in "
                    "(0, 1] or a schedule k -> eta."
                )

    def exponents(self, problem: BilevelProblem) -> tuple[float, float]:
        a, c = F3SA_REGIMES[resolve_regime(self.regime, problem, self.batch_size)]
        return (a if self.a is None else self.a), (c if self.c is None else self.c)

    #: gamma_k, alpha_k = gamma_k / (lam_ratio lam_k), lam_k and the x step: F2SA's code, with
    #: this class's exponents and lam_ratio = 1
    schedule = F2SA.schedule
    # lam0 in the schedule; bl.solve and bl.sweep resolve a sampled run's "auto" first
    # (resolve), so F2SA's 10 for it is only reached by a step on an unresolved solver
    penalty_start = F2SA.penalty_start
    samples_inner_gradients = F2SA.samples_inner_gradients
    outer_step_decays = F2SA.outer_step_decays
    offset = F2SA.offset  # k0, with F2SA's "auto" (the horizon); 100 by default here
    with_horizon = F2SA.with_horizon

    def resolve(self, problem: BilevelProblem) -> F3SA:
        """``lr_inner="auto"`` as every solver's; then, when the run samples inner gradients,
        ``lam0="auto"`` becomes :func:`noisy_penalty_start` of the resolved ``lr_inner``."""
        solver = super().resolve(problem)
        if isinstance(solver.lam0, str) and solver.samples_inner_gradients(problem):
            lam0 = noisy_penalty_start(problem, solver.lr_inner)
            return dataclasses.replace(solver, lam0=lam0)
        return solver

    def momentum(self, problem: BilevelProblem, k):
        """eta_k of iteration k (:func:`momentum_weight` with this problem's c)."""
        return momentum_weight(k, self.exponents(problem)[1], self.eta)

    def init(self, problem: BilevelProblem, key: jax.Array) -> F3SAState:
        x0, y0 = problem.x0, problem.y0
        zx, zy = tree_zeros_like(x0), tree_zeros_like(y0)
        return F3SAState(
            x=x0,
            y=y0,
            z=y0,
            x_prev=x0,
            y_prev=y0,
            z_prev=y0,
            est=F3SAEstimators(gz=zy, fy=zy, gy=zy, fx=zx, gxy=zx, gxz=zx),
            k=jnp.zeros((), jnp.int32),
            key=key,
            counts=Counts.zeros(),
            outer_state=self.outer_init(x0),
        )

    def output(self, state: F3SAState):
        return state.x, state.z

    def step(self, problem: BilevelProblem, state: F3SAState) -> F3SAState:
        f, g = problem.outer, problem.inner
        sched = self.schedule(problem, state.k)
        eta = self.momentum(problem, state.k)
        x, y, z, x_prev, est = state.x, state.y, state.z, state.x_prev, state.est
        key, batch_key = jax.random.split(state.key)
        n_x, n_y = (1 if self.shared_x_sample else 2), (1 if self.shared_inner_sample else 2)
        # One sample per estimator, used at both of its points. Outer draws: zeta_y, zeta_x.
        # Inner draws: phi_z, phi_y (or one for both), then phi_x (or phi_xy, phi_xz).
        mb = self.minibatches(problem, batch_key, outer=2, inner=n_y + n_x)
        zeta_y, zeta_x = mb.outer(0), mb.outer(1)
        phi_z, phi_y = mb.inner(0), mb.inner(n_y - 1)
        phi_xy, phi_xz = mb.inner(n_y), mb.inner(n_y + n_x - 1)

        def estimate(oracle, fn, point, previous_point, sample, previous_estimate):
            now = oracle(fn, *point, sample)
            before = oracle(fn, *previous_point, sample)  # the SAME sample at the old point
            return storm(eta, now, previous_estimate, before)

        # Appendix C estimators of the lower-level steps, at (x_k, .) and (x_{k-1}, ._{k-1}).
        h_gz = estimate(oracles.grad_y, g, (x, z), (x_prev, state.z_prev), phi_z, est.gz)
        h_fy = estimate(oracles.grad_y, f, (x, y), (x_prev, state.y_prev), zeta_y, est.fy)
        h_gy = estimate(oracles.grad_y, g, (x, y), (x_prev, state.y_prev), phi_y, est.gy)
        z_new = tree_axpy(-sched.gamma, h_gz, z)  # Algorithm 2, z-step
        y_new = tree_axpy(-sched.alpha, tree_axpy(sched.lam, h_gy, h_fy), y)  # y-step
        # x-estimators at (x_k, y_{k+1}), (x_k, z_{k+1}); previous pairs (x_{k-1}, y_k),
        # (x_{k-1}, z_k): the points the estimators of step k-1 were evaluated at.
        h_fx = estimate(oracles.grad_x, f, (x, y_new), (x_prev, y), zeta_x, est.fx)
        h_gxy = estimate(oracles.grad_x, g, (x, y_new), (x_prev, y), phi_xy, est.gxy)
        h_gxz = estimate(oracles.grad_x, g, (x, z_new), (x_prev, z), phi_xz, est.gxz)
        direction = tree_axpy(sched.lam, tree_sub(h_gxy, h_gxz), h_fx)  # x-step direction
        x_new, outer_state = self.outer_step(problem, x, direction, state.outer_state, sched.outer)

        counts = state.counts.add(
            samples_outer=mb.samples_outer,
            samples_inner=mb.samples_inner,
            grad_f=4,  # h_fy, h_fx at two points each
            grad_g=8,  # h_gz, h_gy, h_gxy, h_gxz at two points each
        )
        return F3SAState(
            x=x_new,
            y=y_new,
            z=z_new,
            x_prev=x,
            y_prev=y,
            z_prev=z,
            est=F3SAEstimators(gz=h_gz, fy=h_fy, gy=h_gy, fx=h_fx, gxy=h_gxy, gxz=h_gxz),
            k=state.k + 1,
            key=key,
            counts=counts,
            outer_state=outer_state,
        )

r"""F2SA: fully first-order stochastic approximation for bilevel problems (Algorithm 1).

Kwon, Kwon, Wright, Nowak. "A Fully First-Order Method for Stochastic Bilevel Optimization."
ICML 2023 (arXiv:2301.10945), Algorithm 1, eqs. (5)-(7), Theorem 4.1 and Corollary 4.2.

The hypergradient is replaced by the gradient of the penalty surrogate (Lemma 3.1)

    grad L*_lam(x) = grad_x f(x, y*_lam) + lam (grad_x g(x, y*_lam) - grad_x g(x, y*)),

with ``y`` tracking ``y*_lam(x) = argmin_y f + lam g`` and ``z`` tracking ``y*(x) = argmin_y g``,
both by plain stochastic gradient steps. No second derivative is ever evaluated. The bias is
``||grad F - grad L*_lam|| <= C_lam / lam``, so ``lam_k`` grows polynomially.

``lam0="auto"``: eq. (7) asks ``lam_0 >= 2 l_{f,1} / mu_g``, and mu_g can fall far along the
path (a penalty ``exp(x) -> 0``). With exact inner gradients a larger lambda costs only slower
y steps on the f part, so the default is 100: on a digits 3-vs-8 logistic regression with one
log-penalty (full batches, 3000 steps, tuned ``lr_outer``) lam0 = 10 drove x to -9.4, not to
the -5.9 that 100 reaches, and ended at 0.15 of its start's ``||grad F||`` (F3SA 0.15), 100
at 0.022 (F3SA 0.023), while the full-batch rows of ``benchmarks/defaults.py`` stay at or
below 0.04. With
sampled inner gradients the x-gradient ``lam (grad_x g(x, y) - grad_x g(x, z))`` carries the
inner iterates' noise times lambda: there 100 ended at 1.0 on that problem's batches of 32,
so the default stays 10 (measured 2026-11-28).

``lr_inner="auto"``: ``1 / L_g`` with exact inner gradients, eq. (3a)'s ``1 / (4 L_g)`` with
sampled ones. The same noise reaches x through the inner iterates, whose spread around their
targets grows with their step: with ``1 / L_g`` F2SA ended at 0.10-0.28 of its start's
``||grad F||`` on the per-feature ridge of ``benchmarks/defaults.py`` with batches of 32 (three
seeds) and at 0.18 on the digits logistic regression above; with ``1 / (4 L_g)`` at
0.05-0.16 and 0.002-0.007 (measured 2026-11-29).

``shared_x_sample=True`` (Appendix C; Algorithm 1 writes two independent samples): the two
x-gradients of g are taken on one minibatch, so their difference ``lam (grad_x g(x, y; phi) -
grad_x g(x, z; phi))`` is a difference at two nearby points, of variance ``O(lam^2 ||y -
z||^2)``, where independent draws add ``2 lam^2 sigma_g^2``. Where ``grad_x g`` depends on the
sample (a weight per training row, as in hyper-cleaning) this is most of the x-gradient's
noise: with batches of 16 on an iris hyper-cleaning F2SA ended at 0.155 / 0.034 / 0.030 of
its start's ``||grad F||`` (seeds 0-2) with independent draws and at 0.019 / 0.015 / 0.027
with the shared one; on the wine hyper-cleaning of ``benchmarks/defaults.py`` with batches of
32 at 0.063 and 0.027. Where it does not (a penalty on y alone) nothing changes.

``shared_inner_sample=True`` (Algorithm 1 draws phi_z and phi_y apart; Jia & Chen's Algorithm 3,
the stochastic F2OBO, draws one zeta for both): the z step and the y step of an inner step
take grad_y g on one minibatch. Each step stays unbiased; their noises are then correlated,
so y - z, which lam multiplies in the x-gradient, carries less of it. Where grad_x g is not
linear in y (a penalty ``exp(x_j) w_j^2``) the spreads of y and z also bias that term, by
``lam (E[grad_x g(x, y)] - E[grad_x g(x, z)])``, which grows with lam: on the per-feature ridge
of ``benchmarks/defaults.py`` with batches of 32 (3000 steps, six seeds) F2SA ended at 0.061-0.146
of its start's ``||grad F||`` (mean 0.112, and lower with a smaller lam0: 0.086 at 5) with
independent draws and at 0.018-0.032 (mean 0.025) with the shared one; its other minibatch rows
went 0.036 -> 0.012 (the other ridge) and 0.004 -> 0.003 (the other logistic regression, three
seeds each), the logistic regression 0.021 -> 0.020 (measured 2026-11-29).

``k0="auto"``: the offset of the power laws ``(k0 / (k + k0))^a`` is the run's horizon K (at
least 100). Eq. (7) asks ``k_0 >= (4 / mu_g) max(xi l_{F,1} / 2, T l_{g,1}, l_{f,1})``, at least
``4 T kappa_g`` (40 kappa_g with T = 10): for any but the best-conditioned inner problem that is
beyond a practical horizon, so over the run the theory's steps barely decay. A fixed k0 = 100
makes the x step fall to ``31^(-5/7) = 0.09`` of its start by step 3000 (sampled inner
gradients), long before the run has made its progress, while ``lr_outer="auto"`` is tuned on
the run's first 150 steps; with k0 = K it falls to ``2^(-a)`` of its start at the end, and lam
grows by ``2^(a - c)``. Measured on ``benchmarks/defaults.py`` (tuned ``lr_outer``, 3000
steps), the ratio of the final to the start's ``||grad F||``, k0 = 100 -> K: nine of the ten
rows of seed 0 fell (full batches: ridge 0.040 -> 0.022, the other ridge 0.025 -> 0.012,
logistic 0.005 -> 0.003, the other logistic 0.032 -> 0.007, cleaning 0.015 -> 0.007;
minibatches: the other ridge 0.049 -> 0.031, logistic 0.031 -> 0.022, the other logistic 0.139
-> 0.006, cleaning 0.027 -> 0.024), and ridge / 32 rose 0.053 -> 0.090; over seeds 1 and 2
the minibatch rows went 0.157 / 0.089 -> 0.138 / 0.068 (ridge), 0.173 / 0.130 -> 0.041 / 0.035
(the other ridge) and 0.137 / 0.124 -> 0.002 / 0.006 (the other logistic). F3SA keeps 100: its
minibatch logistic rows rose from 0.023 and 0.038 to 0.167 and 0.151 with K.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from bilevel.core.oracles import Counts
from bilevel.core.problem import BilevelProblem
from bilevel.core.schedules import step_size
from bilevel.solvers.base import OuterState, Solver
from bilevel.solvers.common import penalty_inner_loop, penalty_x_gradient
from bilevel.solvers.registry import register

PyTree = Any

#: Corollary 4.2 exponents (a, c) of alpha_k ~ k^-a and gamma_k ~ k^-c, by noise regime;
#: lam_k grows as k^(a - c). "constant" is the practical variant of Sec. 4.4: "we can set
#: lambda_k := lambda constant at all iterations and choose more aggressive step-sizes, e.g.,
#: alpha_k ~ k^(-1/2), gamma_k ~ k^(-1/2)", which converges faster to a point biased by
#: O(1/lambda) in grad F (Lemma 3.1). a = c makes lam_k = lam0 for every k. Fixed steps AND
#: fixed lam (not in the paper) are ``a=0.0, c=0.0``.
F2SA_REGIMES: dict[str, tuple[float, float]] = {
    "stochastic": (5 / 7, 4 / 7),  # (a) sigma_f, sigma_g > 0
    "outer-noise": (3 / 5, 2 / 5),  # (b) sigma_f > 0, sigma_g = 0
    "deterministic": (1 / 3, 0.0),  # (c)
    "constant": (1 / 2, 1 / 2),  # Sec. 4.4: lam_k = lam0, alpha_k, gamma_k ~ k^(-1/2)
}


#: lambda_0 under ``lam0="auto"`` with exact inner gradients, and with sampled ones
LAM0_EXACT, LAM0_NOISY = 100.0, 10.0
#: F2SA's ``lr_inner="auto"`` with sampled inner gradients: gamma_0 = 1 / (4 L_g), eq. (3a)
INNER_FACTOR_NOISY = 0.25
#: ``k0="auto"`` is the run's horizon K (``Solver.with_horizon``), at least this; and this on a
#: solver stepped without a horizon (F3SA's and, until 2026-11-29, F2SA's default)
K0_START = 100.0


def penalty_advice(sampled_lam0: str) -> str:
    """A penalty method's divergence advice (``Solver.divergence_advice``): lam multiplies the x
    step's penalty term, so lam0 is a fix beside the steps; ``sampled_lam0`` says what
    ``lam0="auto"`` is with sampled inner gradients."""
    return (
        "try smaller step sizes (lr_outer, lr_inner) or a smaller lam0 (lam multiplies the x "
        "step's penalty term; lam0='auto' is 100 with exact inner gradients, "
        f"{sampled_lam0} with sampled ones)"
    )


def resolve_regime(regime: str, problem: BilevelProblem, batch_size: int | None) -> str:
    """``"auto"``: the regime matching the problem's noise (full batches count as exact)."""
    if regime != "auto":
        return regime
    noisy_outer = problem.outer_data is not None and batch_size is not None
    noisy_inner = problem.inner_data is not None and batch_size is not None
    if noisy_inner:
        return "stochastic"
    return "outer-noise" if noisy_outer else "deterministic"


class PenaltySchedule(NamedTuple):
    """Step sizes of iteration k (the closed forms of eqs. (5)-(7) and Appendix B.5)."""

    gamma: jax.Array  # z step (plain lower level)
    alpha: jax.Array  # y step on the f part; y step on the g part is alpha * lam = beta
    lam: jax.Array  # penalty multiplier lambda_k
    outer: jax.Array  # x step xi * alpha_k


def penalty_schedule(
    k,
    *,
    lr_outer,
    lr_inner,
    lam0: float,
    a: float,
    c: float,
    k0: float,
    lam_ratio: float,
    lagged: bool,
) -> PenaltySchedule:
    """Step sizes of iteration k: gamma_k, alpha_k, lam_k = gamma_k / (r alpha_k) and the x step.

    gamma_k = gamma_0 (k0/(k+k0))^c and alpha_k = alpha_0 (k0/(k+k0))^a (eq. (7), Corollary 4.2;
    both by :func:`bilevel.core.schedules.step_size`).

    ``r = lam_ratio`` is 2 for F2SA (eq. (6): lam_k = gamma_k / (2 alpha_k)) and 1 for F3SA
    (eq. (9b)). With ``alpha_0 = gamma_0 / (r lam0)`` this is lam_k = lam0 ((k+k0)/k0)^(a-c)
    (eq. (28), with B.5's stray factor 2 removed). ``lagged=True`` is the update
    lam_{k+1} = lam_k + delta_k with delta_k = gamma_k / (r alpha_k) - lam_k: literally (9b) for
    F3SA, and (6) for F2SA with the min's other term (T mu_g / 16) alpha_k lam_k^2 dropped
    (Appendix B.5 shows it is never the smaller one for T >= 32). So lam_1 = lam_0 and
    lam_{k+1} = gamma_k / (r alpha_k) (a one-step lag), while alpha_k keeps its power law.
    The x step is xi * alpha_k; we parametrise it by its initial value ``lr_outer`` = xi alpha_0.
    Callable ``lr_outer`` / ``lr_inner`` replace the power laws for x / z (lam stays as above).
    """
    kf = jnp.asarray(k, dtype=jnp.result_type(float))
    # the power laws of Corollary 4.2 (schedules get k as a float, as they always have here)
    gamma = step_size(lr_inner, kf, c, k0)
    lam_closed = lam0 * ((kf + k0) / k0) ** (a - c)
    # alpha_k = gamma_k / (r lam_k): the closed form; for power laws it is alpha_0 (k0/(k+k0))^a,
    # which is also the alpha_k of the lagged rule (only lam lags there).
    alpha = gamma / (lam_ratio * lam_closed)
    if lagged:
        lam = lam0 * ((jnp.maximum(kf - 1.0, 0.0) + k0) / k0) ** (a - c)
    else:
        lam = lam_closed
    outer = step_size(lr_outer, kf, a, k0)
    return PenaltySchedule(gamma=gamma, alpha=alpha, lam=lam, outer=outer)


class F2SAState(NamedTuple):
    x: PyTree  # upper iterate x_k
    y: PyTree  # penalised lower iterate, tracks y*_lam(x) = argmin_y f + lam g
    z: PyTree  # plain lower iterate, tracks y*(x) = argmin_y g
    k: jax.Array  # iteration count
    key: jax.Array  # PRNG key
    counts: Counts  # samples and oracle calls so far
    outer_state: OuterState  # the outer optimiser's state


@register("f2sa")
@dataclasses.dataclass(frozen=True)
class F2SA(Solver):
    r"""F2SA (Kwon et al., ICML 2023, Algorithm 1), with the schedules of eqs. (5)-(7).

    Per iteration k, with fresh minibatches for every oracle::

        for t < T:  z <- z - gamma_k grad_y g(x_k, z)
                    y <- y - alpha_k (grad_y f(x_k, y) + lam_k grad_y g(x_k, y))
        x <- Proj_X(x_k - xi alpha_k [grad_x f(x_k, y)
                                      + lam_k (grad_x g(x_k, y) - grad_x g(x_k, z))])
        lam_{k+1} = lam_0 ((k + 1 + k0)/k0)^(a - c)

    Draws of one step (``inner(i)``, ``outer(i)`` of the step's minibatches), a fresh one per
    oracle as Algorithm 1 draws them, but for the two g-gradients of an inner step, which share
    one (``shared_inner_sample``), and the x-gradients of g, which share one (Appendix C;
    ``shared_x_sample``); with both ``False``, Algorithm 1's independent draws (``s`` = 2, else
    1, the draws per inner step)::

        inner(s t), t < T       grad_y g at z in inner step t
        inner(s t + s - 1)      grad_y g at y in inner step t (the same draw when s = 1)
        outer(t), t < T         grad_y f at y in inner step t
        inner(s T)              grad_x g at y, and at z (``shared_x_sample``, the default)
        inner(s T + 1)          grad_x g at z (``shared_x_sample=False``)
        outer(T)                grad_x f

    The x-gradients are taken at the old x_k and the new y, z (eq. (10)). The paper is
    unconstrained; with ``x_set`` the x step is projected (a projected-gradient extension).
    ``solve`` reports ``z`` as the estimate of ``y*(x)`` (``y`` is pulled toward f).

    Args:
        lr_outer: initial x step ``xi * alpha_0`` (then ``* (k0/(k+k0))^a``), or a schedule.
        lr_inner: initial z step ``gamma_0`` (then ``* (k0/(k+k0))^c``), or a schedule. The y step
            on the g part is ``beta_k = alpha_k lam_k = gamma_k / 2``. Theory (3a) asks
            ``gamma_k <= 1/(4 L_g)``. The default ``"auto"`` (L_g estimated by
            ``bl.diagnose``) is that bound when the inner gradients are sampled and ``1/L_g``
            when they are exact (:meth:`inner_step_factor`; the module docstring says why).
        batch_size: minibatch size of every oracle (None = full data).
        inner_steps: T, inner steps per outer iteration. Eq. (5) asks T >= 32 for the proof's
            constants; 10 is the practical default.
        lam0: lambda_0; should be >= 2 l_{f,1}/mu_g (eq. (7)) so f + lam g is strongly convex.
            ``"auto"`` (default): :data:`LAM0_EXACT` = 100 when the inner gradients are exact
            (full inner batches), :data:`LAM0_NOISY` = 10 when they are sampled
            (:meth:`penalty_start`).
        regime: exponents (a, c) of Corollary 4.2: "stochastic" (5/7, 4/7), "outer-noise"
            (3/5, 2/5), "deterministic" (1/3, 0), "constant" (1/2, 1/2: Sec. 4.4's constant
            lam = lam0 with alpha_k, gamma_k ~ k^(-1/2)), or "auto" (by the problem's noise).
            ``a``, ``c`` override it (``a=0.0, c=0.0``: fixed steps and lam, not in the paper).
        k0: offset k_0 of the power laws. ``"auto"`` (default): the run's horizon K, at least
            :data:`K0_START` = 100 (which a solver stepped by hand without
            :meth:`with_horizon` gets); the module docstring says why.
        lam_rule: "closed" (lam_k = gamma_k/(2 alpha_k), B.5) or "lagged" (eq. (6) as an
            update, lam_{k+1} = gamma_k/(2 alpha_k), so lam_1 = lam_0; see
            :func:`penalty_schedule`).
        shared_x_sample: one minibatch for grad_x g at y and at z (Appendix C, the default)
            or Algorithm 1's two independent ones (the module docstring says why).
        shared_inner_sample: one minibatch for grad_y g at z and at y in each inner step (the
            default, as Algorithm 3 of Jia & Chen's F2OBO draws one zeta for both) or
            Algorithm 1's two independent ones (the module docstring says why).

    References:
        Kwon, Kwon, Wright, Nowak. "A Fully First-Order Method for Stochastic Bilevel
        Optimization." ICML 2023.

    Assumptions: g(x, .) strongly convex; f, g smooth (A1-A5 of the paper).
    """

    lr_outer: Any = "auto"
    lr_inner: Any = "auto"
    batch_size: int | None = None
    inner_steps: int = 10
    lam0: float | str = "auto"
    regime: str = "auto"
    a: float | None = None
    c: float | None = None
    k0: float | str = "auto"
    lam_rule: str = "closed"
    shared_x_sample: bool = True
    shared_inner_sample: bool = True

    name: ClassVar[str] = "f2sa"
    paper: ClassVar[str] = (
        "Kwon, Kwon, Wright, Nowak. A Fully First-Order Method for Stochastic Bilevel "
        "Optimization. ICML 2023, Algorithm 1."
    )
    lam_ratio: ClassVar[float] = 2.0  # lam_k = gamma_k / (2 alpha_k), eq. (6)
    auto_in_step: ClassVar[tuple[str, ...]] = ("regime", "lam0", "k0")  # noise; horizon
    divergence_advice: ClassVar[str] = penalty_advice("10")

    def validate(self) -> None:
        if self.regime != "auto" and self.regime not in F2SA_REGIMES:
            raise ValueError(
                f"{type(self).__name__}(regime={self.regime!r}) is unknown; use 'auto' or one of "
                f"{sorted(F2SA_REGIMES)}."
            )
        if self.lam_rule not in ("closed", "lagged"):
            raise ValueError(f"lam_rule must be 'closed' or 'lagged', got {self.lam_rule!r}.")
        lam0 = self.lam0
        if lam0 != "auto" if isinstance(lam0, str) else not lam0 > 0:
            raise ValueError(f"lam0 must be 'auto' or a number > 0, got {lam0!r}.")
        k0 = self.k0
        if k0 != "auto" if isinstance(k0, str) else not k0 > 0:
            raise ValueError(f"k0 must be 'auto' or a number > 0, got {k0!r}.")
        a, c = self.a, self.c
        if a is not None and c is not None and a < c:
            raise ValueError(
                f"need a >= c so that lam_k = O(k^(a-c)) does not decay; got a={a}, c={c}."
            )

    def exponents(self, problem: BilevelProblem) -> tuple[float, float]:
        a, c = F2SA_REGIMES[resolve_regime(self.regime, problem, self.batch_size)]
        return (a if self.a is None else self.a), (c if self.c is None else self.c)

    def penalty_start(self, problem: BilevelProblem) -> float:
        """lambda_0: the given number, or under ``"auto"`` :data:`LAM0_EXACT` when the inner
        gradients are exact and :data:`LAM0_NOISY` when they are sampled (the module docstring
        says why)."""
        if not isinstance(self.lam0, str):  # a number (a traced leaf inside a program)
            return self.lam0
        return LAM0_NOISY if self.samples_inner_gradients(problem) else LAM0_EXACT

    def samples_inner_gradients(self, problem: BilevelProblem) -> bool:
        """Whether a run on ``problem`` draws minibatches of the inner data: exactly the
        "stochastic" regime of :func:`resolve_regime`."""
        return resolve_regime("auto", problem, self.batch_size) == "stochastic"

    def inner_step_factor(self, problem: BilevelProblem) -> float:
        """``lr_inner="auto"`` is ``1 / L_g`` with exact inner gradients and eq. (3a)'s
        ``1 / (4 L_g)`` (:data:`INNER_FACTOR_NOISY`) with sampled ones (module docstring)."""
        if self.samples_inner_gradients(problem):
            return INNER_FACTOR_NOISY
        return self.auto_inner_factor

    def outer_step_decays(self, problem: BilevelProblem) -> bool:
        """The x step decays as ``(k0/(k + k0))^a`` (Corollary 4.2), unless ``a = 0``."""
        return self.exponents(problem)[0] > 0

    def schedule(self, problem: BilevelProblem, k) -> PenaltySchedule:
        a, c = self.exponents(problem)
        return penalty_schedule(
            k,
            lr_outer=self.lr_outer,
            lr_inner=self.lr_inner,
            lam0=self.penalty_start(problem),
            a=a,
            c=c,
            k0=self.offset(),
            lam_ratio=self.lam_ratio,
            lagged=self.lam_rule == "lagged",
        )

    def offset(self) -> float:
        """k_0 of the power laws: the given number, or under ``"auto"`` not yet told a horizon
        (:meth:`with_horizon`) :data:`K0_START`."""
        return K0_START if isinstance(self.k0, str) else self.k0

    def with_horizon(self, steps: int) -> Solver:
        """``k0="auto"`` becomes the run's horizon K, at least :data:`K0_START` (the module
        docstring says why); a given ``k0`` is kept."""
        if isinstance(self.k0, str):
            return dataclasses.replace(self, k0=max(K0_START, float(steps)))
        return self

    def init(self, problem: BilevelProblem, key: jax.Array) -> F2SAState:
        return F2SAState(
            x=problem.x0,
            y=problem.y0,
            z=problem.y0,
            k=jnp.zeros((), jnp.int32),
            key=key,
            counts=Counts.zeros(),
            outer_state=self.outer_init(problem.x0),
        )

    def output(self, state: F2SAState):
        return state.x, state.z

    def step(self, problem: BilevelProblem, state: F2SAState) -> F2SAState:
        f, g = problem.outer, problem.inner
        sched = self.schedule(problem, state.k)
        x, T = state.x, self.inner_steps
        key, batch_key = jax.random.split(state.key)
        n_x_inner = 1 if self.shared_x_sample else 2
        per_step = 1 if self.shared_inner_sample else 2
        # Outer draws: T for h_fy, 1 for h_fx. Inner draws: 1 per inner step for h_gz and h_gy
        # (2 in Algorithm 1), then 1 for h_gxy and h_gxz (2 in Algorithm 1).
        n_inner = per_step * T
        mb = self.minibatches(problem, batch_key, outer=T + 1, inner=n_inner + n_x_inner)

        def draws(t):  # inner step t: g at z, f at y, g at y
            return mb.inner(per_step * t), mb.outer(t), mb.inner(per_step * t + per_step - 1)

        y, z = penalty_inner_loop(
            f,
            g,
            x,
            state.y,
            state.z,
            lr_z=sched.gamma,
            lr_y=sched.alpha,
            lam=sched.lam,
            num_steps=T,
            draws=draws,
        )
        # Eq. (10): x-gradients at the old x_k and the new y_{k+1}, z_{k+1}.
        direction = penalty_x_gradient(
            f,
            g,
            x,
            y,
            z,
            sched.lam,
            mb.outer(T),
            mb.inner(n_inner),
            mb.inner(n_inner + n_x_inner - 1),
        )
        x_new, outer_state = self.outer_step(problem, x, direction, state.outer_state, sched.outer)

        counts = state.counts.add(
            samples_outer=mb.samples_outer,
            samples_inner=mb.samples_inner,
            grad_f=T + 1,
            grad_g=2 * T + 2,
        )
        return F2SAState(
            x=x_new, y=y, z=z, k=state.k + 1, key=key, counts=counts, outer_state=outer_state
        )

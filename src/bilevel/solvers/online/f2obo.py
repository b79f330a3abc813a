r"""F2OBO: the fully first-order online bilevel optimizer (Algorithm 1), and the round
schedule of the paper's four methods.

Jia & Chen, "Fully First-Order Algorithms for Online Non-Convex Bilevel Optimization",
arXiv:2602.11665 (2026), Algorithm 1 and Theorem 3.1.

At round t the hypergradient of F_t is replaced by the gradient of the penalty surrogate
L*_t(x) = f_t(x, y*_{lam_t,t}) + lam_t (g_t(x, y*_{lam_t,t}) - g_t(x, y*_t)) (eq. (6)), with
two warm-started inner sequences: z tracks y*_t(x_t) = argmin_y g_t, y tracks
y*_{lam_t,t}(x_t) = argmin_y f_t + lam_t g_t and is the committed inner decision. No second
derivative is evaluated. The multiplier grows, lam_t = lam_1 t^tau, so the bias
||grad F_t - grad L*_t|| <= D_1 / lam_t (Lemma B.2) vanishes, and the y-step must shrink like
1/lam_t (Theorem 3.1: beta_t <= 1/(2 lam_t L_{g,1}); a constant beta diverges once lam_t L_g
exceeds 2): beta_t = lr_lagrangian / lam_t.

The x-gradients share F2SA's pieces (``solvers/common.py``: the two inner sequences and the
penalty x-gradient at detached y, z), with f_t, g_t of the round. :class:`PenaltyOnlineSolver`
holds what the paper's four methods share (the multiplier and the round schedule); F2OBO-SL
(``f2obo_sl.py``, Theorem 3.2) and SF2OBO (``sf2obo.py``, Algorithm 3) subclass F2OBO, whose
minibatch layout below is already Algorithm 3's, and AF2OBO (``af2obo.py``, Algorithm 2)
subclasses :class:`PenaltyOnlineSolver`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from bilevel.core.oracles import Counts
from bilevel.core.schedules import round_step_size
from bilevel.solvers.base import OuterState
from bilevel.solvers.common import penalty_inner_loop, penalty_x_gradient
from bilevel.solvers.online import auto
from bilevel.solvers.online.base import OnlineSolver
from bilevel.solvers.registry import register

PyTree = Any

__all__ = ["F2OBO", "F2OBOState", "PenaltyOnlineSolver", "RoundSchedule"]


class F2OBOState(NamedTuple):
    x: PyTree  # x_t, committed for round t
    y: PyTree  # y_t, the Lagrangian solver: tracks y*_{lam_t,t}(x_t); the committed inner decision
    z: PyTree  # z_t, the g-solver: tracks y*_t(x_t) = argmin_y g_t(x_t, y)
    t: jax.Array  # the round about to be played (int32, from 1)
    key: jax.Array  # PRNG key
    counts: Counts  # samples and oracle calls so far
    outer_state: OuterState  # the outer optimiser's state


class RoundSchedule(NamedTuple):
    """The step sizes and multiplier of round t (Algorithm 1's inputs)."""

    lam: jax.Array  # lambda_t = lambda_1 t^tau
    alpha: jax.Array  # z step on grad_y g_t
    beta: jax.Array  # y step on grad_y f_t + lam_t grad_y g_t: lr_lagrangian_t / lam_t
    gamma: jax.Array  # x step


@dataclasses.dataclass(frozen=True)
class PenaltyOnlineSolver(OnlineSolver):
    """What F2OBO, F2OBO-SL, AF2OBO and SF2OBO share: the step sizes, the multiplier
    lam_t = lam1 t^tau and the round schedule (:meth:`schedule`). Not registered itself; each
    subclass writes its own ``round`` (fields documented on :class:`F2OBO`)."""

    lr_outer: Any = "auto"
    lr_inner: Any = "auto"
    lr_lagrangian: Any = None
    batch_size: int | None = None
    lam1: float = 5.0
    tau: float = 0.5

    optional_step_sizes: ClassVar[tuple[str, ...]] = ("lr_lagrangian",)
    #: whether gamma_t decays like t^-tau (Theorem 3.2's single-loop rule) or stays lr_outer
    outer_decays: ClassVar[bool] = False

    def validate(self) -> None:
        if not self.lam1 > 0:
            raise ValueError(f"{type(self).__name__}(lam1={self.lam1!r}) must be > 0.")
        if not self.tau >= 0:
            raise ValueError(
                f"{type(self).__name__}(tau={self.tau!r}) must be >= 0 (lam_t = lam1 t^tau must "
                "not decrease)."
            )

    def multiplier(self, t) -> jax.Array:
        """lambda_t = lambda_1 t^tau (t from 1, possibly traced)."""
        return self.lam1 * jnp.asarray(t, jnp.result_type(float)) ** self.tau

    def schedule(self, t) -> RoundSchedule:
        """The multiplier and step sizes of round t."""
        lam = self.multiplier(t)
        alpha = round_step_size(self.lr_inner, t)
        lagrangian = alpha / 2 if self.lr_lagrangian is None else self.lr_lagrangian
        beta = round_step_size(lagrangian, t) / lam
        return RoundSchedule(lam=lam, alpha=alpha, beta=beta, gamma=self.outer_lr(t))

    def outer_lr(self, t) -> jax.Array:
        """gamma_t: ``lr_outer`` (F2OBO), or ``lr_outer t^-tau`` (F2OBO-SL)."""
        return round_step_size(self.lr_outer, t, self.tau if self.outer_decays else 0.0)

    def inner_contraction(self, problem) -> float:
        """rho = max(rho_y, rho_z) of Theorem 3.1 (its proof, eqs. (17) and (19)): the
        contraction of squared distances per inner step, rho_z = 1 - alpha mu_g for the z step
        on g_t and rho_y = 1 - beta_t lam_t mu_g / 2 for the y step on L_t = f_t + lam_t g_t,
        which is (lam_t mu_g / 2)-strongly convex and (2 lam_t L_g)-smooth for lam_t >=
        2 L_{f,1} / mu_g, with mu_g and L_g from ``bl.diagnose`` on round 1
        (``bilevel.solvers.online.auto.inner_contraction``; needs numeric steps)."""
        from bilevel.analysis.diagnose import strong_convexity

        mu, L = strong_convexity(
            problem.round_problem(1),
            f"{type(self).__name__}(inner_steps='auto') needs mu_g and L_g (Theorem 3.1's rho)",
            "give inner_steps as an int",
        )
        alpha = float(round_step_size(self.lr_inner, 1))  # a schedule: its first round's
        lagrangian = self.lr_lagrangian
        lagrangian = alpha / 2 if lagrangian is None else float(round_step_size(lagrangian, 1))
        rho_z = auto.inner_contraction(alpha, mu, L)
        rho_y = auto.inner_contraction(lagrangian, mu / 2, 2 * L)  # beta_t lam_t = lagrangian
        return max(rho_y, rho_z)

    def theory_inner_steps(self, problem) -> int:
        """Theorem 3.1's K for the run's horizon T = ``problem.horizon``: the least K with
        2 rho^K <= rho and lam_T^2 rho^K <= 1, lam_T = lam1 T^tau (:meth:`inner_contraction`;
        ``bilevel.solvers.online.auto.penalty_inner_steps``): K = O(tau log T)."""
        lam_last = float(self.lam1) * float(problem.horizon) ** float(self.tau)
        return auto.penalty_inner_steps(lam_last, self.inner_contraction(problem))


@register("f2obo")
@dataclasses.dataclass(frozen=True)
class F2OBO(PenaltyOnlineSolver):
    r"""F2OBO (Jia & Chen, arXiv:2602.11665, Algorithm 1), fixed K inner steps per round.

    Round t, at the committed x_t, from the warm starts y_t, z_t (K steps, independent)::

        z <- z - alpha grad_y g_t(x_t, z)
        y <- y - beta_t (grad_y f_t(x_t, y) + lam_t grad_y g_t(x_t, y))
        ghat_t  = grad_x f_t(x_t, y_{t+1})
                  + lam_t (grad_x g_t(x_t, y_{t+1}) - grad_x g_t(x_t, z_{t+1}))
        x_{t+1} = Proj_X(x_t - gamma_t ghat_t)
        lam_{t+1} = (1 + 1/t)^tau lam_t,  i.e. lam_t = lam_1 t^tau

    (the closed form is used: the recursion from lam_1 gives exactly lam_1 t^tau; the paper's
    product formula, lam_t = lam_1 prod_{s<=t} (1 + 1/s)^tau, would give lam_1 (t + 1)^tau, one
    round ahead). z_1 = y_1 = y0.

    Draws of round t (``inner(i)``, ``outer(i)`` of round t's minibatches, drawn with the second
    key of ``split(state.key)``; Algorithm 3's layout, which Algorithm 1 reads with full
    rounds)::

        inner(k), k < K   zeta_t^k: grad_y g at z AND grad_y g at y, inner step k (line 7)
        outer(k), k < K   xi_t^k: grad_y f at y, inner step k (line 7)
        outer(K)          xi_t: grad_x f of ghat (line 10)
        inner(K)          zeta_t: both grad_x g terms of ghat, at y_{t+1} and z_{t+1} (line 10)

    Args:
        lr_outer: gamma, the x step (a float, or a schedule of the round t). Default
            ``"auto"``: ``bl.solve_online`` tunes it on the first rounds, over a grid below the
            stable bound of the round map (``bilevel.drivers.online``); ``resolve`` alone
            takes a quarter of that bound, Theorem 3.1's gamma <= 1/(2 L_F) for an exact
            gradient step. A number above the bound is refused by ``bl.solve_online``. (The
            paper's Experiment 1 used 0.001.)
        lr_inner: alpha, the z step on g_t (a float or a schedule of t). Default ``"auto"``:
            1/L_g with L_g estimated by ``bl.diagnose`` on round 1 (Theorem 3.1: alpha <=
            1/L_{g,1}); Experiment 1 used 0.1.
        lr_lagrangian: the y step times lam_t: beta_t = lr_lagrangian / lam_t, so the y step
            shrinks like 1/lam_t as Theorem 3.1 requires (beta_t <= 1/(2 lam_t L_{g,1})).
            Default ``None`` = ``lr_inner / 2``, i.e. beta_t = alpha / (2 lam_t): exactly
            Theorem 3.1's 1/(2 lam_t L_g) at alpha = 1/L_g. (The paper's experiments tuned beta
            on a grid and did not report it.)
        batch_size: minibatch size of every draw from round t's samples (``None`` = the whole
            round). With minibatches the draws follow Algorithm 3 (SF2OBO): at inner step k one
            inner batch zeta_k feeds both the z and the y step and one outer batch xi_k the y
            step; ghat uses a fresh xi and a fresh zeta shared by both g terms.
        inner_steps: K, the z and y steps per round. Default ``"auto"``: Theorem 3.1's
            K >= max{1 - ln 2 / ln rho, (ln c - 2 ln lam1 - 2 tau ln T) / ln rho} for the
            run's horizon T, i.e. lam_T^2 rho^K <= c = 1 with lam_T = lam1 T^tau
            (:meth:`theory_inner_steps`; Theorem 3.1's printed max leaves lam1 inside its
            constant c, which it asks to satisfy lam_t^2 rho^K <= c): K = O(tau log T).
            (Experiment 1 used 5, which diverges once lam_t = 5t outgrows it.)
        lam1: lambda_1, default 5 (Experiments 1 and 2); theory asks lam1 > 2 L_{f,1}/mu_g.
        tau: the growth exponent of lam_t = lam1 t^tau, default 1/2: Theorem 3.1's regret is
            O(T^(1 - 2 tau)) below 1/2, O(log T + V_T + H_{2,T}) at 1/2 and O(1 + V_T +
            H_{2,T}) above, with K growing like tau log T, so 1/2 is the least tau without a
            polynomial bias term and needs the fewest inner steps among them. (The
            experiments used 1.) tau = 0 keeps lam constant (not covered by the theory).

    Per-round counts: ``grad_f = K + 1``, ``grad_g = 2K + 2``, no second-order calls.
    """

    inner_steps: int | str = "auto"

    name: ClassVar[str] = "f2obo"
    paper: ClassVar[str] = (
        "Jia, Chen. Fully First-Order Algorithms for Online Non-Convex Bilevel Optimization. "
        "arXiv:2602.11665, 2026, Algorithm 1."
    )

    def resolve_settings(self, problem) -> F2OBO:
        """``lr_inner="auto"`` as every online solver, then ``inner_steps="auto"`` by
        Theorem 3.1's rule for ``problem.horizon`` (:meth:`theory_inner_steps`)."""
        solver = super().resolve_settings(problem)
        if solver.inner_steps == "auto" and solver.uses_inner_steps():
            solver = dataclasses.replace(solver, inner_steps=solver.theory_inner_steps(problem))
        return solver

    def uses_inner_steps(self) -> bool:
        """Whether ``inner_steps`` sets K (SF2OBO's theory schedule sets K_t instead)."""
        return True

    def outer_step_hint(self) -> str:
        return ", or more inner_steps (the inner errors are amplified by lam_t = lam1 t^tau)"

    def init(self, problem, key: jax.Array) -> F2OBOState:
        return F2OBOState(
            **self.first_round(problem, key),
            z=problem.y0,
        )

    def round_plan(self, t) -> tuple[Any, int]:
        """``(K_t, draws)``: round t's inner steps (F2OBO: the int ``inner_steps``; SF2OBO's
        theory schedule: a traced K_t) and how many draws per level to prepare (static, at
        least K_t + 1: draw k < K_t feeds inner step k, draw K_t the hypergradient)."""
        return self.inner_steps, self.inner_steps + 1

    def round_data(self, problem, t, key: jax.Array, draws: int):
        """``(f_t, g_t, batches, samples per outer draw, samples per inner draw)`` of round t:
        the round's functions and ``draws`` draws of ``batch_size`` per level (SF2OBO's growing
        B_t overrides this)."""
        f, g = problem.at_round(t)
        mb = self.round_batches(problem, t, key, outer=draws, inner=draws)
        return f, g, mb, mb.samples_outer // draws, mb.samples_inner // draws

    def round(self, problem, state: F2OBOState) -> F2OBOState:
        t, x = state.t, state.x
        K, num_draws = self.round_plan(t)
        sched = self.schedule(t)
        key, batch_key = jax.random.split(state.key)
        # Algorithm 3's layout: draw k < K feeds inner step k, draw K the hypergradient
        f, g, mb, per_outer, per_inner = self.round_data(problem, t, batch_key, num_draws)

        def draws(k):  # g at z and g at y on the same zeta_k (Algorithm 3 line 7)
            return mb.inner(k), mb.outer(k), mb.inner(k)

        y, z = penalty_inner_loop(
            f,
            g,
            x,
            state.y,
            state.z,
            lr_z=sched.alpha,
            lr_y=sched.beta,
            lam=sched.lam,
            num_steps=K,
            draws=draws,
        )
        # line 9: at the old x_t and the new y_{t+1}, z_{t+1}; one zeta for both g terms
        direction = penalty_x_gradient(
            f, g, x, y, z, sched.lam, mb.outer(K), mb.inner(K), mb.inner(K)
        )
        x_new, outer_state = self.outer_step(problem, x, direction, state.outer_state, sched.gamma)
        counts = state.counts.add(
            samples_outer=(K + 1) * per_outer,
            samples_inner=(K + 1) * per_inner,
            grad_f=K + 1,
            grad_g=2 * K + 2,
        )
        return F2OBOState(
            x=x_new, y=y, z=z, t=t + 1, key=key, counts=counts, outer_state=outer_state
        )

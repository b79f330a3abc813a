r"""SF2OBO: stochastic F2OBO (Jia & Chen, arXiv:2602.11665, Algorithm 3, Theorem 5.1, Cor. 5.2).

F2OBO (``online/f2obo.py``) already draws its minibatches in Algorithm 3's layout: at inner step
k one inner batch zeta_t^k feeds both the z and the y step and an outer batch xi_t^k the y
step (line 7), and ghat a fresh xi_t and one zeta_t in both g terms (line 10). SF2OBO adds
Theorem 5.1's round schedules:

    alpha_t = lr_inner t^-a,   beta_t = lr_lagrangian / (lam1 t^b)   (lam1 t^b, not lam_t),
    K_t = ceil(4 kappa_g max(t^(b - tau), t^a) log t), at least 1 and at most max_inner_steps,
    B_t = Bhat_t = ceil(t^batch_power), at most the batch_size cap,

Corollary 5.2's being tau = b = 1/6, a = 0, batch_power = 2/3 (:meth:`SF2OBO.corollary_5_2`):
E[BLReg(T)] = O(T^(2/3) (1 + sigma^2) + V_T + H_{2,T}) with O(T^(5/3) log T) samples.

A traced K_t runs as a ``while_loop`` (``penalty_inner_loop`` with a traced step count) over
``max_inner_steps + 1`` prepared draws. A growing B_t keeps static shapes: every draw gathers
``batch_size`` (the cap) i.i.d. uniform samples, and the round's functions become the masked
mean of one-sample losses over the first B_t of them (per-sample gradients by ``vmap``), which
are B_t i.i.d. samples: the gradient is exactly the B_t-sample minibatch gradient when a
level's loss is the batch mean of per-sample losses (every problem of the library), and the
counts say B_t samples per draw.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from bilevel.core.schedules import round_step_size
from bilevel.solvers.online.f2obo import F2OBO, RoundSchedule
from bilevel.solvers.registry import register

__all__ = ["SF2OBO", "masked_mean_loss"]

SCHEDULES = ("constant", "theory")
#: ``batch_schedule="auto"``: "theory" on a stream with held per-round samples, else "constant"
BATCH_SCHEDULES = (*SCHEDULES, "auto")


def masked_mean_loss(fn):
    """``fn(x, y, batch)`` as ``(x, y, (batch, weights)) -> sum_i weights_i fn(x, y, batch_i)``
    with ``batch_i`` the one-sample batch of row i (``vmap``): with weights mask / B, the mean of
    the per-sample losses of the masked rows."""

    def masked(x, y, weighted):
        batch, weights = weighted
        rows = jax.vmap(lambda row: fn(x, y, jax.tree.map(lambda a: a[None], row)))(batch)
        return jnp.sum(weights * rows)

    return masked


class _GrowingBatches:
    """Draws of cap-size batches whose first ``size`` rows count (weights 1/size, 0 after)."""

    def __init__(self, mb, size, cap: int):
        self.mb = mb
        rows = jnp.arange(cap)
        self.weights = jnp.where(rows < size, 1.0, 0.0) / size

    def outer(self, i):
        return None if self.mb.outer_data is None else (self.mb.outer(i), self.weights)

    def inner(self, i):
        return None if self.mb.inner_data is None else (self.mb.inner(i), self.weights)


@register("sf2obo")
@dataclasses.dataclass(frozen=True)
class SF2OBO(F2OBO):
    r"""SF2OBO (Jia & Chen, arXiv:2602.11665, Algorithm 3): F2OBO on minibatches, with
    Theorem 5.1's schedules available.

    Defaults are Corollary 5.2's configuration, Theorem 5.1's schedules at tau = b = 1/6,
    a = 0: K_t = ceil(4 kappa_g log t) (``inner_schedule="theory"``), B_t = Bhat_t =
    ceil(t^(2/3)) where the stream holds per-round samples (``batch_schedule="auto"``; whole
    rounds on a deterministic stream), alpha_t = lr_inner = 1/L_g (``"auto"``), beta_t =
    lr_lagrangian / (lam1 t^b) = 1/(2 lam1 L_g t^b), lr_outer ``"auto"`` (as F2OBO):
    E[BLReg(T)] = O(T^(2/3) (1 + sigma^2) + V_T + H_{2,T}). Experiment 2's configuration (K = 5,
    lam1 = 5, tau = 1, alpha = 0.1, gamma = 0.001, batch 256) is ``inner_schedule="constant",
    batch_schedule="constant", b=None, inner_steps=5, tau=1.0, lr_inner=0.1,
    lr_outer=0.001, batch_size=256``: F2OBO exactly (same draws, same counts).

    Draws of round t (Algorithm 3; the second key of ``split(state.key)``): ``max_inner_steps
    + 1`` draws per level are prepared with the theory K_t (K_t + 1 with the constant one), each
    of ``batch_size`` rows of which the first B_t count (all of them with the constant B)::

        inner(k), k < K_t   zeta_t^k: grad_y g at z AND grad_y g at y, inner step k (line 7)
        outer(k), k < K_t   xi_t^k: grad_y f at y, inner step k (line 7)
        outer(K_t)          xi_t: grad_x f of ghat (line 10)
        inner(K_t)          zeta_t: both grad_x g terms of ghat (line 10)

    Args:
        lr_outer, lr_inner, lr_lagrangian, batch_size, lam1: as F2OBO
            (:class:`~bilevel.solvers.online.f2obo.F2OBO`); ``lr_inner`` is alpha_1 and
            ``lr_lagrangian`` (default ``lr_inner / 2``) is beta_1 lam1.
        tau: lam_t = lam1 t^tau, default 1/6 (Corollary 5.2; Theorem 5.1 asks tau < 1/2).
        inner_steps: K with ``inner_schedule="constant"``; default ``"auto"``, F2OBO's
            Theorem 3.1 rule for the horizon.
        a: alpha_t = lr_inner t^-a (Theorem 5.1: alpha_t = 1/(L_g t^a)); default 0.
        b: beta_t = lr_lagrangian / (lam1 t^b) (Theorem 5.1: 1/(2 lam1 L_g t^b)); default 1/6
            (Corollary 5.2); ``None`` = F2OBO's lr_lagrangian / lam_t (the same at b = tau).
        inner_schedule: ``"theory"`` (default): K_t = ceil(4 kappa_g max(t^(b - tau), t^a)
            log t) clamped to [1, max_inner_steps] (it is 0 at t = 1, since log 1 = 0), or
            ``"constant"`` (K_t = inner_steps).
        batch_schedule: ``"auto"`` (default): ``"theory"`` where the stream holds per-round
            samples (held data, not a sampler), else ``"constant"``; ``"theory"``: B_t =
            Bhat_t = ceil(t^batch_power) samples, at most ``batch_size`` (the cap; ``None`` =
            the round's samples); ``"constant"``: every draw has batch_size samples.
        batch_power: the exponent of B_t, default 2/3 (Corollary 5.2's B_1 = B_2).
        kappa_g: L_g / mu_g of K_t; default ``None`` = estimated by ``bl.diagnose`` on round 1
            when ``inner_schedule="theory"`` (as ``lr_inner="auto"``).
        max_inner_steps: the cap on K_t (and the draws prepared per round), default 50.

    Per-round counts: ``grad_f = K_t + 1``, ``grad_g = 2 K_t + 2``; samples (K_t + 1) B_t per
    level (B_t = batch_size with the constant schedule).
    """

    tau: float = 1 / 6
    a: float = 0.0
    b: float | None = 1 / 6
    inner_schedule: str = "theory"
    batch_schedule: str = "auto"
    batch_power: float = 2 / 3
    kappa_g: float | None = None
    max_inner_steps: int = 50

    name: ClassVar[str] = "sf2obo"
    paper: ClassVar[str] = (
        "Jia, Chen. Fully First-Order Algorithms for Online Non-Convex Bilevel Optimization. "
        "arXiv:2602.11665, 2026, Algorithm 3."
    )
    #: constant per-round counts by default; the theory schedules make K_t and B_t grow
    adaptive: ClassVar[bool] = False

    @classmethod
    def corollary_5_2(cls, **overrides) -> SF2OBO:
        """Corollary 5.2's configuration: tau = b = 1/6, a = 0, K_t = ceil(4 kappa_g log t),
        B_t = Bhat_t = ceil(t^(2/3)) (``overrides`` change any field)."""
        settings = dict(tau=1 / 6, a=0.0, b=1 / 6, inner_schedule="theory", batch_schedule="theory")
        return cls(**{**settings, **overrides})

    def validate(self) -> None:
        super().validate()
        self._check_choices(inner_schedule=SCHEDULES, batch_schedule=BATCH_SCHEDULES)
        for name in ("a", "batch_power"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"SF2OBO({name}={getattr(self, name)!r}) must be >= 0.")
        if self.b is not None and not self.b >= 0:
            raise ValueError(f"SF2OBO(b={self.b!r}) must be >= 0 or None (beta_t ~ 1/lam_t).")
        if self.kappa_g is not None and not self.kappa_g >= 1:
            raise ValueError(
                f"SF2OBO(kappa_g={self.kappa_g!r}) must be >= 1 (L_g / mu_g), or None to "
                "estimate it."
            )
        steps = self.max_inner_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"SF2OBO(max_inner_steps={steps!r}) must be a positive int.")

    def uses_inner_steps(self) -> bool:
        return self.inner_schedule == "constant"

    def unresolved(self) -> list[str]:
        """F2OBO's, ``kappa_g`` when the theory K_t needs it, and not ``inner_steps`` when the
        theory K_t replaces it."""
        theory = self.inner_schedule == "theory"
        names = [n for n in super().unresolved() if not (theory and n == "inner_steps")]
        return names + (["kappa_g"] if theory and self.kappa_g is None else [])

    def resolve_settings(self, problem) -> SF2OBO:
        """F2OBO's settings (``lr_inner``, ``inner_steps``), kappa_g = L_g / mu_g from
        ``bl.diagnose`` on round 1 when the theory K_t needs it, and ``batch_schedule="auto"``
        (``"theory"`` on held per-round samples, else ``"constant"``)."""
        solver = super().resolve_settings(problem)
        if solver.batch_schedule == "auto":
            held = not _no_held_data(problem)
            solver = dataclasses.replace(solver, batch_schedule="theory" if held else "constant")
        if solver.inner_schedule == "theory" and solver.kappa_g is None:
            kappa_g = self.inner_condition(
                problem,
                "SF2OBO(inner_schedule='theory') needs kappa_g = L_g / mu_g",
                "give kappa_g",
            )
            solver = dataclasses.replace(solver, kappa_g=kappa_g)
        return solver

    def check_problem(self, problem) -> None:
        super().check_problem(problem)
        if self.batch_schedule == "theory":
            if _no_held_data(problem):
                raise ValueError(
                    f"SF2OBO(batch_schedule='theory') draws B_t = ceil(t^p) of round t's held "
                    f"samples, but {problem.name} has no held data (deterministic or a "
                    "sampler); use batch_schedule='constant'."
                )

    # ---- the schedules ---------------------------------------------------------------------
    def schedule(self, t) -> RoundSchedule:
        """lam_t = lam1 t^tau, alpha_t = lr_inner t^-a, beta_t = lr_lagrangian / (lam1 t^b) (or
        / lam_t with ``b=None``), gamma_t = lr_outer."""
        sched = super().schedule(t)
        alpha = round_step_size(self.lr_inner, t, self.a)
        if self.b is None:
            beta = sched.beta
        else:
            lagrangian = self.lr_inner / 2 if self.lr_lagrangian is None else self.lr_lagrangian
            beta = round_step_size(lagrangian, t, self.b) / self.lam1
        return sched._replace(alpha=alpha, beta=beta)

    def inner_steps_at(self, t) -> jax.Array:
        """Theorem 5.1's K_t = ceil(4 kappa_g max(t^(b - tau), t^a) log t), clamped to
        [1, max_inner_steps] (int32; b = tau when ``b`` is None)."""
        tf = jnp.asarray(t, jnp.result_type(float))
        b = self.tau if self.b is None else self.b
        k = jnp.ceil(4 * self.kappa_g * jnp.maximum(tf ** (b - self.tau), tf**self.a) * jnp.log(tf))
        return jnp.clip(k, 1, self.max_inner_steps).astype(jnp.int32)

    def batch_size_at(self, t, cap: int) -> jax.Array:
        """B_t = Bhat_t = ceil(t^batch_power), clamped to [1, cap] (int32)."""
        tf = jnp.asarray(t, jnp.result_type(float))
        return jnp.clip(jnp.ceil(tf**self.batch_power), 1, cap).astype(jnp.int32)

    def round_plan(self, t) -> tuple[Any, int]:
        if self.inner_schedule == "theory":
            return self.inner_steps_at(t), self.max_inner_steps + 1
        return super().round_plan(t)

    def round_data(self, problem, t, key: jax.Array, draws: int):
        if self.batch_schedule == "constant":
            return super().round_data(problem, t, key, draws)
        cap = self.batch_size
        if cap is None:
            cap = max(n for n in (problem.n_outer, problem.n_inner) if n is not None)
        f, g = problem.at_round(t)
        mb = problem.minibatches(t, key, cap, outer=draws, inner=draws)
        size = self.batch_size_at(t, cap)
        batches = _GrowingBatches(mb, size, cap)
        per_outer = 0 if mb.outer_data is None else size
        per_inner = 0 if mb.inner_data is None else size
        f = f if mb.outer_data is None else masked_mean_loss(f)
        g = g if mb.inner_data is None else masked_mean_loss(g)
        return f, g, batches, per_outer, per_inner


def _no_held_data(problem) -> bool:
    """Whether ``problem`` has no held per-round samples (deterministic, or a sampler)."""
    from bilevel.core.streams import is_sampler

    data = [problem.outer_data, problem.inner_data]
    return all(d is None for d in data) or any(is_sampler(d) for d in data)

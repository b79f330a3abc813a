r"""SBFW: the stochastic bilevel Frank-Wolfe method, as the IBCG paper runs it (baseline).

Akhtar, Bedi, Thomdapu, Rajawat. "Projection-Free Stochastic Bi-Level Optimization." IEEE
Trans. Signal Process. 70, 2022 [ABTR22]. Implemented as Abolfazli, Jiang, Mokhtari,
Yazdandoost Hamedani write it for their comparison ("An Inexact Conditional Gradient Method
for Constrained Bilevel Optimization", preprint, arXiv:2306.02429, App. G.1).

A projection-free single-loop method like IBCG, but with decaying steps, a STORM-like momentum
on the hypergradient estimate, and a randomised Neumann estimate of the Hessian inverse whose
length grows with the iteration count (O(k) Hessian-vector products at step k).

The library's defaults are not the paper's: with App. G.1's steps and its random Neumann
product, SBFW's Frank-Wolfe gap stalls at 0.3-0.7 of its start on problems nobody tuned it
for (docs/step_sizes.md), so a plain ``bl.solvers.make("sbfw")`` takes a y step of 1/L_g, the
mean of that random product (a deterministic Neumann series) and a smaller first FW step.
:data:`PAPER` holds App. G.1's settings, which the reproductions run.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from bilevel.core import oracles
from bilevel.core.oracles import Counts
from bilevel.core.problem import BilevelProblem
from bilevel.core.sampling import Minibatches
from bilevel.core.schedules import step_size
from bilevel.core.tree import tree_axpy, tree_norm, tree_sub, tree_zeros_like
from bilevel.solvers.base import OuterState, _is_auto
from bilevel.solvers.common import implicit_hypergradient, inner_sgd
from bilevel.solvers.frank_wolfe.base import (
    FrankWolfeSolver,
    dense_adjoint,
    frank_wolfe_step,
    merge_counts,
)
from bilevel.solvers.hypergradient.adjoint import Neumann, RandomNeumann
from bilevel.solvers.registry import register

__all__ = ["SBFW", "SBFWState", "sbfw_weights", "TUNED", "PAPER"]

PyTree = Any

#: inner draws of one step: the y step, the Hessian of M (all l products), the cross product
STEP_DRAW, HESSIAN_DRAW, CROSS_DRAW = 0, 1, 2
#: the "tuned SBFW" of Fig. 4 (App. G.2): delta_k x 5 and eta_k x 0.1
TUNED = {"inner": 5.0, "outer": 0.1}
VARIANTS = ("theory", "tuned")
#: eta_k = 2/(k+1)^{3/4} at the first update (paper k = 1): the paper's ``lr_outer``
ETA_1 = 2.0 / 2.0**0.75
#: NOT IN PAPER: the library's default eta_1 (eta_k = 0.3 (2/(k+1))^{3/4}); measured on the
#: problems of ``benchmarks/defaults.py``, 0.2-0.5 all reach a tenth of the start gap
LR_OUTER = 0.3
#: the settings of App. G.1, which the reproductions run: eta_1 = 2/2^{3/4}, delta_1 = a_0,
#: M by the random Neumann product with l ~ U{1..k}
PAPER = {
    "lr_outer": ETA_1,
    "lr_inner": "a0",
    "inner_decay": 0.5,
    "hessian_inverse": "neumann",
    "neumann_start": 1,
}
#: the ways to apply M's Hessian inverse (``hessian_inverse``)
HESSIAN_INVERSES = ("series", "neumann", "exact")
#: the first length of M's random Neumann product: 1 (the IBCG paper's App. G.1, the default)
#: or 0 (Ghadimi & Wang's estimator, as TTSA's)
NEUMANN_STARTS = (1, 0)


class SBFWState(NamedTuple):
    """The state after paper iteration k (``k`` below counts the steps done)."""

    x: PyTree  # x_{k+1}: the next upper iterate (in X)
    y: PyTree  # y_k: tracks y*(x_k), one gradient step behind x
    x_prev: PyTree  # x_k: where the next step's y update and old h are evaluated
    d: PyTree  # d_k: the momentum estimate of grad l(x_k) (d_0 = 0, never used: rho_1 = 1)
    k: jax.Array  # steps done (the paper's k - 1 at the start of its iteration k)
    key: jax.Array  # PRNG key
    counts: Counts  # samples and oracle calls so far
    outer_state: OuterState  # its direction_norm is ||d_k||
    fw_gap_estimate: jax.Array  # <d_k, x_k - s_k>: the FW gap of the momentum estimate


def sbfw_weights(
    k, lr_outer=ETA_1, lr_inner=1.0, inner_decay=0.5
) -> tuple[jax.Array, jax.Array, jax.Array]:
    r"""``(rho_k, eta_k, delta_k)`` at paper iteration ``k + 1`` (``k`` = steps done).

    App. G.1: ``rho_k = 2/k^{1/2}``, ``eta_k = 2/(k+1)^{3/4}``, ``delta_k = a_0/k^{1/2}``
    from k = 1 (delta_0 is undefined). ``rho_k >= 1`` for k <= 4 and ``eta_k > 1`` for
    k in {0, 1}: both are CLIPPED to [0, 1] (the paper is silent; a step above 1 would leave
    X, a weight above 1 flip the momentum's sign). With
    ``rho_1 = 1`` the momentum starts at ``d_1 = h(x_1, y_1)`` whatever d_0 is.

    Args:
        k: steps done (traced int); the paper's iteration is k + 1.
        lr_outer: eta at the first update, ``eta_1`` (paper: 2/2^{3/4}), or a schedule of k.
        lr_inner: delta at the first update, ``delta_1 = a_0``, or a schedule of k.
        inner_decay: the power a of ``delta_k = delta_1/k^a`` (paper: 1/2; 0: constant).
    """
    rho = jnp.minimum(step_size(2.0, k, 0.5, 1.0), 1.0)  # 2/(k+1)^{1/2}
    eta = jnp.clip(step_size(lr_outer, k, 0.75, 2.0), 0.0, 1.0)  # eta_1 (2/(k+2))^{3/4}
    delta = step_size(lr_inner, k, inner_decay, 1.0)  # a_0 / (k+1)^{1/2} in the paper
    return rho, eta, delta


@register("sbfw")
@dataclasses.dataclass(frozen=True)
class SBFW(FrankWolfeSolver):
    r"""SBFW (Akhtar et al., IEEE TSP 2022) as written in App. G.1 of the IBCG paper; per
    iteration k = 1, 2, ..., from ``x_1 = x_0`` (the given start), ``y_0`` and ``d_0 = 0``::

        y_k     = y_{k-1} - delta_k grad_y g(x_{k-1}, y_{k-1})
        d_k     = (1 - rho_k)(d_{k-1} - h(x_{k-1}, y_{k-1})) + h(x_k, y_k)     (STORM-like)
        s_k     = argmin_{s in X} <s, d_k>
        x_{k+1} = (1 - eta_k) x_k + eta_k s_k
        h(x, y) = grad_x f(x, y) - M(x, y) grad_y f(x, y)
        M(x, y) = d2g/dxdy (x, y) [(k/L_g) prod_{i=1}^{l} (I - d2g/dy2 (x, y) / L_g)],  l ~ U{1..k}

    with the steps of :func:`sbfw_weights` (clipped). The y step is taken at
    ``(x_{k-1}, y_{k-1})``, literally as App. G.1 writes it (its index bookkeeping leaves the
    other reading, x_k, open). Both h evaluations of a step use the SAME
    sample: the same l and, with minibatches, the same outer draw, Hessian draw and cross
    draw -- the STORM estimator of [ABTR22] differences one sample at two points. With
    minibatches one inner draw serves all l Hessian products of M (Ghadimi & Wang's estimator
    draws one per factor; with l up to k that would make the samples per step grow with k).

    Draws of one step (``inner(i)``, ``outer(i)`` of the step's minibatches; third key of the
    step's split)::

        inner(0)    the y step at (x_{k-1}, y_{k-1})
        inner(1)    every Hessian product of M, in both h (the dense Hessian with "exact")
        inner(2)    the cross product of both h
        outer(0)    both partials of f, in both h
        third key   l, the same for both h (``"neumann"`` only: the series and the exact
                    inverse draw no length)

    The Neumann part of M, with ``s = neumann_start``, draws ``l ~ U{s..k-1+s}`` and has mean
    ``(1/L_g) sum_{l=s}^{k-1+s} (I - H/L_g)^l`` (H = d2g/dy2). With ``s = 1`` (the default: the
    IBCG paper's App. G.1, which the reproductions run) that is ``(I - H/L_g) S_k`` with
    ``S_k = (1/L_g) sum_{l=0}^{k-1} (I - H/L_g)^l``: the identity term is missing, and the mean
    tends to ``H^{-1} - I/L_g``, a bias that does not vanish as k grows. With ``s = 0``
    (Ghadimi & Wang's estimator, as this library's TTSA draws it) the mean is
    ``S_k = H^{-1} - (I - H/L_g)^k H^{-1}``: biased by the truncation only. Which of the two the
    original SBFW paper (Akhtar et al., arXiv:2110.11721) uses is NOT VERIFIED here: its full
    text could not be found (only abstracts); neither choice is claimed as the original's.

    The defaults are NOT the paper's (``bl.solvers.make("sbfw", **PAPER)`` runs App. G.1):
    ``eta_1 = 0.3``; ``delta_1 = 1/L_g``, constant with full batches (``delta_k = delta_1/k^{1/2}``
    only when the run draws minibatches, whose noise the decay averages out); and M's Hessian
    inverse by the deterministic series ``(1/L_g) sum_{l<N} (I - H/L_g)^l``, the mean of Ghadimi
    & Wang's random product over a fixed length N. Why, measured on the problems of
    ``benchmarks/defaults.py`` (ridge with a per-feature penalty, hyper-cleaning; 3000 steps on
    the box [-3, 3]^d; exact FW gap over its start): App. G.1's settings end at 0.29-0.73. Its
    ``a_0`` is 0.0083 on the ridge (L_g = 11), so y trails y*(x); and the random product's
    scale k/L_g reaches 270 at k = 3000, so a single draw of l is very noisy. A y step of
    1/L_g alone: 0.19 (0.86 with minibatches of 32); with the series too: 0.05-0.25 along the
    last 1000 steps of full-batch ridge (the decaying y step lags), 0.02-0.16 with minibatches;
    with the constant y step at full batch: 0.01-0.02 (a constant step with minibatches: 0.2-0.4).

    Args:
        lr_outer: eta_1, the first FW step (a float: ``eta_k = eta_1 (2/(k+1))^{3/4}``; the
            paper's ``2/(k+1)^{3/4}`` is ``ETA_1`` = 2/2^{3/4} = 1.19, clipped to 1; the
            default is 0.3), or a schedule of the steps done.
        lr_inner: delta_1 (``delta_k = delta_1/k^a``). ``"auto"`` (default): ``1/L_g``;
            ``"a0"``: the paper's ``a_0 = min{2/(3 mu_g), mu_g/(2 L_g^2)}``; mu_g and L_g from
            ``bl.diagnose`` at (x0, y0).
        inner_decay: a, the power of delta_k's decay: the paper's 1/2, or 0 (a constant y
            step). ``"auto"`` (default, NOT IN PAPER): 1/2 when the run draws minibatches, 0
            with full batches.
        neumann_lr: 1/L_g of M; ``"auto"``: from ``bl.diagnose``.
        hessian_inverse: ``"series"`` (default, NOT IN PAPER: the mean of M's random product,
            a Neumann series of ``neumann_steps`` terms from l = 0, N - 1 products per h),
            ``"neumann"`` (the paper's M above, l products per h, 2l per step) or ``"exact"``
            (``M = d2g/dxdy [d2g/dy2]^{-1}`` by a dense solve: "SBFW with Hessian inverse",
            App. G.2, the green curves of Figs. 3-4).
        neumann_steps: N, the series' length (``"series"`` only; default 50, as TTSA's).
        variant: ``"theory"`` or ``"tuned"`` (Fig. 4: delta_k x 5, eta_k x 0.1, then clipped).
        max_neumann: NOT IN PAPER, ``"neumann"`` only. None (default, the paper): M uses k
            in place of the cap, so step k costs up to 2k Hessian-vector products; an int n
            caps the length at ``min(k, n)`` (l ~ U{s..min(k, n)-1+s}, scale min(k, n)/L_g) to
            bound the cost.
        neumann_start: s, the smallest length of M's random product (``"neumann"`` only): 1
            (default, the IBCG paper's App. G.1: l ~ U{1..k}, no identity term) or 0 (Ghadimi
            & Wang: l ~ U{0..k-1}, the identity term kept; with l = 0 a step makes no Hessian
            product).
        batch_size: minibatch size of every oracle (None = full data).
    """

    lr_outer: Any = LR_OUTER
    lr_inner: Any = "auto"
    inner_decay: Any = "auto"
    neumann_lr: Any = "auto"
    hessian_inverse: str = "series"
    neumann_steps: int = 50
    variant: str = "theory"
    max_neumann: int | None = None
    neumann_start: int = 1
    batch_size: int | None = None

    name: ClassVar[str] = "sbfw"
    auto_in_step: ClassVar[tuple[str, ...]] = ("inner_decay",)  # from the problem's noise, static
    lr_inner_rules: ClassVar[tuple[str, ...]] = ("auto", "a0")
    paper: ClassVar[str] = (
        "Akhtar, Bedi, Thomdapu, Rajawat. Projection-Free Stochastic Bi-Level Optimization. "
        "IEEE Trans. Signal Process. 70, 2022; as run in the IBCG paper, App. G.1."
    )

    def validate(self) -> None:
        cls = type(self).__name__
        self._check_choices(hessian_inverse=HESSIAN_INVERSES, variant=VARIANTS)
        n = self.neumann_steps
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{cls}(neumann_steps=...) must be an int >= 1, got {n!r}.")
        decay = self.inner_decay
        if not _is_auto(decay) and (
            isinstance(decay, bool) or not isinstance(decay, int | float) or not 0 <= decay <= 1
        ):
            raise ValueError(
                f"{cls}(inner_decay={decay!r}) must be a power in [0, 1] (paper: 0.5) or 'auto'."
            )
        start = self.neumann_start
        if isinstance(start, bool) or not isinstance(start, int) or start not in NEUMANN_STARTS:
            raise ValueError(
                f"{cls}(neumann_start={start!r}) is unknown; use one of {NEUMANN_STARTS} (1: l ~ "
                "U{1..k} as in the IBCG paper's App. G.1; 0: l ~ U{0..k-1}, Ghadimi & Wang)."
            )
        cap = self.max_neumann
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValueError(f"{cls}(max_neumann=...) must be None or an int >= 1, got {cap!r}.")
        lr = self.neumann_lr
        if not _is_auto(lr) and (
            isinstance(lr, bool) or not isinstance(lr, int | float) or lr <= 0
        ):
            raise ValueError(f"{cls}(neumann_lr=...) must be 1/L_g > 0 or 'auto', got {lr!r}.")
        self._check_plain_steps()

    def unresolved(self) -> list[str]:
        """As :meth:`Solver.unresolved`, with the paper's ``lr_inner="a0"`` too."""
        return super().unresolved() + (["lr_inner"] if self.lr_inner == "a0" else [])

    def resolve(self, problem: BilevelProblem) -> SBFW:
        """Fill ``"auto"`` (1/L_g) and ``"a0"``: from mu_g and L_g of ``bl.diagnose`` at
        (x0, y0). An ``"auto"`` ``inner_decay`` stays: the step reads it off the problem."""
        if not (isinstance(self.lr_inner, str) or _is_auto(self.neumann_lr)):
            return self
        from bilevel.analysis.diagnose import strong_convexity

        mu_g, L_g = strong_convexity(
            problem, "SBFW's 'auto' steps need mu_g and L_g", "give lr_inner and neumann_lr"
        )
        changes = {}
        # the paper's a_0 is a constant of g (the full data's); a step on minibatches is stable
        # below 1 / their curvature (Solver.curvature_batch)
        from bilevel.analysis.diagnose import inner_smoothness

        L_step = inner_smoothness(problem, self.curvature_batch(problem))
        if self.lr_inner == "a0":
            changes["lr_inner"] = min(2.0 / (3.0 * mu_g), mu_g / (2.0 * L_g**2))
        elif _is_auto(self.lr_inner):
            changes["lr_inner"] = 1.0 / L_step
        if _is_auto(self.neumann_lr):
            changes["neumann_lr"] = 1.0 / L_step  # unused by the exact variant
        return dataclasses.replace(self, **changes)

    def init(self, problem: BilevelProblem, key: jax.Array) -> SBFWState:
        x0 = problem.x0
        zero = jnp.zeros_like(tree_norm(x0))
        d0 = tree_zeros_like(x0)
        return SBFWState(
            x0, problem.y0, x0, d0, jnp.zeros((), jnp.int32), key, Counts.zeros(),
            self.outer_init(x0), zero,
        )  # fmt: skip

    def _h(self, problem: BilevelProblem, x, y, mb: Minibatches, k, key):
        """``(h(x, y), counts)`` on the step's draws; ``key`` fixes l, ``k`` = paper's k."""
        grad_x_f, grad_y_f = oracles.grads(problem.outer, x, y, mb.outer(0))
        if self.hessian_inverse == "exact":
            v, counts = dense_adjoint(problem, x, y, grad_y_f, mb.inner(HESSIAN_DRAW)), {"dense": 1}
        else:
            hessian = functools.partial(oracles.hvp_yy, problem.inner, x, y, mb.inner(HESSIAN_DRAW))
            v, products = self._neumann(k).solve(lambda j: hessian, grad_y_f, key)
            counts = {"hvp": products}
        return implicit_hypergradient(problem, x, y, v, grad_x_f, mb.inner(CROSS_DRAW)), counts

    def inner_power(self, problem: BilevelProblem) -> float:
        """``inner_decay``, with ``"auto"`` read off the run: 1/2 (the paper's) when it draws
        minibatches, 0 (a constant y step) with full batches."""
        if not _is_auto(self.inner_decay):
            return self.inner_decay
        return 0.5 if self.draws_minibatches(problem) else 0.0

    def _neumann(self, k) -> Neumann:
        """M's Hessian inverse at paper iteration ``k``: the series, or the random product."""
        if self.hessian_inverse == "series":
            return Neumann(lr=self.neumann_lr, num_terms=self.neumann_steps)
        terms = k if self.max_neumann is None else jnp.minimum(k, self.max_neumann)
        return RandomNeumann(lr=self.neumann_lr, num_terms=terms, first=self.neumann_start)

    def step(self, problem: BilevelProblem, state: SBFWState) -> SBFWState:
        key, batch_key, neumann_key = jax.random.split(state.key, 3)
        mb = self.minibatches(problem, batch_key, outer=1, inner=3)
        scale = TUNED if self.variant == "tuned" else {"inner": 1.0, "outer": 1.0}
        rho, eta, delta = sbfw_weights(
            state.k,
            _scaled(self.lr_outer, scale["outer"]),
            _scaled(self.lr_inner, scale["inner"]),
            self.inner_power(problem),
        )
        k = state.k + 1  # the paper's iteration index, from 1
        x_prev, x, y_prev = state.x_prev, state.x, state.y
        y = inner_sgd(problem, mb, x_prev, y_prev, delta, 1, first=STEP_DRAW)
        h_old, old_counts = self._h(problem, x_prev, y_prev, mb, k, neumann_key)
        h_new, new_counts = self._h(problem, x, y, mb, k, neumann_key)  # same sample
        d = tree_axpy(1.0 - rho, tree_sub(state.d, h_old), h_new)
        x_next, gap = frank_wolfe_step(problem, x, d, eta)
        counts = state.counts.add(
            samples_outer=mb.samples_outer,
            samples_inner=mb.samples_inner,
            grad_g=1,
            grad_f=2,  # both partials of f, fused, at the old and the new point
            cross=2,
            **merge_counts(old_counts, new_counts),
        )
        outer_state = OuterState(state.outer_state.opt, tree_norm(d))
        return SBFWState(x_next, y, x, d, state.k + 1, key, counts, outer_state, gap)


def _scaled(value, factor: float):
    """``factor * value`` for a float step or a schedule (Fig. 4's tuning multiplies the rule)."""
    if factor == 1.0:
        return value
    if callable(value):
        return lambda k: factor * value(k)
    return factor * value

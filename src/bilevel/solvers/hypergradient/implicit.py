r"""The implicit-gradient family: stocBiO, AID-CG, AID-FP, TTSA and BSA as presets of one estimator.

By the implicit function theorem (Ghadimi & Wang 2018, eq. (2.7); Ji, Yang & Liang 2021, eq. (3))

.. math::

    \nabla F(x) = \nabla_x f(x, y^*) - \nabla^2_{xy} g(x, y^*)\,
    [\nabla^2_{yy} g(x, y^*)]^{-1} \nabla_y f(x, y^*).

Every method of the family runs, per outer iteration k (:meth:`ImplicitSolver.step`):

1. inner steps: ``y <- T (S)GD steps on g(x_k, .)`` from y_k (warm start) or y_0, step beta_k,
   a fresh minibatch per step (:func:`~bilevel.solvers.common.inner_sgd`);
2. adjoint: ``v ~ [d^2 g/dy^2 (x_k, y)]^{-1} grad_y f(x_k, y; D_F)`` by an interchangeable
   :class:`Adjoint` strategy (:class:`ConjugateGradient`, :class:`FixedPoint`,
   :class:`Neumann`, :class:`RandomNeumann`) built from minibatch Hessian-vector products;
3. implicit hypergradient ``h = grad_x f(x_k, y; D_F) - d^2 g/dx dy (x_k, y; D_C) v``;
4. outer step ``x_{k+1} = Proj_X(x_k - alpha_k P(h))`` (:meth:`Solver.outer_step`).

A preset declares only what differs: its fields, the strategy (:meth:`ImplicitSolver.adjoint`),
and class-level switches for the papers' schedules -- ``two_timescale`` (TTSA, Hong et al.
2020; SOBA, Dagreou et al. 2022: one y step, every direction evaluated at the step's start
(x_k, y_k[, v_k]), all updates applied together), ``hessian_shares_step`` (SOBA: the Hessian
product uses the y step's inner sample) and ``keyed_adjoint`` (TTSA, BSA: the step splits a key
for the randomised Hessian inverse, whichever estimator runs). A strategy that keeps its own
iterate across steps (:class:`LinearSystemStep`, SOBA's "one SGD step on the linear system")
is warm-started from the v carried in an :class:`AdjointState`.

Minibatches: one ``self.minibatches`` call per step, with the inner draws laid out by
:class:`Draws` (T steps, then the adjoint's Hessian samples, then the cross term's) and one outer
draw D_F for both partials of f. The step's :class:`~bilevel.core.oracles.Counts` follow from the
layout and from the products the strategy reports (``grad_g = T``, ``hvp`` = products,
``cross = 1``, ``grad_f = 1`` fused), so no preset writes its own sums.

References:
    Ghadimi, Wang. "Approximation Methods for Bilevel Programming." arXiv:1802.02246, 2018.
    Ji, Yang, Liang. "Bilevel Optimization: Convergence Analysis and Enhanced Design." ICML 2021.
    Grazzi, Franceschi, Pontil, Salzo. "On the Iteration Complexity of Hypergradient
    Computation." ICML 2020.
    Hong, Wai, Wang, Yang. "A Two-Timescale Stochastic Algorithm Framework for Bilevel
    Optimization." SIAM J. Optim. 2023 (arXiv:2007.05170).
    Dagreou, Ablin, Vaiter, Moreau. "A framework for bilevel optimization that enables stochastic
    and global variance reduction algorithms." NeurIPS 2022 (arXiv:2201.13409).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from bilevel.core import linsolve, oracles
from bilevel.core.problem import BilevelProblem
from bilevel.core.sampling import Minibatches, batch_count
from bilevel.core.schedules import step_size
from bilevel.core.tree import tree_axpy, tree_sub, tree_zeros_like
from bilevel.solvers.base import IterateState, OuterState, Solver, _is_auto
from bilevel.solvers.common import implicit_hypergradient, inner_sgd

PyTree = Any
#: ``j -> (v -> H_j v)``: the Hessian-vector product with the minibatch Hessian of sample j
HessianSamples = Callable[[Any], Callable[[PyTree], PyTree]]

__all__ = [
    "Adjoint",
    "ConjugateGradient",
    "FixedPoint",
    "Neumann",
    "RandomNeumann",
    "LinearSystemStep",
    "AdjointState",
    "Draws",
    "Estimate",
    "ImplicitSolver",
    "StochasticApproximation",
]


# ---- adjoint strategies ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Adjoint(abc.ABC):
    """A strategy for ``v ~ H^{-1} rhs`` from minibatch Hessian-vector products (C6).

    ``draws`` Hessian samples are declared per step; ``solve`` returns ``(v, products)`` with
    ``products`` the Hessian-vector products it evaluated (a traced int for random strategies).
    ``v0`` is the previous step's v, given to every strategy; only those that carry an iterate
    (``carries_iterate``) start from it, the others solve from scratch and ignore it.
    """

    #: whether v persists across steps (then the solver's state is an :class:`AdjointState`)
    carries_iterate: ClassVar[bool] = False

    @property
    @abc.abstractmethod
    def draws(self) -> int:
        """Hessian samples (inner minibatches) the strategy declares per step."""

    @abc.abstractmethod
    def solve(self, hessian: HessianSamples, rhs: PyTree, key, v0=None) -> tuple[PyTree, Any]:
        """``(v, products)``; sample j's product is ``hessian(j)(v)``; ``v0`` the warm start."""

    def at_inner_step(self, beta) -> Adjoint:
        """The strategy for a step whose inner step size is ``beta`` (itself, unless its own
        step size is tied to the inner one, as in SOBA)."""
        del beta
        return self

    def draws_used(self, products) -> Any:
        """Declared samples actually used (all, unless a random strategy stops early)."""
        del products
        return self.draws


@dataclasses.dataclass(frozen=True)
class _Krylov(Adjoint):
    """K iterations of a linear solver on ``H v = rhs`` from v = 0, one product each: on one
    shared Hessian sample (a consistent system), or, with ``fresh``, a new sample per product
    (hypertorch's ``stochastic=True``, spec pzobo.md 3.5, "Stochastic AID-FP / AID-CG")."""

    num_iters: int
    fresh: bool = False

    @property
    def draws(self) -> int:
        return self.num_iters if self.fresh else 1

    def solve(self, hessian, rhs, key, v0=None):
        del key, v0  # from v = 0 every step
        if self.fresh:
            return self.run(lambda v, i: hessian(i)(v), rhs, indexed=True), self.num_iters
        return self.run(hessian(0), rhs, indexed=False), self.num_iters

    @abc.abstractmethod
    def run(self, matvec, rhs, *, indexed: bool) -> PyTree:
        """The solver's K iterations."""


@dataclasses.dataclass(frozen=True)
class ConjugateGradient(_Krylov):
    """K conjugate-gradient iterations (Hestenes & Stiefel 1952; AID-CG of Grazzi et al., ICML
    2020, and Rajeswaran et al., NeurIPS 2019): ``linsolve.cg``."""

    def run(self, matvec, rhs, *, indexed: bool) -> PyTree:
        return linsolve.cg(matvec, rhs, num_iters=self.num_iters, indexed=indexed)


@dataclasses.dataclass(frozen=True)
class FixedPoint(_Krylov):
    """K fixed-point iterations ``v <- v - lr (H v - rhs)`` (gradient descent on the quadratic;
    AID-FP of Grazzi et al., ICML 2020): ``linsolve.fixed_point``."""

    lr: Any = None  # eta < 2 / L_g (a float leaf of the solver, traced under jit)

    def run(self, matvec, rhs, *, indexed: bool) -> PyTree:
        return linsolve.fixed_point(
            matvec, rhs, lr=self.lr, num_iters=self.num_iters, indexed=indexed
        )


@dataclasses.dataclass(frozen=True)
class Neumann(Adjoint):
    r"""The truncated Neumann series with an independent Hessian per factor (Ji, Yang & Liang
    2021, Alg. 3): ``v = eta sum_{q<N} prod_{j=1}^{q} (I - eta H_j) rhs``, N - 1 products.

    ``active_terms`` (a traced int <= N, or None = N) runs a shorter series this step: the
    length that grows with the iteration count, ``t_max(k) = (L_g/mu_g) log(k + 1)``, of TTSA as
    run in the IBCG paper (App. G.1); N then only bounds the Hessian samples declared.
    """

    lr: Any
    num_terms: Any
    active_terms: Any = None

    @property
    def draws(self) -> int:
        return self.num_terms - 1

    @property
    def terms(self) -> Any:
        """The series length this step (``active_terms``, or N)."""
        return self.num_terms if self.active_terms is None else self.active_terms

    def solve(self, hessian, rhs, key, v0=None):
        del key, v0

        def factor(v, q):  # q = 1..N-1: factor q uses Hessian sample q - 1
            return hessian(q - 1)(v)

        v = linsolve.neumann(factor, rhs, lr=self.lr, num_terms=self.terms, indexed=True)
        return v, self.terms - 1

    def draws_used(self, products):
        # a shorter series leaves the declared samples past its products unused
        return self.draws if self.active_terms is None else products


@dataclasses.dataclass(frozen=True)
class RandomNeumann(Neumann):
    r"""The randomised Neumann product (Ghadimi & Wang 2018, Alg. 3; Hong et al. 2020, TTSA):
    ``v = N eta prod_{j=1}^{p} (I - eta H_j) rhs`` with ``p ~ U{0, ..., N-1}`` from ``key``, so
    p products (traced). Same mean as :class:`Neumann`.

    ``first = 1`` draws ``p ~ U{1, ..., N}`` instead: SBFW's estimate ``M`` as the IBCG paper
    writes it (App. G.1, ``l in {1, ..., k}``); N (``num_terms``) may be traced there.
    """

    first: int = 0

    def solve(self, hessian, rhs, key, v0=None):
        del v0
        n = self.terms
        p = jax.random.randint(key, (), self.first, n + self.first)

        def factor(j, v):  # j = 0..p-1
            return tree_axpy(-self.lr, hessian(j)(v), v)

        v = jax.lax.fori_loop(0, p, factor, rhs)
        return jax.tree.map(lambda leaf: n * self.lr * leaf, v), p

    def draws_used(self, products):
        return products


@dataclasses.dataclass(frozen=True)
class LinearSystemStep(Adjoint):
    r"""One stochastic gradient step on the linear system ``H v = rhs``, warm-started from the
    previous step's v (SOBA, Dagreou et al., NeurIPS 2022, Sec. 2: the direction
    ``D_v = H v - rhs`` is the gradient of ``1/2 v'Hv - rhs'v``)::

        v_{k+1} = v_k - lr (H_i v_k - rhs)

    One Hessian sample, one product. ``lr=None`` (SOBA) ties the step to the inner step size
    rho_k of the step (the paper moves y and v with the same rho_t).
    """

    lr: Any = None

    carries_iterate: ClassVar[bool] = True

    @property
    def draws(self) -> int:
        return 1

    def at_inner_step(self, beta) -> LinearSystemStep:
        return self if self.lr is not None else dataclasses.replace(self, lr=beta)

    def update(self, v, hessian_v, rhs) -> PyTree:
        """``v - lr (H v - rhs)`` given the product ``H v`` (SABA feeds SAGA estimates here)."""
        return tree_axpy(-self.lr, tree_sub(hessian_v, rhs), v)

    def solve(self, hessian, rhs, key, v0=None):
        del key
        v = tree_zeros_like(rhs) if v0 is None else v0
        return self.update(v, hessian(0)(v), rhs), 1


# ---- the estimator -----------------------------------------------------------------------------
class Draws(NamedTuple):
    """The inner minibatches of one step, in order: ``steps`` for the inner (S)GD steps, then the
    adjoint's ``hessian`` samples, then the cross term's own draw -- or, when
    ``cross_shares_step``, the cross term reuses inner draw 0 (TTSA's phi^k, STABLE eq. (7b)),
    and when ``hessian_shares_step``, Hessian sample j reuses inner draw j (SOBA's single
    sample i for the y-gradient, the Hessian and the cross term; needs hessian <= steps)."""

    steps: int
    hessian: int
    cross_shares_step: bool = False
    hessian_shares_step: bool = False

    @property
    def inner(self) -> int:
        own_hessian = 0 if self.hessian_shares_step else self.hessian
        return self.steps + own_hessian + (0 if self.cross_shares_step else 1)

    def hessian_draw(self, j):
        return j if self.hessian_shares_step else self.steps + j

    @property
    def cross_draw(self) -> int:
        return 0 if self.cross_shares_step else self.steps + self.hessian


class AdjointState(NamedTuple):
    """The state of an implicit method whose adjoint strategy carries its iterate v (SOBA)."""

    x: PyTree  # upper iterate x_k
    y: PyTree  # inner iterate (the method's estimate of y*(x_k))
    v: PyTree  # adjoint iterate, estimate of [d2g/dy2]^{-1} grad_y f at (x_k, y_k)
    k: jax.Array  # iteration count
    key: jax.Array  # PRNG key
    counts: oracles.Counts  # samples and oracle calls so far
    outer_state: OuterState  # the outer optimiser's state


class Estimate(NamedTuple):
    """One step's implicit hypergradient and what it cost."""

    direction: PyTree  # grad_x f - d2g/dxdy v, at (x_k, y_eval)
    y: PyTree  # the inner iterate after the step's inner (S)GD steps
    products: Any  # Hessian-vector products of the adjoint (int, or traced)
    v: PyTree = None  # the adjoint's new iterate, for a strategy that carries one


@dataclasses.dataclass(frozen=True)
class ImplicitSolver(Solver):
    """Base of the implicit-gradient presets (see the module docstring); not registered.

    A preset has ``lr_outer``, ``lr_inner``, ``batch_size``, optionally ``inner_steps`` (T) and
    ``warm_start``, and implements :meth:`adjoint`.
    """

    #: TTSA (Hong et al. 2020; STABLE eq. (7)): one y step per iteration, and the hypergradient
    #: at (x_k, y_k) with that step's sample phi^k in the cross term, both updates applied together
    two_timescale: ClassVar[bool] = False
    #: split a third key per step for the adjoint (TTSA/BSA, whichever estimator they run)
    keyed_adjoint: ClassVar[bool] = False
    #: the adjoint's Hessian samples reuse the inner steps' draws (SOBA's single sample i)
    hessian_shares_step: ClassVar[bool] = False
    #: step-size regimes {name: (a, b)} of a preset with ``regime`` and ``k0`` fields: float
    #: steps decay as alpha_k = alpha_0 (k0/(k+k0))^a, beta_k = beta_0 (k0/(k+k0))^b; empty =
    #: floats are constant steps
    regimes: ClassVar[dict[str, tuple[float, float]]] = {}

    @abc.abstractmethod
    def adjoint(self) -> Adjoint:
        """The strategy for ``v ~ [d^2 g/dy^2]^{-1} grad_y f`` (built from the fields)."""

    def adjoint_at(self, k) -> Adjoint:
        """The strategy at iteration k (``k=None``: the declared one, :meth:`adjoint`); a preset
        whose estimate changes with k (TTSA's growing Neumann length) overrides this."""
        del k
        return self.adjoint()

    def step_sizes(self, k) -> tuple[Any, Any]:
        """``(alpha_k, beta_k)``: the outer and inner steps at iteration k
        (:func:`bilevel.core.schedules.step_size`). Without ``regimes``, floats are constant steps and
        schedules get the int32 count k; with them, floats decay as ``alpha_0 (k0/(k+k0))^a``,
        ``beta_0 (k0/(k+k0))^b`` by the regime's orders (the strongly convex regimes of Ghadimi &
        Wang 2018 and Hong et al. 2023; SOBA's Theorem 1) and schedules get k as a float (as
        they always did there)."""
        if not self.regimes:
            return step_size(self.lr_outer, k), step_size(self.lr_inner, k)
        kf = jnp.asarray(k, dtype=jnp.result_type(float))
        a, b = self.regimes[self.regime]
        return step_size(self.lr_outer, kf, a, self.k0), step_size(self.lr_inner, kf, b, self.k0)

    def _check_regime(self) -> None:
        """``regime`` is one of ``regimes`` and ``k0 > 0``."""
        self._check_choices(regime=sorted(self.regimes))
        if not (isinstance(self.k0, int | float) and self.k0 > 0):
            raise ValueError(f"{type(self).__name__}(k0=...) must be > 0, got {self.k0!r}.")

    def draws(self) -> Draws:
        """The step's inner-draw layout (declared from T and the strategy)."""
        steps = 1 if self.two_timescale else self.inner_steps
        return Draws(
            steps,
            self.adjoint().draws,
            cross_shares_step=self.two_timescale,
            hessian_shares_step=self.hessian_shares_step,
        )

    def _adjoint_lr(self, name: str) -> Any:
        """Field ``name`` (an adjoint step size), or ``lr_inner`` when it is None."""
        value = getattr(self, name)
        return self.lr_inner if value is None else value

    def _check_adjoint_lr(self, name: str) -> None:
        """``name`` is None (= ``lr_inner``, then a float) or a positive finite float."""
        cls, value = type(self).__name__, getattr(self, name)
        if value is None and callable(self.lr_inner):
            raise ValueError(f"{cls}: give {name} explicitly when lr_inner is a schedule.")
        if value is not None and not (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and 0 < value < float("inf")
        ):
            raise ValueError(f"{cls}({name}=...) must be a positive float, got {value!r}.")

    def estimate(
        self, problem: BilevelProblem, x, y, mb: Minibatches, beta, key=None, v=None, k=None
    ) -> Estimate:
        """Steps 1-3 of the module docstring on the draws of ``mb`` (laid out by :meth:`draws`);
        ``v`` is the carried adjoint iterate (None when the strategy carries none), ``k`` the
        iteration count (for :meth:`adjoint_at`)."""
        draws, adjoint = self.draws(), self.adjoint_at(k).at_inner_step(beta)
        y_new = inner_sgd(problem, mb, x, y, beta, draws.steps)
        y_eval = y if self.two_timescale else y_new  # TTSA (7): both updates at (x^k, y^k)
        grad_x_f, grad_y_f = oracles.grads(problem.outer, x, y_eval, mb.outer(0))

        def hessian(j):  # the product with Hessian sample j (its batch gathered once)
            batch = mb.inner(draws.hessian_draw(j))
            return functools.partial(oracles.hvp_yy, problem.inner, x, y_eval, batch)

        v_new, products = adjoint.solve(hessian, grad_y_f, key, v)
        # two timescales: every direction at the step's start, so the carried v_k (SOBA)
        v_eval = v if self.two_timescale and adjoint.carries_iterate else v_new
        cross_batch = mb.inner(draws.cross_draw)
        direction = implicit_hypergradient(problem, x, y_eval, v_eval, grad_x_f, cross_batch)
        return Estimate(direction, y_new, products, v_new if adjoint.carries_iterate else None)

    def hypergradient(self, problem: BilevelProblem, x, y, mb: Minibatches, k=0, key=None):
        """``(hypergradient estimate, y after the inner steps)`` from ``y`` (ITD's signature)."""
        est = self.estimate(problem, x, y, mb, self.step_sizes(k)[1], key, k=k)
        return est.direction, est.y

    def step_counts(
        self, problem: BilevelProblem, mb: Minibatches, products, k=None
    ) -> dict[str, Any]:
        """The step's calls and samples: from the declared draws and the products made."""
        draws, adjoint = self.draws(), self.adjoint_at(k)
        # samples a random strategy declared but did not use (none when they are the steps')
        unused = 0 if draws.hessian_shares_step else draws.hessian - adjoint.draws_used(products)
        per_draw = batch_count(problem.inner_data, getattr(self, "batch_size", None))
        return dict(
            samples_outer=mb.samples_outer,
            samples_inner=mb.samples_inner - unused * per_draw,
            grad_f=1,  # both partials of f, fused
            grad_g=draws.steps,
            hvp=products,
            cross=1,
        )

    def init(self, problem: BilevelProblem, key: jax.Array) -> IterateState | AdjointState:
        state = self.initial_state(problem, key)
        if not self.adjoint().carries_iterate:
            return state
        # v_0 = 0 (benchopt's SOBA; the paper leaves v_0 free)
        return AdjointState(state.x, state.y, tree_zeros_like(state.y), *state[2:])

    def step(self, problem: BilevelProblem, state):
        key, batch_key, *adjoint_key = jax.random.split(state.key, 3 if self.keyed_adjoint else 2)
        mb = self.minibatches(problem, batch_key, outer=1, inner=self.draws().inner)
        alpha, beta = self.step_sizes(state.k)
        y = state.y if getattr(self, "warm_start", True) else problem.y0
        v = getattr(state, "v", None)
        est = self.estimate(problem, state.x, y, mb, beta, *adjoint_key, v=v, k=state.k)
        x, outer_state = self.outer_step(problem, state.x, est.direction, state.outer_state, alpha)
        counts = state.counts.add(**self.step_counts(problem, mb, est.products, state.k))
        if est.v is not None:
            return AdjointState(x, est.y, est.v, state.k + 1, key, counts, outer_state)
        return IterateState(x, est.y, state.k + 1, key, counts, outer_state)


# ---- the Ghadimi-Wang stochastic-approximation schedule (TTSA, BSA) ---------------------------
@dataclasses.dataclass(frozen=True)
class StochasticApproximation(ImplicitSolver):
    """What TTSA and BSA share beyond the family: the Hessian-inverse estimate of Ghadimi & Wang
    (2018, Alg. 3) -- the Neumann sum ("sum") or its randomised product ("random") -- with
    ``neumann_lr = c_h / L_g`` ("auto" = 1/L_g), and step sizes that decay by a regime:
    ``alpha_k = alpha_0 (k0/(k+k0))^a``, ``beta_k = beta_0 (k0/(k+k0))^b``.

    Not registered; subclasses declare ``neumann_steps``, ``neumann_lr``, ``hessian_inverse``,
    ``regime``, ``k0`` and the ``regimes`` table of exponents (a, b).
    """

    keyed_adjoint: ClassVar[bool] = True
    regimes: ClassVar[dict[str, tuple[float, float]]] = {"constant": (0.0, 0.0)}

    def adjoint(self) -> Adjoint:
        kind = RandomNeumann if self.hessian_inverse == "random" else Neumann
        return kind(lr=self.neumann_lr, num_terms=self.neumann_steps)

    def validate(self) -> None:
        cls = type(self).__name__
        n = self.neumann_steps
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{cls}(neumann_steps=...) must be an int >= 1, got {n!r}.")
        lr = self.neumann_lr
        if lr != "auto" and (isinstance(lr, bool) or not isinstance(lr, int | float) or not lr > 0):
            raise ValueError(
                f"{cls}(neumann_lr=...) must be a positive float below 1/L_g or 'auto' (1/L_g "
                f"from bl.diagnose), got {lr!r}."
            )
        if self.hessian_inverse not in ("sum", "random"):
            raise ValueError(
                f"{cls}(hessian_inverse={self.hessian_inverse!r}) is unknown; use 'sum' "
                "(Neumann sum, fixed cost) or 'random' (Ghadimi & Wang's randomised product)."
            )
        self._check_regime()

    def resolve(self, problem: BilevelProblem):
        solver = super().resolve(problem)
        if _is_auto(solver.neumann_lr):
            from bilevel.analysis.diagnose import auto_inner_step

            solver = dataclasses.replace(solver, neumann_lr=auto_inner_step(problem, 1.0))
        return solver

r"""The implicit-gradient family: stocBiO, AID-CG, AID-FP, TTSA, BSA and SOBA as presets of one
estimator, each the composition of two strategies.

By the implicit function theorem (Ghadimi & Wang 2018, eq. (2.7); Ji, Yang & Liang 2021, eq. (3))

.. math::

    \nabla F(x) = \nabla_x f(x, y^*) - \nabla^2_{xy} g(x, y^*)\,
    [\nabla^2_{yy} g(x, y^*)]^{-1} \nabla_y f(x, y^*).

Every method of the family runs, per outer iteration k (:meth:`ImplicitSolver.step`):

1. inner steps: ``y <- (S)GD steps on g(x_k, .)`` with step beta_k, a fresh minibatch per step
   (:func:`~bilevel.solvers.common.inner_sgd`);
2. adjoint: ``v ~ [d^2 g/dy^2 (x_k, y)]^{-1} grad_y f(x_k, y; D_F)`` built from minibatch
   Hessian-vector products;
3. implicit hypergradient ``h = grad_x f(x_k, y; D_F) - d^2 g/dx dy (x_k, y; D_C) v``;
4. outer step ``x_{k+1} = Proj_X(x_k - alpha_k P(h))`` (:meth:`Solver.outer_step`).

A preset declares its fields and two strategies:

* :meth:`ImplicitSolver.adjoint`, how step 2 is approximated
  (:mod:`~bilevel.solvers.hypergradient.adjoint`: conjugate gradient, fixed point, Neumann
  series, randomised Neumann product, one step on the linear system);
* :meth:`ImplicitSolver.timing`, how the steps are scheduled
  (:mod:`~bilevel.solvers.hypergradient.timing`: a double loop, T inner steps then the
  hypergradient at the new y; or a single loop, one y step and every direction at the
  iteration's start), with the step-size law and the draws the steps share.

SOBA, for instance, is ``LinearSystemStep()`` timed by ``SingleLoop(hessian_shares_step=True)``;
stocBiO is ``Neumann(...)`` timed by ``DoubleLoop(inner_steps)``. A strategy that keeps its own
iterate across steps (SOBA's v) is warm-started from the v carried in an :class:`AdjointState`.

Minibatches: one ``self.minibatches`` call per step, with the inner draws laid out by the
timing's :class:`~bilevel.solvers.hypergradient.timing.Draws` and one outer draw D_F for both
partials of f. The step's :class:`~bilevel.core.oracles.Counts` follow from the layout and from
the products the adjoint reports (``grad_g`` = inner steps, ``hvp`` = products, ``cross = 1``,
``grad_f = 1`` fused), so no preset writes its own sums.

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
from typing import Any, ClassVar, NamedTuple

import jax

from bilevel.core import oracles
from bilevel.core.problem import BilevelProblem
from bilevel.core.sampling import Minibatches, batch_count
from bilevel.core.tree import tree_zeros_like
from bilevel.solvers.base import IterateState, OuterState, Solver, _is_auto
from bilevel.solvers.common import implicit_hypergradient, inner_sgd
from bilevel.solvers.hypergradient.adjoint import Adjoint, Neumann, RandomNeumann
from bilevel.solvers.hypergradient.timing import DoubleLoop, Draws, Timing

PyTree = Any

__all__ = [
    "AdjointState",
    "Estimate",
    "ImplicitSolver",
    "AID",
    "StochasticApproximation",
]


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

    A preset has ``lr_outer``, ``lr_inner``, ``batch_size`` and its strategies' fields, and
    implements :meth:`adjoint` and :meth:`timing`.
    """

    #: step-size regimes {name: (a, b)} a preset's ``regime`` field chooses from (with its
    #: ``k0``): the orders its :class:`Timing` decays alpha_k and beta_k by
    regimes: ClassVar[dict[str, tuple[float, float]]] = {}

    @abc.abstractmethod
    def adjoint(self) -> Adjoint:
        """The strategy for ``v ~ [d^2 g/dy^2]^{-1} grad_y f`` (built from the fields)."""

    @abc.abstractmethod
    def timing(self) -> Timing:
        """The strategy that schedules the inner, adjoint and outer steps (from the fields)."""

    def adjoint_at(self, k) -> Adjoint:
        """The strategy at iteration k (``k=None``: the declared one, :meth:`adjoint`); a preset
        whose estimate changes with k (TTSA's growing Neumann length) overrides this."""
        del k
        return self.adjoint()

    def outer_step_decays(self, problem: BilevelProblem) -> bool:
        """Whether the timing's step-size law decays ``alpha_k`` (its ``decay`` exponent of the
        outer step is positive: TTSA, BSA, SOBA in their ``"strongly-convex"`` regime)."""
        del problem
        decay = self.timing().decay
        return decay is not None and decay[0] > 0

    def step_sizes(self, k) -> tuple[Any, Any]:
        """``(alpha_k, beta_k)``: the outer and inner steps at iteration k, by the timing's
        step-size law (:meth:`Timing.step_sizes`)."""
        return self.timing().step_sizes(self.lr_outer, self.lr_inner, k)

    def _decay(self) -> dict[str, Any]:
        """The timing options of a preset with ``regime`` and ``k0`` fields: the orders of
        ``regimes[regime]`` from the offset ``k0``."""
        return dict(decay=self.regimes[self.regime], k0=self.k0)

    def _check_regime(self) -> None:
        """``regime`` is one of ``regimes`` and ``k0 > 0``."""
        self._check_choices(regime=sorted(self.regimes))
        if not (isinstance(self.k0, int | float) and self.k0 > 0):
            raise ValueError(f"{type(self).__name__}(k0=...) must be > 0, got {self.k0!r}.")

    def draws(self) -> Draws:
        """The step's inner-draw layout (declared by the timing for the adjoint's samples)."""
        return self.timing().draws(self.adjoint().draws)

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
        timing, draws = self.timing(), self.draws()
        adjoint = self.adjoint_at(k).at_inner_step(beta)
        y_new = inner_sgd(problem, mb, x, y, beta, draws.steps)
        y_eval = timing.evaluation_point(y, y_new)
        grad_x_f, grad_y_f = oracles.grads(problem.outer, x, y_eval, mb.outer(0))

        def hessian(j):  # the product with Hessian sample j (its batch gathered once)
            batch = mb.inner(draws.hessian_draw(j))
            return functools.partial(oracles.hvp_yy, problem.inner, x, y_eval, batch)

        v_new, products = adjoint.solve(hessian, grad_y_f, key, v)
        # a carried v is evaluated where the timing evaluates y (SOBA's cross term: the old v)
        v_eval = timing.evaluation_point(v, v_new) if adjoint.carries_iterate else v_new
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
        timing = self.timing()
        key, batch_key, *adjoint_key = jax.random.split(state.key, 3 if timing.adjoint_key else 2)
        mb = self.minibatches(problem, batch_key, outer=1, inner=self.draws().inner)
        alpha, beta = self.step_sizes(state.k)
        y = timing.start(state.y, problem.y0)
        v = getattr(state, "v", None)
        est = self.estimate(problem, state.x, y, mb, beta, *adjoint_key, v=v, k=state.k)
        x, outer_state = self.outer_step(problem, state.x, est.direction, state.outer_state, alpha)
        counts = state.counts.add(**self.step_counts(problem, mb, est.products, state.k))
        if est.v is not None:
            return AdjointState(x, est.y, est.v, state.k + 1, key, counts, outer_state)
        return IterateState(x, est.y, state.k + 1, key, counts, outer_state)


# ---- approximate implicit differentiation (AID-CG, AID-FP) --------------------------------------
@dataclasses.dataclass(frozen=True)
class AID(ImplicitSolver):
    r"""The fields AID-CG and AID-FP share (they differ only in the linear solver); not
    registered.

    Per iteration k, with an independent minibatch for every oracle when ``batch_size`` is set::

        y   <- N (S)GD steps on g(x_k, .) from the previous y (warm start), step lr_inner
        v   ~ [d^2 g/dy^2 (x_k, y; B_H)]^{-1} grad_y f(x_k, y; D_F)       K CG or FP iterations
        x   <- Proj_X(x_k - lr_outer [grad_x f(x_k, y; D_F) - d^2 g/dx dy (x_k, y; B_C) v])

    The adjoint starts from the previous iteration's v (``warm_adjoint``, the default: AID-BiO
    of Ji, Yang & Liang, ICML 2021, Alg. 1; AmIGO of Arbel & Mairal, ICLR 2022), or from v = 0
    (hypertorch, ``warm_adjoint=False``). By default the K Hessian-vector
    products share one minibatch B_H, so CG solves one consistent linear system;
    ``fresh_hessian=True`` draws a new minibatch for every product instead (hypertorch's
    ``stochastic=True``, the stochastic AID of Sow, Ji & Liang, NeurIPS 2022, Sec. 4.2): K
    Hessian samples per step instead of one, so N + K + 1 inner minibatches. Timed by a
    :class:`~bilevel.solvers.hypergradient.timing.DoubleLoop` of N steps.

    Draws of one step (``inner(i)``, ``outer(i)`` of the step's minibatches)::

        inner(t), t < N   inner SGD step t
        inner(N)          all K Hessian-vector products, B_H (hypertorch's default); with
                          ``fresh_hessian``, inner(N + i) product i (Sow, Ji & Liang, Sec. 4.2)
        inner(N + 1)      the cross product, B_C (inner(N + K) with ``fresh_hessian``)
        outer(0)          both partials of f, D_F
    """

    lr_outer: Any = "auto"
    lr_inner: Any = "auto"
    batch_size: int | None = None
    inner_steps: int = 10
    linsolve_steps: int = 20
    warm_start: bool = True
    fresh_hessian: bool = False
    warm_adjoint: bool = True

    paper: ClassVar[str] = (
        "Grazzi, Franceschi, Pontil, Salzo. On the Iteration Complexity of Hypergradient "
        "Computation. ICML 2020."
    )

    def validate(self) -> None:
        K = self.linsolve_steps
        if isinstance(K, bool) or not isinstance(K, int) or K < 1:
            raise ValueError(
                f"{type(self).__name__}(linsolve_steps=...) must be a positive int, got {K!r}."
            )

    def timing(self) -> Timing:
        return DoubleLoop(inner_steps=self.inner_steps, warm_start=self.warm_start)


# ---- the Ghadimi-Wang stochastic-approximation schedule (TTSA, BSA) ---------------------------
@dataclasses.dataclass(frozen=True)
class StochasticApproximation(ImplicitSolver):
    """What TTSA and BSA share beyond the family: the Hessian-inverse estimate of Ghadimi & Wang
    (2018, Alg. 3) -- the Neumann sum ("sum") or its randomised product ("random") -- with
    ``neumann_lr = c_h / L_g`` ("auto" = 1/L_g), a key split per step for that estimate, and
    step sizes that decay by a regime: ``alpha_k = alpha_0 (k0/(k+k0))^a``,
    ``beta_k = beta_0 (k0/(k+k0))^b``.

    Not registered; subclasses declare ``neumann_steps``, ``neumann_lr``, ``hessian_inverse``,
    ``regime``, ``k0``, the ``regimes`` table of exponents (a, b), and their :meth:`timing`
    (built with :meth:`_timing_options`).
    """

    regimes: ClassVar[dict[str, tuple[float, float]]] = {"constant": (0.0, 0.0)}

    def adjoint(self) -> Adjoint:
        kind = RandomNeumann if self.hessian_inverse == "random" else Neumann
        return kind(lr=self.neumann_lr, num_terms=self.neumann_steps)

    def _timing_options(self) -> dict[str, Any]:
        """The regime's decay, and a key per step for the Hessian-inverse estimate whichever
        estimate runs (so "sum" and "random" draw the same minibatches)."""
        return dict(**self._decay(), adjoint_key=True)

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

            step = auto_inner_step(problem, 1.0, solver.curvature_batch(problem))
            solver = dataclasses.replace(solver, neumann_lr=step)
        return solver

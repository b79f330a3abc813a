r"""Adjoint strategies: ``v ~ [d^2 g/dy^2]^{-1} rhs`` from minibatch Hessian-vector products.

The implicit-gradient family (:mod:`bilevel.solvers.hypergradient.implicit`) needs the adjoint
of the implicit function theorem (Ghadimi & Wang 2018, eq. (2.7); Ji, Yang & Liang, ICML 2021,
eq. (3)); each strategy here is one of the papers' ways to approximate it:

* :class:`ConjugateGradient` and :class:`FixedPoint`: K iterations of a linear solver from
  v = 0 (AID-CG and AID-FP, Grazzi, Franceschi, Pontil & Salzo, ICML 2020);
* :class:`Neumann`: the truncated Neumann series (stocBiO, Ji, Yang & Liang, ICML 2021,
  Algorithm 3);
* :class:`RandomNeumann`: its randomised product (Ghadimi & Wang 2018, Algorithm 3; TTSA);
* :class:`LinearSystemStep`: one SGD step on the linear system, warm-started (SOBA, Dagreou,
  Ablin, Vaiter & Moreau, NeurIPS 2022, Sec. 2).

A strategy declares how many Hessian samples it draws per step (:attr:`Adjoint.draws`) and
returns ``(v, products)``; the estimator lays out the draws and counts the products.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax

from bilevel.core import linsolve
from bilevel.core.tree import tree_axpy, tree_sub, tree_zeros_like

PyTree = Any
#: ``j -> (v -> H_j v)``: the Hessian-vector product with the minibatch Hessian of sample j
HessianSamples = Callable[[Any], Callable[[PyTree], PyTree]]

__all__ = [
    "HessianSamples",
    "Adjoint",
    "ConjugateGradient",
    "FixedPoint",
    "Neumann",
    "RandomNeumann",
    "LinearSystemStep",
]


@dataclasses.dataclass(frozen=True)
class Adjoint(abc.ABC):
    """A strategy for ``v ~ H^{-1} rhs`` from minibatch Hessian-vector products.

    ``draws`` Hessian samples are declared per step; ``solve`` returns ``(v, products)`` with
    ``products`` the Hessian-vector products it evaluated (a traced int for random strategies).
    ``v0`` is the previous step's v, given to every strategy; only those that carry an iterate
    (``carries_iterate``) start from it, the others solve from scratch and ignore it.
    """

    #: whether v persists across steps (then the solver's state is an ``AdjointState``)
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
    """K iterations of a linear solver on ``H v = rhs``, one product each: on one shared
    Hessian sample (a consistent system), or, with ``fresh``, a new sample per product
    (hypertorch's ``stochastic=True``: the stochastic AID-FP and AID-CG of Sow, Ji & Liang,
    NeurIPS 2022, Sec. 4.2 and App. B.3).

    From v = 0 (hypertorch), or, with ``warm``, from the previous step's v (the warm-started
    adjoint of AID-BiO, Ji, Yang & Liang, ICML 2021, Alg. 1, and of AmIGO, Arbel & Mairal,
    ICLR 2022): the K iterations of successive steps then add up while x moves slowly, so the
    truncation ``(I - lr H)^K`` of a cold start no longer biases the hypergradient when
    ``L_g / mu_g`` is far above K.
    """

    num_iters: int
    fresh: bool = False
    warm: bool = False

    @property
    def carries_iterate(self) -> bool:  # type: ignore[override]
        return self.warm

    @property
    def draws(self) -> int:
        return self.num_iters if self.fresh else 1

    def solve(self, hessian, rhs, key, v0=None):
        del key
        init = v0 if self.carries_iterate else None  # a cold start from v = 0 otherwise
        if self.fresh:
            v = self.run(lambda v, i: hessian(i)(v), rhs, indexed=True, init=init)
        else:
            v = self.run(hessian(0), rhs, indexed=False, init=init)
        return v, self.num_iters

    @abc.abstractmethod
    def run(self, matvec, rhs, *, indexed: bool, init=None) -> PyTree:
        """The solver's K iterations from ``init`` (None: zeros)."""


@dataclasses.dataclass(frozen=True)
class ConjugateGradient(_Krylov):
    """K conjugate-gradient iterations (Hestenes & Stiefel 1952; AID-CG of Grazzi et al., ICML
    2020, and Rajeswaran et al., NeurIPS 2019): ``linsolve.cg``. On fresh samples it starts
    from 0 even when ``warm``: a warm start's first residual ``b - H v0`` would need a product
    on a sample of its own (``linsolve.cg(indexed=True)`` refuses an ``init``)."""

    @property
    def carries_iterate(self) -> bool:  # type: ignore[override]
        return self.warm and not self.fresh

    def run(self, matvec, rhs, *, indexed: bool, init=None) -> PyTree:
        return linsolve.cg(matvec, rhs, num_iters=self.num_iters, init=init, indexed=indexed)


@dataclasses.dataclass(frozen=True)
class FixedPoint(_Krylov):
    """K fixed-point iterations ``v <- v - lr (H v - rhs)`` (gradient descent on the quadratic;
    AID-FP of Grazzi et al., ICML 2020): ``linsolve.fixed_point``."""

    lr: Any = None  # eta < 2 / L_g (a float leaf of the solver, traced under jit)

    def run(self, matvec, rhs, *, indexed: bool, init=None) -> PyTree:
        return linsolve.fixed_point(
            matvec, rhs, lr=self.lr, num_iters=self.num_iters, init=init, indexed=indexed
        )


@dataclasses.dataclass(frozen=True)
class Neumann(Adjoint):
    r"""The truncated Neumann series with an independent Hessian per factor (Ji, Yang & Liang
    2021, Alg. 3): ``v = eta sum_{q<N} prod_{j=1}^{q} (I - eta H_j) rhs``, N - 1 products.

    ``active_terms`` (a traced int <= N, or None = N) runs a shorter series this step: the
    length that grows with the iteration count, ``t_max(k) = (L_g/mu_g) log(k + 1)``, of TTSA as
    run in the IBCG paper (Abolfazli et al., App. G.1); N then only bounds the Hessian samples
    declared.
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

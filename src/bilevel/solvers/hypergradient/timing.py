r"""Timing strategies: when one iteration's inner, adjoint and outer steps happen, which point
they are evaluated at, and which minibatches they share.

The implicit-gradient presets differ in two independent ways: how they approximate the adjoint
(:mod:`bilevel.solvers.hypergradient.adjoint`) and how they schedule the three updates. The
second is a :class:`Timing`:

* :class:`DoubleLoop`: T inner (S)GD steps on y first, then the adjoint and the hypergradient at
  the new y, each on its own draws (stocBiO, Ji, Yang & Liang, ICML 2021, Algorithm 2; AID,
  Grazzi et al., ICML 2020; BSA, Ghadimi & Wang 2018, Algorithm 2);
* :class:`SingleLoop`: one y step per iteration, every direction evaluated at the iteration's
  start and all updates applied together, the cross term on the y step's own sample (TTSA as
  Chen, Sun, Xiao & Yin, AISTATS 2022, write it in eq. (7); SOBA, Dagreou et al., NeurIPS 2022,
  Sec. 2, which also feeds the Hessian product from that sample).

A timing also carries the step-size law (constant, or decaying by a regime's orders) and
whether the iteration splits a key for a randomised adjoint.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, NamedTuple

import jax.numpy as jnp

from bilevel.core.schedules import step_size

PyTree = Any

__all__ = ["Draws", "Timing", "DoubleLoop", "SingleLoop"]


class Draws(NamedTuple):
    """The inner minibatches of one step, in order: ``steps`` for the inner (S)GD steps, then the
    adjoint's ``hessian`` samples, then the cross term's own draw -- or, when
    ``cross_shares_step``, the cross term reuses inner draw 0 (TTSA's phi^k, STABLE paper eq.
    (7b)), and when ``hessian_shares_step``, Hessian sample j reuses inner draw j (SOBA's single
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


@dataclasses.dataclass(frozen=True)
class Timing(abc.ABC):
    """How an implicit-gradient iteration is timed (module docstring).

    Args:
        decay: ``(a, b)``, the orders of ``alpha_k = alpha_0 (k0/(k+k0))^a`` (outer) and
            ``beta_k = beta_0 (k0/(k+k0))^b`` (inner), as the decaying regimes of Ghadimi & Wang
            (2018), Hong et al. (2023) and SOBA's Theorem 1 write them; schedules are then called
            with k as a float. ``None``: floats are constant steps and schedules get the int32
            count k.
        k0: the offset of the decaying steps (a float leaf of the solver, traced under jit).
        adjoint_key: split a third key per iteration for the adjoint. TTSA and BSA do so
            whichever Hessian-inverse estimate runs, so that the Neumann sum and Ghadimi & Wang's
            randomised product see the same minibatches.
    """

    decay: tuple[float, float] | None = None
    k0: Any = 1.0
    adjoint_key: bool = False

    @abc.abstractmethod
    def draws(self, hessian: int) -> Draws:
        """The iteration's inner-draw layout for an adjoint of ``hessian`` samples."""

    @abc.abstractmethod
    def start(self, y: PyTree, y0: PyTree) -> PyTree:
        """Where the inner steps start: the carried ``y`` or the problem's ``y0``."""

    @abc.abstractmethod
    def evaluation_point(self, old: PyTree, new: PyTree) -> PyTree:
        """The iterate (y, or a carried adjoint v) the directions are evaluated at: its value
        at the iteration's start (``old``) or after its update (``new``)."""

    def step_sizes(self, lr_outer, lr_inner, k) -> tuple[Any, Any]:
        """``(alpha_k, beta_k)``: the outer and inner steps at iteration k
        (:func:`bilevel.core.schedules.step_size`, by ``decay``)."""
        if self.decay is None:
            return step_size(lr_outer, k), step_size(lr_inner, k)
        kf = jnp.asarray(k, dtype=jnp.result_type(float))
        a, b = self.decay
        return step_size(lr_outer, kf, a, self.k0), step_size(lr_inner, kf, b, self.k0)


@dataclasses.dataclass(frozen=True)
class DoubleLoop(Timing):
    """T inner (S)GD steps from the previous y (``warm_start``) or from ``y0``, then the adjoint
    and the hypergradient at the new y; the inner steps, the Hessian samples and the cross term
    each draw their own minibatches (stocBiO, AID, BSA)."""

    inner_steps: int = 1
    warm_start: bool = True

    def draws(self, hessian: int) -> Draws:
        return Draws(self.inner_steps, hessian)

    def start(self, y, y0):
        return y if self.warm_start else y0

    def evaluation_point(self, old, new):
        del old  # the hypergradient is taken at the inner loop's output
        return new


@dataclasses.dataclass(frozen=True)
class SingleLoop(Timing):
    """One y step per iteration, every direction at the iteration's start (x_k, y_k[, v_k]) and
    all updates applied together, the cross term on the y step's sample phi^k (TTSA, STABLE
    paper eq. (7)). ``hessian_shares_step``: the Hessian product uses that sample too (SOBA's
    single inner sample i for D_y, D_v and D_x)."""

    hessian_shares_step: bool = False

    def draws(self, hessian: int) -> Draws:
        return Draws(
            1, hessian, cross_shares_step=True, hessian_shares_step=self.hessian_shares_step
        )

    def start(self, y, y0):
        del y0  # y is the single loop's own iterate
        return y

    def evaluation_point(self, old, new):
        del new  # TTSA (7), SOBA: both updates at (x^k, y^k[, v^k])
        return old

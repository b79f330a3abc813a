"""The online solver contract: a solver whose state carries the round t.

An online method plays a stream (a :class:`bilevel.OnlineProblem`): at round t it has committed
``(x_t, y_t) = output(state)``, receives f_t and g_t, and ``round(problem, state)`` returns the
state of round t + 1. Like every solver it is a frozen dataclass and a pytree (float
hyperparameters are leaves), with pure, jit-, scan- and vmap-able methods usable outside the
driver:

* ``init(problem, key) -> state``: round 1, with ``state.t == 1`` (rounds count from 1, as in
  the papers; see ``bilevel.core.online_problem``);
* ``round(problem, state) -> state`` (``step`` is the same method, for code written against
  offline solvers): one round, ``state.t -> state.t + 1``, counting the oracle calls and samples
  of that round in ``state.counts``;
* ``output(state) -> (x_t, y_t)``: the decisions committed for round ``state.t``;
* ``outer_lr(t)``: the x step gamma_t of round t, the default gamma of the regret's gradient
  mapping G_X(x_t, grad F_t(x_t), gamma).

The state is a typed ``NamedTuple`` with at least ``x``, ``y``, ``t`` (int32 round), ``key``,
``counts`` and ``outer_state``. ``bl.solve_online`` owns the loop over rounds.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from bilevel.core.oracles import Counts
from bilevel.core.problem import ProblemKindError
from bilevel.core.schedules import round_step_size
from bilevel.solvers.base import Solver, _is_auto

__all__ = ["OnlineSolver"]


@dataclasses.dataclass(frozen=True)
class OnlineSolver(Solver):
    """Base class of the online solvers (see the module docstring)."""

    online: ClassVar[bool] = True

    @abc.abstractmethod
    def round(self, problem, state: Any) -> Any:
        """Play round ``state.t``: the state of round ``state.t + 1``."""

    def step(self, problem, state: Any) -> Any:
        """The same as :meth:`round` (the name every offline solver uses)."""
        return self.round(problem, state)

    def first_round(self, problem, key: jax.Array) -> dict[str, Any]:
        """The fields every online state starts round 1 with: ``x = x0``, ``y = y0``, ``t = 1``,
        the key, zero counts and a fresh outer-optimiser state (a method's ``init`` adds its
        own fields: ``State(**self.first_round(problem, key), z=...)``)."""
        return dict(
            x=problem.x0,
            y=problem.y0,
            t=jnp.ones((), jnp.int32),
            key=key,
            counts=Counts.zeros(),
            outer_state=self.outer_init(problem.x0),
        )

    def outer_lr(self, t) -> jax.Array:
        """gamma_t, the x step of round t: ``lr_outer`` (a float, or a schedule of the round)."""
        return round_step_size(self.lr_outer, t)

    def round_batches(self, problem, t, key: jax.Array, *, outer: int, inner: int):
        """Round t's ``outer`` outer and ``inner`` inner draws of ``batch_size`` (see
        ``bilevel.core.streams.round_minibatches``; full rounds with ``batch_size=None``)."""
        return problem.minibatches(
            t, key, getattr(self, "batch_size", None), outer=outer, inner=inner
        )

    def resolve(self, problem) -> OnlineSolver:
        """This solver with ``lr_inner="auto"`` filled in: ``auto_inner_factor / L_g``, with L_g
        estimated by ``bl.diagnose`` on round 1 at (x0, y0) (``problem.round_problem(1)``)."""
        if _is_auto(getattr(self, "lr_inner", None)):
            from bilevel.analysis.diagnose import auto_inner_step

            step = auto_inner_step(problem.round_problem(1), self.auto_inner_factor)
            return dataclasses.replace(self, lr_inner=step)
        return self

    def check_problem(self, problem) -> None:
        """Refuse anything but a :class:`bilevel.OnlineProblem` this solver can play (a problem
        says its kind by its ``kind`` attribute)."""
        if getattr(problem, "kind", None) != "online":
            raise ProblemKindError(
                f"{self.name!r} is an online solver: it plays a stream of rounds f_t, g_t and "
                f"needs a bl.OnlineProblem, got {type(problem).__name__}. Wrap the stream as "
                "bl.OnlineProblem(outer=f, inner=g, horizon=T, x0=..., y0=...) with f(t, x, y, "
                "batch) and run bl.solve_online(problem, solver); for an offline problem use an "
                "offline solver such as 'f2sa' with bl.solve."
            )
        if problem.x_set is not None and not self.supports_x_set:
            raise ValueError(
                f"solver {self.name!r} does not support a constrained upper level "
                f"(x_set={type(problem.x_set).__name__}); drop x_set."
            )
        self._check_batch_size(problem)

    def _check_batch_size(self, problem) -> None:
        bs = getattr(self, "batch_size", None)
        if bs is None:
            return
        from bilevel.core.streams import is_sampler

        levels = [("outer", problem.outer_data), ("inner", problem.inner_data)]
        held = [(label, d) for label, d in levels if d is not None and not is_sampler(d)]
        if not problem.stochastic:
            raise ValueError(
                f"batch_size={bs} but {problem.name} is deterministic (no outer_data or "
                "inner_data to draw minibatches from); drop batch_size."
            )
        if not held:
            raise ValueError(
                f"batch_size={bs} but the data of {problem.name} are samplers data(t, key), "
                "which set their own batch size; drop batch_size."
            )
        for label, _ in held:
            n = getattr(problem, f"n_{label}")
            if bs > n:
                raise ValueError(
                    f"batch_size={bs} is larger than the {label} data of a round ({n} samples); "
                    f"use batch_size <= {n} or None for whole rounds."
                )

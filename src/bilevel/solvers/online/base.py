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
  mapping G_X(x_t, grad F_t(x_t), gamma);
* ``resolve(problem)``: the settings that depend on the stream filled in (``"auto"`` and the
  theorems' horizon rules, from ``problem.horizon``; :meth:`OnlineSolver.resolve`).

``lr_outer="auto"`` is every online solver's default: ``bl.solve_online`` tunes it on the first
rounds (``bilevel.drivers.online``); ``resolve`` alone takes a quarter of the method's stable
bound (:meth:`OnlineSolver.stable_outer_step`), which is Theorems 3.1 and 4.1's largest step
gamma = 1 / (2 L_F) for an exact hypergradient step.

The state is a typed ``NamedTuple`` with at least ``x``, ``y``, ``t`` (int32 round), ``key``,
``counts`` and ``outer_state``. ``bl.solve_online`` owns the loop over rounds.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from bilevel.core.oracles import Counts
from bilevel.core.problem import ProblemKindError
from bilevel.core.schedules import round_step_size
from bilevel.solvers.base import Solver, _is_auto
from bilevel.solvers.online import auto, settling

__all__ = ["OnlineSolver"]


@dataclasses.dataclass(frozen=True)
class OnlineSolver(Solver):
    """Base class of the online solvers (see the module docstring)."""

    online: ClassVar[bool] = True
    auto_step_sizes: ClassVar[tuple[str, ...]] = ("lr_inner", "lr_outer")
    #: none is left to ``bl.tune``: :meth:`resolve` fills ``lr_outer="auto"`` by its rule and
    #: ``bl.solve_online`` tunes it on the first rounds of the stream
    tuned_step_sizes: ClassVar[tuple[str, ...]] = ()
    #: ``lr_outer="auto"`` without tuning (:meth:`resolve` alone): this fraction of the stable
    #: bound, 1/4: gamma = 1 / (2 L_F) for an exact gradient step (bound 2 / L_F), the largest
    #: step of Theorems 3.1 and 4.1 (Jia & Chen, arXiv:2602.11665)
    auto_outer_fraction: ClassVar[float] = 0.25
    #: linearise the round map by central differences rather than forward mode
    #: (:meth:`stable_outer_step`): for a round that holds a value constant with
    #: ``stop_gradient``, which forward mode would read as no dependence
    linearise_by_differences: ClassVar[bool] = False
    #: the fields at which the inner loops stop (a tolerance, not a count), for
    #: :meth:`settling_hint`; empty for a method whose inner steps are counted
    inner_tolerances: ClassVar[tuple[str, ...]] = ()

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

    def _check_fields(self) -> None:
        """The common checks, with ``inner_steps="auto"`` (a horizon rule, :meth:`resolve`)
        allowed where a method declares it."""
        if _is_auto(getattr(self, "inner_steps", None)):
            probe = object.__new__(type(self))
            probe.__dict__.update(self.__dict__, inner_steps=1)
            return Solver._check_fields(probe)
        return super()._check_fields()

    def resolve(self, problem) -> OnlineSolver:
        """This solver with every setting that depends on the stream filled in:
        :meth:`resolve_settings` (``lr_inner="auto"`` and the horizon rules of each method),
        then ``lr_outer="auto"`` as ``auto_outer_fraction`` of the stable bound
        (:meth:`stable_outer_step`; ``bl.solve_online`` tunes it instead, on the first rounds).
        """
        solver = self.resolve_settings(problem)
        if not _is_auto(solver.lr_outer):
            return solver
        bound = solver.stable_outer_step(problem)
        top = bound.scale if bound.bound is None else bound.bound
        return dataclasses.replace(solver, lr_outer=float(self.auto_outer_fraction * top))

    def resolve_settings(self, problem) -> OnlineSolver:
        """Everything :meth:`resolve` fills in but ``lr_outer``: here ``lr_inner="auto"`` =
        ``auto_inner_factor / L_g``, L_g estimated by ``bl.diagnose`` on round 1 at (x0, y0)
        (``problem.round_problem(1)``); a method adds its own rules (calling this first)."""
        if _is_auto(getattr(self, "lr_inner", None)):
            from bilevel.analysis.diagnose import auto_inner_step

            step = auto_inner_step(problem.round_problem(1), self.auto_inner_factor)
            return dataclasses.replace(self, lr_inner=step)
        return self

    @staticmethod
    def inner_condition(problem, needs: str, instead: str) -> float:
        """kappa_g = L_g / mu_g of round 1 at (x0, y0) (``bl.diagnose``, cached per problem), for
        a setting built from it; ``needs`` and ``instead`` word the error where g_1 is not
        strongly convex there (:func:`bilevel.analysis.diagnose.strong_convexity`)."""
        from bilevel.analysis.diagnose import strong_convexity

        mu_g, L_g = strong_convexity(problem.round_problem(1), needs, instead)
        return L_g / mu_g

    # ---- the outer step ------------------------------------------------------------------
    def stable_outer_step(self, problem) -> auto.StepBound:
        """The largest ``lr_outer`` at which this solver's round map, linearised at (x0, y0),
        is stable (``bilevel.solvers.online.auto``; the classical 2 / L_F for an exact gradient
        step). Everything but ``lr_outer`` must be resolved (:meth:`resolve_settings`).

        Raises:
            ValueError: for an ``outer_optimizer`` other than "sgd" and "momentum" (the
                update is then not linear in ``lr_outer``).
        """
        if self.outer_optimizer not in ("sgd", "momentum"):
            raise ValueError(
                f"{type(self).__name__}(outer_optimizer={self.outer_optimizer!r}) has no stable "
                "bound for lr_outer (its update is not linear in lr_outer), so lr_outer='auto' "
                "cannot be resolved; give lr_outer as a number."
            )
        return auto.stable_outer_step(dataclasses.replace(self, lr_outer=1.0), problem)

    def check_outer_step(self, problem) -> None:
        """Refuse a numeric ``lr_outer`` above :meth:`stable_outer_step`'s bound (ValueError
        naming the bound and the fix). Skipped for a schedule, an outer optimizer other than
        "sgd" or "momentum", and a state too large for the Jacobian (no bound)."""
        lr = self._checked_step()
        if lr is None:
            return
        bound = self.stable_outer_step(problem)
        if bound.bound is None or lr <= bound.bound:
            return
        raise ValueError(
            f"{type(self).__name__}(lr_outer={lr:g}) exceeds the stable bound {bound.bound:.3g} "
            f"of {self.name!r} on {problem.name} (the largest step at which "
            f"{bound.describe()}, stays stable; 2 / L_F for an exact gradient step): use "
            f"lr_outer <= {_round_down(bound.bound)} or "
            f"'auto'{self.outer_step_hint()}."
        )

    def check_settling(self, problem, oracle: str) -> None:
        """Refuse a numeric ``lr_outer`` predicted to leave the regret above
        ``settling.TARGET`` (0.095: a tenth, less 5% for the prediction's error) of that
        of standing still at x0 within the horizon (a ValueError): naming the steps below the
        stable bound predicted to reach it, or, where none is on a horizon of at least
        ``settling.SETTLE_ROUNDS`` rounds, what else to change (:meth:`settling_hint`;
        ``bilevel.solvers.online.settling``, whose module docstring has the prediction).
        ``oracle``: the regret's oracle of grad F_t. Skipped where :meth:`check_outer_step`
        is, and where no prediction is made."""
        lr = self._checked_step()
        if lr is None:
            return
        bound = self.stable_outer_step(problem).bound
        found = settling.settling(self, problem, oracle, bound)
        if found is None or found.lowest is None:
            return
        if not found.reaching:
            if problem.horizon >= settling.SETTLE_ROUNDS and found.lowest[0] < settling.TRUSTED:
                raise ValueError(
                    f"{settling.unreachable(self, problem, *found.lowest)}; or check_step=False "
                    f"to play {lr:g} anyway (predicted {found.ratio:.2g})."
                )
            return
        low, high = min(found.reaching), max(found.reaching)
        which = "below" if lr < low else "above" if lr > high else "not among"
        raise ValueError(
            f"{type(self).__name__}(lr_outer={lr:g}) is {which} the steps that let x settle "
            f"within the {problem.horizon} rounds of {problem.name}: the method's round maps, "
            f"linearised at (x0, y0) on rounds 1, 2, 4, ..., {found.rounds[-1]} and each played "
            f"until the next, end with a regret {found.ratio:.2g} of that of standing still at "
            f"x0 with it, where steps from {low:.3g} to {high:.3g} reach {settling.TARGET:g} (the "
            f"stable bound is {bound:.3g}): use lr_outer in that range or 'auto', or "
            f"check_step=False to play {lr:g} anyway."
        )

    def _checked_step(self) -> float | None:
        """``lr_outer`` as a float where the checks above apply (a number, and an update linear
        in it: "sgd" or "momentum"), else ``None``."""
        if callable(self.lr_outer) or self.outer_optimizer not in ("sgd", "momentum"):
            return None
        return float(self.lr_outer)

    def outer_step_hint(self) -> str:
        """What else widens the stable range of ``lr_outer``, for :meth:`check_outer_step`'s
        message (e.g. more inner steps); empty by default."""
        return ""

    def settling_hint(self) -> str:
        """What else to change when no ``lr_outer`` is predicted to settle within the horizon
        (``check_settling``, ``bilevel.solvers.online.settling.predicted_choice``): smaller
        tolerances where the inner loops stop at one (:attr:`inner_tolerances`), more inner
        steps where the method counts them, else a method that takes several."""
        lag = "an inner iterate that lags y*_t holds x back"
        if self.inner_tolerances:
            settings = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.inner_tolerances)
            return f"smaller inner tolerances ({settings}: {lag}), or a longer horizon"
        if hasattr(self, "inner_steps"):
            return (
                f"more inner steps (inner_steps={self.inner_steps!r}: {lag}), or a longer horizon"
            )
        return (
            f"a method with several inner steps a round such as 'f2obo', 'aobo' or 'oagd' "
            f"({self.name} takes one, and {lag}), or a longer horizon"
        )

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


def _round_down(value: float) -> str:
    """``value`` rounded down to 2 significant digits, as text (a bound to quote)."""
    digits = 1 - math.floor(math.log10(value))
    return f"{math.floor(value * 10**digits) / 10**digits:g}"

"""The solver contract: a frozen dataclass of hyperparameters with pure ``init`` and ``step``.

ADDING A SOLVER: read ``docs/adding_a_solver.md`` first (the patterns every solver follows:
minibatches declared once per step, exact call counts, shared pieces in ``solvers/common.py``,
the test battery and per-family ``tests/solver_settings_<family>.py`` files).

``init(problem, key) -> state`` and ``step(problem, state) -> state`` are pure and jit-, scan- and
vmap-able; the state is a typed ``NamedTuple`` that carries at least ``x``, ``y``, ``k`` (the
iteration count), ``key`` (the PRNG key, split inside ``step``) and ``counts``
(:class:`bilevel.oracles.Counts`). The driver (:func:`bilevel.solve`) owns the loop.

Hyperparameters are static (Python numbers, strings or schedule functions), so the dataclass is
hashable and a second ``solve`` with an equal solver reuses the compiled program. The numeric
step sizes ``lr_outer`` / ``lr_inner`` are the exception: ``solve`` passes them into the compiled
program as arguments (``Solver.split_step_sizes``), so solvers that differ only in them (a grid
search) share one compilation; ``step`` must therefore only do arithmetic with them.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import optax

from .. import sampling
from .._tree import tree_axpy, tree_norm
from ..oracles import Counts
from ..problem import BilevelProblem
from ..schedules import check_step_size

PyTree = Any

__all__ = ["Solver", "Counts", "OUTER_OPTIMIZERS", "IterateState", "OuterState"]

OUTER_OPTIMIZERS = ("sgd", "momentum", "adam")


class OuterState(NamedTuple):
    """The outer optimiser's state, and the norm of the last direction it was given.

    The direction is the method's hypergradient estimate (or surrogate, for the penalty
    methods), so ``direction_norm`` is what PZOBO's Fig. 2(e) plots; ``solve`` records it as
    the metric ``hypergrad_estimate_norm`` (0 before the first step).
    """

    opt: Any  # optax state of the outer optimiser (empty for plain steps)
    direction_norm: jax.Array  # ||direction|| of the last outer step


class IterateState(NamedTuple):
    """The state of a method whose variables are x and one inner iterate y (stocBiO, AID, ITD,
    TTSA, BSA): what y means (warm start, fast timescale) is said by each solver."""

    x: PyTree  # upper iterate x_k
    y: PyTree  # inner iterate (the method's estimate of y*(x_k))
    k: jax.Array  # iteration count
    key: jax.Array  # PRNG key
    counts: Counts  # samples and oracle calls so far
    outer_state: OuterState  # the outer optimiser's state


@dataclasses.dataclass(frozen=True)
class Solver(abc.ABC):
    """Base class of every solver (see module docstring).

    Subclasses are frozen dataclasses with fields ``lr_outer``, ``lr_inner``, ``batch_size``
    (``None`` = full data) and, when they have an inner loop, ``inner_steps``.
    """

    #: how the x-direction becomes a step: "sgd" (x - lr d, the papers' update), "momentum"
    #: (heavy ball, 0.9) or "adam" (Kingma & Ba 2015; the PZOBO experiments' outer optimiser);
    #: ``lr_outer`` is the learning rate in every case, and the step is projected onto x_set.
    outer_optimizer: str = "sgd"

    name: ClassVar[str] = "solver"
    #: whether ``step`` honours ``problem.x_set`` (projection or LMO)
    supports_x_set: ClassVar[bool] = True
    #: whether the method needs stochastic data (online methods) or works on any problem
    paper: ClassVar[str] = ""
    #: ``lr_inner="auto"`` means ``auto_inner_factor / L_g`` (the paper's inner-step rule)
    auto_inner_factor: ClassVar[float] = 1.0

    # ---- validation ----------------------------------------------------------------------
    def __post_init__(self):
        for fld in dataclasses.fields(self):
            value = getattr(self, fld.name)
            if fld.name == "lr_inner" and isinstance(value, str) and value != "auto":
                raise ValueError(
                    f"{type(self).__name__}(lr_inner={value!r}) is not a step size: use a "
                    "positive float, a schedule k -> step, or 'auto' (1/L_g from bl.diagnose)."
                )
            if fld.name.startswith("lr_") and not (fld.name == "lr_inner" and value == "auto"):
                check_step_size(value, f"{type(self).__name__}({fld.name}=...)")
        bs = getattr(self, "batch_size", None)
        if bs is not None and (isinstance(bs, bool) or not isinstance(bs, int) or bs < 1):
            raise ValueError(
                f"{type(self).__name__}(batch_size=...) must be a positive int or None (full "
                f"data), got {bs!r}."
            )
        for fld in ("inner_steps",):
            if hasattr(self, fld):
                v = getattr(self, fld)
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise ValueError(
                        f"{type(self).__name__}({fld}=...) must be a positive int, got {v!r}."
                    )
        if self.outer_optimizer not in OUTER_OPTIMIZERS:
            raise ValueError(
                f"{type(self).__name__}(outer_optimizer={self.outer_optimizer!r}) is unknown; use "
                f"one of {', '.join(OUTER_OPTIMIZERS)}."
            )
        self.validate()

    def resolve(self, problem: BilevelProblem) -> Solver:
        """This solver with data-dependent settings filled in (``lr_inner="auto"``).

        ``"auto"`` becomes ``auto_inner_factor / L_g`` with L_g estimated by
        :func:`bilevel.diagnose` at ``(x0, y0)``. ``solve`` calls this before compiling.
        """
        if getattr(self, "lr_inner", None) == "auto":
            from ..diagnose import auto_inner_step

            step = auto_inner_step(problem, self.auto_inner_factor)
            return dataclasses.replace(self, lr_inner=step)
        return self

    def validate(self) -> None:  # noqa: B027  (optional hook, deliberately empty)
        """Extra checks of the hyperparameters (override; raise ValueError)."""

    def check_problem(self, problem: BilevelProblem) -> None:
        """Refuse a problem this solver cannot handle, before anything is compiled."""
        if not isinstance(problem, BilevelProblem):
            raise TypeError(
                f"{type(self).__name__} needs a bl.BilevelProblem, got {type(problem).__name__}."
            )
        if problem.x_set is not None and not self.supports_x_set:
            raise ValueError(
                f"solver {self.name!r} does not support a constrained upper level "
                f"(x_set={type(problem.x_set).__name__}); use a projected or Frank-Wolfe method "
                "such as 'ibcg', or drop x_set."
            )
        bs = getattr(self, "batch_size", None)
        if bs is not None and not problem.stochastic and bs != self._default("batch_size"):
            # a method's own default (PZOBO-S's 256) only applies where there is data
            raise ValueError(
                f"batch_size={bs} but {problem.name} is deterministic (no outer_data or "
                "inner_data to draw minibatches from); drop batch_size, or give the problem "
                "data (e.g. bl.problems.quadratic(stochastic=True))."
            )
        for label, n in (("outer", problem.n_outer), ("inner", problem.n_inner)):
            if bs is not None and n is not None and bs > n:
                raise ValueError(
                    f"batch_size={bs} is larger than the {label} data ({n} samples); use "
                    f"batch_size <= {n} or None for full batches."
                )

    @classmethod
    def _default(cls, name: str) -> Any:
        """The declared default of field ``name`` (``None`` if it has none)."""
        for fld in dataclasses.fields(cls):
            if fld.name == name and fld.default is not dataclasses.MISSING:
                return fld.default
        return None

    # ---- step sizes as traced arguments ------------------------------------------------------
    #: fields lifted out of the compiled program when they are plain numbers (see below)
    traced_fields: ClassVar[tuple[str, ...]] = ("lr_outer", "lr_inner")

    def split_step_sizes(self) -> tuple[Solver, dict[str, float]]:
        """``(template, values)``: this solver with its numeric step sizes lifted out.

        ``solve`` compiles ``template`` once and feeds ``values`` in as traced scalars, so a
        grid over ``lr_outer``/``lr_inner`` (or a second solve with other step sizes) reuses one
        compilation. The template holds the placeholder 1.0 and is only ever used, after
        :meth:`with_step_sizes`, inside the traced program. Schedules (callables) and strings
        stay static.
        """
        values = {
            name: float(getattr(self, name))
            for name in self.traced_fields
            if isinstance(getattr(self, name, None), int | float)
            and not isinstance(getattr(self, name), bool)
        }
        return self.with_step_sizes(dict.fromkeys(values, 1.0)), values

    def with_step_sizes(self, values: dict[str, Any]) -> Solver:
        """A copy with the fields of ``values`` set (possibly to tracers), without validation:
        the values were validated when this solver was built."""
        out = copy.copy(self)
        for name, value in values.items():
            object.__setattr__(out, name, value)
        return out

    # ---- the contract ----------------------------------------------------------------------
    @abc.abstractmethod
    def init(self, problem: BilevelProblem, key: jax.Array) -> Any:
        """The state at step 0."""

    @abc.abstractmethod
    def step(self, problem: BilevelProblem, state: Any) -> Any:
        """One outer iteration of the method."""

    def initial_state(self, problem: BilevelProblem, key: jax.Array) -> IterateState:
        """``(x0, y0)``, step 0, the key, zero counts and a fresh outer-optimiser state."""
        return IterateState(
            x=problem.x0,
            y=problem.y0,
            k=jnp.zeros((), jnp.int32),
            key=key,
            counts=Counts.zeros(),
            outer_state=self.outer_init(problem.x0),
        )

    def output(self, state: Any) -> tuple[PyTree, PyTree]:
        """``(x, y)``: the upper iterate and the current estimate of ``y*(x)``."""
        return state.x, state.y

    # ---- helpers shared by all solvers -----------------------------------------------------
    def _outer_transform(self) -> optax.GradientTransformation:
        # the optimiser without its learning rate: the solver multiplies by its own lr_k
        return {
            "sgd": optax.identity,
            "momentum": lambda: optax.trace(decay=0.9),
            "adam": optax.scale_by_adam,
        }[self.outer_optimizer]()

    def outer_init(self, x0: PyTree) -> OuterState:
        """The outer optimiser's state for x0 (empty for plain gradient steps)."""
        # zeros_like(norm) so the carry's dtype is the one outer_step's norm will have
        return OuterState(self._outer_transform().init(x0), jnp.zeros_like(tree_norm(x0)))

    def outer_step(
        self, problem: BilevelProblem, x: PyTree, direction: PyTree, outer_state: OuterState, lr
    ) -> tuple[PyTree, OuterState]:
        """``Proj_X(x - lr * P(direction))`` with P the outer optimiser (identity for "sgd")."""
        update, opt = self._outer_transform().update(direction, outer_state.opt, x)
        new_state = OuterState(opt, tree_norm(direction))
        return problem.project_x(tree_axpy(-lr, update, x)), new_state

    def minibatches(
        self, problem: BilevelProblem, key: jax.Array, *, outer: int, inner: int
    ) -> sampling.Minibatches:
        """The ``outer`` outer and ``inner`` inner minibatches one step will use."""
        return sampling.minibatches(
            key,
            problem.outer_data,
            problem.inner_data,
            getattr(self, "batch_size", None),
            outer=outer,
            inner=inner,
        )

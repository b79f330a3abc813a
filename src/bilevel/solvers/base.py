"""The solver contract: a frozen dataclass and pytree of hyperparameters, pure init and step.

ADDING A SOLVER: read ``docs/adding_a_solver.md`` first (the patterns every solver follows:
minibatches declared once per step, exact call counts, shared pieces in ``solvers/common.py``,
the test battery and per-family ``tests/solver_settings_<family>.py`` files).

``init(problem, key) -> state`` and ``step(problem, state) -> state`` are pure and jit-, scan- and
vmap-able; the state is a typed ``NamedTuple`` that carries at least ``x``, ``y``, ``k`` (the
iteration count), ``key`` (the PRNG key, split inside ``step``) and ``counts``
(:class:`bilevel.core.oracles.Counts`). The driver (:func:`bilevel.solve`) owns the loop.

A solver is a pytree (every subclass is registered by ``Solver.__init_subclass__``): its numeric
hyperparameters (floats: step sizes, penalty constants, momentum, smoothing, ...) are array
leaves, and what sets shapes or code paths (ints such as ``batch_size`` or ``inner_steps``,
strings, bools, ``None``, schedules, ``"auto"``) is static aux data. So the solver goes through
``jax.jit``/``vmap`` as an argument: solvers that differ only in numeric hyperparameters share one
compiled program (a grid of step sizes compiles once, or is one ``vmap``), and ``init``/``step``
must only do traced arithmetic with those fields (Python ``if``s, ``float(...)`` or ``math`` on
them belong in :meth:`Solver.validate`, which sees the concrete values at construction).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bilevel.core import sampling
from bilevel.core.oracles import Counts
from bilevel.core.problem import BilevelProblem, ProblemKindError
from bilevel.core.schedules import TracedSchedule, check_step_size
from bilevel.core.tree import tree_axpy, tree_norm

PyTree = Any

__all__ = [
    "Solver",
    "Counts",
    "OUTER_OPTIMIZERS",
    "IterateState",
    "OuterState",
    "check_optimizer",
    "optimizer_transform",
]

#: the names ``outer_optimizer`` accepts (besides any optax.GradientTransformation)
OUTER_OPTIMIZERS = ("sgd", "momentum", "adam")

#: every optimiser name a solver field accepts, as an optax transformation WITHOUT a learning
#: rate (the solver multiplies the update by its own lr_k). "sgd" and "gd" are the same plain
#: step; "momentum" is PyTorch's SGD heavy ball v <- 0.9 v + d (step lr v); "adam" is Kingma &
#: Ba (ICLR 2015) with optax's defaults b1 = 0.9, b2 = 0.999, eps = 1e-8, PyTorch's as well.
_NAMED_OPTIMIZERS = {
    "sgd": optax.identity,
    "gd": optax.identity,
    "momentum": lambda: optax.trace(decay=0.9),
    "adam": optax.scale_by_adam,
}


def check_optimizer(owner: str, field: str, value: Any, names: tuple[str, ...]) -> None:
    """Raise a ValueError naming ``owner(field=value)`` and the choices unless ``value`` is one
    of ``names`` or an ``optax.GradientTransformation``.

    Args:
        owner: the solver's class name, for the message.
        field: the field's name (``"outer_optimizer"``, PZOBO's ``"inner_optimizer"``).
        value: the field's value.
        names: the names this field accepts (keys of the shared table, e.g.
            :data:`OUTER_OPTIMIZERS`).
    """
    if isinstance(value, optax.GradientTransformation):
        return
    if not (isinstance(value, str) and value in names):
        raise ValueError(
            f"{owner}({field}={value!r}) is unknown; use one of {', '.join(names)} or an "
            "optax.GradientTransformation without a learning rate (e.g. "
            "optax.scale_by_adam(b1=0.5))."
        )


def optimizer_transform(value: Any) -> optax.GradientTransformation:
    """The optax transformation of an optimiser field: a name (see ``_NAMED_OPTIMIZERS``) or
    an ``optax.GradientTransformation`` without a learning rate, returned as is."""
    if isinstance(value, optax.GradientTransformation):
        return value
    return _NAMED_OPTIMIZERS[value]()


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
    (``None`` = full data) and, when they have an inner loop, ``inner_steps``. Each subclass is
    a pytree (floats are leaves; see the module docstring); a float that sets a code path is
    declared ``dataclasses.field(default=..., metadata={"static": True})``. ``init`` and
    ``step`` refuse a solver that is not resolved (:meth:`check_resolved`): that guard is
    added here to every subclass's methods.
    """

    #: how the x-direction becomes a step: "sgd" (x - lr d, the papers' update), "momentum"
    #: (heavy ball, 0.9), "adam" (Kingma & Ba 2015; the PZOBO experiments' outer optimiser), or
    #: any ``optax.GradientTransformation`` WITHOUT a learning rate, such as
    #: ``optax.scale_by_adam(b1=0.5)``; ``lr_outer`` is the learning rate in every case (the
    #: solver multiplies by its own lr_k), and the step is projected onto x_set.
    outer_optimizer: Any = "sgd"

    name: ClassVar[str] = "solver"
    #: whether ``step`` honours ``problem.x_set`` (projection or LMO)
    supports_x_set: ClassVar[bool] = True
    #: whether the method only works on a bounded ``x_set`` (Frank-Wolfe methods: their linear
    #: minimization oracle has no minimiser on an unbounded set); ``check_problem`` enforces it
    needs_bounded_set: ClassVar[bool] = False
    #: the ``lr_*`` fields that may be ``"auto"`` (filled in by :meth:`resolve`, or, for those
    #: in ``tuned_step_sizes``, by a short tuning run of ``bl.solve`` / ``bl.tune``)
    auto_step_sizes: ClassVar[tuple[str, ...]] = ("lr_outer", "lr_inner")
    #: the words ``lr_inner`` takes in place of a number (SBFW adds its paper's ``"a0"``)
    lr_inner_rules: ClassVar[tuple[str, ...]] = ("auto",)
    #: the ``"auto"`` fields chosen by a tuning run on the user's problem
    #: (:mod:`bilevel.drivers.tuning`) rather than by a rule of :meth:`resolve`; a method whose
    #: ``lr_outer="auto"`` is a rule of its paper (IBCG's gamma from the horizon) sets ``()``
    tuned_step_sizes: ClassVar[tuple[str, ...]] = ("lr_outer",)
    #: the paper that defines the method: authors, title, venue and year (and the algorithm or
    #: theorem, where the paper has several); every registered solver sets it, and
    #: ``bilevel solvers --long`` and ``docs/solvers.md`` list it
    paper: ClassVar[str] = ""
    #: ``lr_inner="auto"`` means ``auto_inner_factor / L_g`` (the paper's inner-step rule), or
    #: what :meth:`inner_step_factor` makes of it on the problem at hand
    auto_inner_factor: ClassVar[float] = 1.0

    #: truncation counts that may be ``"auto"`` (ITD's and PZOBO's N, stocBiO's D and Q), with
    #: the numbers they start at; ``bl.solve`` grows them as the "auto" inner step falls
    auto_counts: ClassVar[dict[str, int]] = {}

    #: what a diverged run's message advises (a method with another knob that scales its
    #: steps names it too: F2SA's lam0)
    divergence_advice: ClassVar[str] = "try smaller step sizes (lr_outer, lr_inner)"

    #: fields whose "auto" the method itself settles inside ``step`` (from the problem's
    #: structure, e.g. F2SA's ``regime``), so ``resolve`` need not fill them in
    auto_in_step: ClassVar[tuple[str, ...]] = ()
    #: ``lr_*`` fields that may be ``None``, meaning a rule of the other step sizes (F2OBO's
    #: ``lr_lagrangian=None`` is ``lr_inner / 2``)
    optional_step_sizes: ClassVar[tuple[str, ...]] = ()
    #: whether the method is online (a stream of rounds: ``bl.solve_online`` on a
    #: ``bl.OnlineProblem``, ``kind == "online"``; ``solvers/online/``) or offline (``bl.solve``)
    online: ClassVar[bool] = False
    #: whether the method's minibatches may come split into ``problem.batch_chunks`` parts
    #: (:class:`bilevel.core.sampling.Chunks`): False for a method that reads a batch row by row
    #: (SABA's per-sample tables), whose batches stay whole
    chunked_batches: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs):
        """Register every solver class as a pytree and guard its ``init``/``step`` (once, here,
        so that no solver has to remember either)."""
        super().__init_subclass__(**kwargs)
        for method in ("init", "step", "round"):
            fn = cls.__dict__.get(method)
            if fn is not None and not getattr(fn, "_checks_resolved", False):
                setattr(cls, method, _requires_resolved(fn))
        _register_pytree(cls)

    # ---- validation ----------------------------------------------------------------------
    def __post_init__(self):
        probe = _concrete_view(self)
        if probe is not None:  # None: traced or batched values, checked when first built
            probe._check_fields()

    def _check_fields(self) -> None:
        """The checks of every solver's common fields, then the subclass's :meth:`validate`."""
        for fld in dataclasses.fields(self):
            value = getattr(self, fld.name)
            words = self.lr_inner_rules if fld.name == "lr_inner" else ("auto",)
            if fld.name == "lr_inner" and isinstance(value, str) and value not in words:
                more = [repr(word) for word in words if word != "auto"]
                raise ValueError(
                    f"{type(self).__name__}(lr_inner={value!r}) is not a step size: use a "
                    "positive float, a schedule k -> step, or 'auto' (1/L_g from bl.diagnose)"
                    + (f", or {' or '.join(more)} (see its docstring)." if more else ".")
                )
            if value is None and fld.name in self.optional_step_sizes:
                continue
            if fld.name.startswith("lr_") and not (
                fld.name in self.auto_step_sizes and isinstance(value, str) and value in words
            ):
                check_step_size(value, f"{type(self).__name__}({fld.name}=...)")
        bs = getattr(self, "batch_size", None)
        if bs is not None and (isinstance(bs, bool) or not isinstance(bs, int) or bs < 1):
            raise ValueError(
                f"{type(self).__name__}(batch_size=...) must be a positive int or None (full "
                f"data), got {bs!r}."
            )
        v = getattr(self, "inner_steps", 1)  # an "auto" count: its start number, when resolved
        if not ("inner_steps" in self.auto_counts and _is_auto(v)) and (
            isinstance(v, bool) or not isinstance(v, int) or v < 1
        ):
            raise ValueError(
                f"{type(self).__name__}(inner_steps=...) must be a positive int, got {v!r}."
            )
        check_optimizer(
            type(self).__name__, "outer_optimizer", self.outer_optimizer, OUTER_OPTIMIZERS
        )
        self.validate()

    def unresolved(self) -> list[str]:
        """Fields still ``"auto"`` that :meth:`resolve` must fill in before ``init``/``step``."""
        return [
            fld.name
            for fld in dataclasses.fields(self)
            if fld.name not in (*self.auto_in_step, *self.auto_counts)
            and _is_auto(getattr(self, fld.name))
        ]

    def untuned(self) -> list[str]:
        """The ``"auto"`` fields a tuning run must choose (``tuned_step_sizes``; see
        :func:`bilevel.tune`), which :meth:`resolve` leaves as they are."""
        return [name for name in self.tuned_step_sizes if _is_auto(getattr(self, name, None))]

    def check_resolved(self) -> None:
        """Raise a clear ValueError if a data-dependent setting is still ``"auto"``."""
        missing = self.unresolved()
        tuned = [name for name in missing if name in self.untuned()]
        if tuned and len(tuned) == len(missing):  # resolve() first: its message below
            raise ValueError(
                f"{type(self).__name__}({tuned[0]}='auto') is chosen by a short tuning run on "
                f"the problem: bl.solve does it, or call tuning = bl.tune(problem, solver, "
                f"steps) and use dataclasses.replace(solver, {tuned[0]}=tuning.step); or give "
                f"{tuned[0]} as a number."
            )
        missing = [name for name in missing if name not in tuned]
        if missing:
            given = ", ".join(f"{name}={getattr(self, name)!r}" for name in missing)
            raise ValueError(
                f"{type(self).__name__}({given}) is not resolved: call "
                f"solver = solver.resolve(problem) before init/step (bl.solve does it), or give "
                f"{' and '.join(missing)} as a number."
            )

    def resolve(self, problem: BilevelProblem) -> Solver:
        """This solver with data-dependent settings filled in (``lr_inner="auto"``).

        ``"auto"`` becomes ``inner_step_factor(problem) / L_g`` with L_g estimated by
        :func:`bilevel.analysis.diagnose` at ``(x0, y0)``, or, when the run draws minibatches,
        the minibatches' L_g where it is larger (:meth:`curvature_batch`). ``solve`` calls this
        before compiling. ``"auto"`` truncation counts become their start numbers
        (:attr:`auto_counts`).
        """
        solver = self.with_counts()
        if _is_auto(getattr(solver, "lr_inner", None)):
            from bilevel.analysis.diagnose import auto_inner_step

            batch = solver.curvature_batch(problem)
            step = auto_inner_step(problem, solver.inner_step_factor(problem), batch)
            return dataclasses.replace(solver, lr_inner=step)
        return solver

    def with_counts(self) -> Solver:
        """This solver with its ``"auto"`` truncation counts set to the numbers they start at
        (:attr:`auto_counts`; part of :meth:`resolve`)."""
        auto = {name: n for name, n in self.auto_counts.items() if _is_auto(getattr(self, name))}
        return dataclasses.replace(self, **auto) if auto else self  # usually: nothing to do

    def inner_step_factor(self, problem: BilevelProblem) -> float:
        """The factor of ``lr_inner="auto"`` (times ``1 / L_g``) on ``problem``:
        :attr:`auto_inner_factor` here; a method whose paper bounds the step more tightly
        when the inner gradients are sampled overrides this (F2SA)."""
        del problem
        return self.auto_inner_factor

    def curvature_batch(self, problem: BilevelProblem) -> int | None:
        """The batch size whose Hessians bound the ``"auto"`` inner steps: ``batch_size`` when
        the run draws minibatches (a step on a minibatch is stable only below 2 / its own
        curvature, which exceeds the full data's when the batch has fewer rows than y has
        entries: :func:`bilevel.analysis.diagnose.batch_smoothness`), else None (the full
        data's L_g)."""
        return self.batch_size if self.draws_minibatches(problem) else None

    def draws_minibatches(self, problem: BilevelProblem) -> bool:
        """Whether a run of this solver on ``problem`` draws minibatches (its steps are noisy):
        the problem has data and ``batch_size`` is set."""
        return problem.stochastic and getattr(self, "batch_size", None) is not None

    def outer_step_decays(self, problem: BilevelProblem) -> bool:
        """Whether the method's own schedule already decays its outer step over the run (the
        papers' decreasing regimes: F2SA's and F3SA's ``k^-a``, the ``1/(k + k0)`` of TTSA, BSA,
        SOBA and STABLE's ``"strongly-convex"``). ``bl.solve`` adds no tail decay to a tuned
        ``lr_outer`` of such a method (:class:`bilevel.core.schedules.TailDecay`). Constant
        steps here; a method with a decaying regime overrides this."""
        del problem
        return False

    def with_horizon(self, steps: int) -> Solver:
        """This solver told the run's horizon K (``bl.solve`` calls it with ``steps``).

        Methods whose step sizes depend on K (IBCG's ``gamma = log K / K``) declare a field
        ``horizon`` (default ``None`` = "the run's"); this fills a ``None`` horizon with
        ``steps`` and leaves everything else alone. The horizon is a float leaf, so runs of
        different lengths share one compiled program.
        """
        if getattr(self, "horizon", 0) is None:
            return dataclasses.replace(self, horizon=float(steps))
        return self

    def state_metrics(self, state: Any) -> dict[str, jax.Array]:
        """Metrics the method records in its own state, for ``solve``'s history.

        By default the norm of the last outer direction (``hypergrad_estimate_norm``, see
        :class:`OuterState`); a method adds its own cheap by-products by overriding this (IBCG
        and SBFW: the Frank-Wolfe gap of their hypergradient estimate).
        """
        outer_state = getattr(state, "outer_state", None)
        if isinstance(outer_state, OuterState):
            return {"hypergrad_estimate_norm": outer_state.direction_norm}
        return {}

    def validate(self) -> None:  # noqa: B027  (optional hook, deliberately empty)
        """Extra checks of the hyperparameters (override; raise ValueError)."""

    def _check_choices(self, **allowed: Any) -> None:
        """For :meth:`validate`: each named option field holds one of its allowed values, else a
        ValueError ``Cls(field=value) is unknown; use one of allowed``."""
        for field, values in allowed.items():
            value = getattr(self, field)
            if value not in values:
                raise ValueError(
                    f"{type(self).__name__}({field}={value!r}) is unknown; use one of {values}."
                )

    def check_problem(self, problem: BilevelProblem) -> None:
        """Refuse a problem this solver cannot handle, before anything is compiled."""
        if getattr(problem, "kind", None) == "online":  # the problem says its kind
            raise ProblemKindError(
                f"{self.name!r} is an offline solver, but {problem.name} is a "
                f"bl.OnlineProblem (a stream of {problem.horizon} rounds); run it with an "
                "online solver such as 'f2obo' and bl.solve_online (bl.solvers.names('online') "
                "lists them), or run this solver on one round with "
                "bl.solve(problem.round_problem(t), ...)."
            )
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
        if self.needs_bounded_set:
            self._check_bounded_set(problem)
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

    def _check_bounded_set(self, problem: BilevelProblem) -> None:
        """A linear minimization oracle needs a bounded ``x_set``: refuse anything else."""
        from bilevel.core.sets import is_bounded

        if problem.x_set is None:
            raise ValueError(
                f"solver {self.name!r} is a Frank-Wolfe method: it needs a bounded constraint "
                f"set for x, but {problem.name} has no x_set. Give one (e.g. "
                "problem.replace(x_set=bl.sets.L2Ball(radius)) around the region of interest), "
                "or use an unconstrained method."
            )
        if not is_bounded(problem.x_set, like=problem.x0):
            raise ValueError(
                f"solver {self.name!r} is a Frank-Wolfe method: its linear minimization oracle "
                f"needs a bounded x_set, but {type(problem.x_set).__name__} has infinite "
                "diameter; give a bounded set (a ball, simplex or finite box)."
            )

    @classmethod
    def _default(cls, name: str) -> Any:
        """The declared default of field ``name`` (``None`` if it has none)."""
        for fld in dataclasses.fields(cls):
            if fld.name == name and fld.default is not dataclasses.MISSING:
                return fld.default
        return None

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
        return optimizer_transform(self.outer_optimizer)

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
        """The ``outer`` outer and ``inner`` inner minibatches one step will use, each split
        into ``problem.batch_chunks`` parts unless the method reads its batches row by row."""
        return sampling.minibatches(
            key,
            problem.outer_data,
            problem.inner_data,
            getattr(self, "batch_size", None),
            outer=outer,
            inner=inner,
            scheme=problem.sampling,
            chunks=getattr(problem, "batch_chunks", 1) if self.chunked_batches else 1,
        )


# ---- pytree registration -------------------------------------------------------------------------
class _Leaf:
    """The mark of a leaf field in a solver's treedef (the value travels as a child)."""

    def __repr__(self) -> str:
        return "<leaf>"


_LEAF = _Leaf()


def _numeric_field(fld: dataclasses.Field) -> bool:
    """Whether an int given to ``fld`` stands for a float: a step size (``lr_*``) or a field
    annotated ``float``. Such ints travel as float leaves, so ``lr_outer=1`` and ``lr_outer=0.5``
    share one compiled program; ints elsewhere (``batch_size``, ``inner_steps``) are static."""
    return fld.name.startswith("lr_") or "float" in str(fld.type)


def _is_leaf(fld: dataclasses.Field, value) -> bool:
    """The flatten rule: floats, arrays (tracers included) and tuples of floats are leaves,
    unless the field says ``metadata={"static": True}``, and so are the numbers of a
    ``TracedSchedule``; bools, ints, None, strings and other callables are static (they set
    shapes or code paths)."""
    if fld.metadata.get("static", False) or isinstance(value, bool | np.bool_):
        return False
    if isinstance(value, float | np.floating | np.ndarray | jax.Array | TracedSchedule):
        return True  # a TracedSchedule is a pytree of float leaves (core/schedules.py)
    if isinstance(value, int | np.integer):
        return _numeric_field(fld)
    return isinstance(value, tuple) and bool(value) and all(_is_float(v) for v in value)


def _is_float(value) -> bool:
    return isinstance(value, float | np.floating) and not isinstance(value, bool)


def _split(solver: Solver) -> tuple[list[tuple[str, Any]], tuple]:
    """``(children, aux)``: the leaf fields ``(name, value)`` and the treedef's static data.

    A solver rebuilt by JAX (unflattened, perhaps with tracers or placeholders such as ``None``
    or ``object()`` as leaves) keeps the structure it was rebuilt with: re-deciding from those
    values would change the treedef.
    """
    aux = solver.__dict__.get("_pytree_aux")
    if aux is not None:
        return [(name, getattr(solver, name)) for name, v in aux if v is _LEAF], aux
    children, static = [], []
    for fld in dataclasses.fields(solver):
        value = getattr(solver, fld.name)
        if _is_leaf(fld, value):
            if isinstance(value, int | np.integer):
                value = float(value)
            children.append((fld.name, value))
            static.append((fld.name, _LEAF))
        else:
            static.append((fld.name, value))
    return children, tuple(static)


def _register_pytree(cls: type) -> None:
    """Register ``cls`` with JAX; unflattening bypasses ``__init__`` and its validation (the
    rebuilt leaves may be tracers or placeholders, and were checked when the solver was built)."""

    def flatten_with_keys(solver):
        children, aux = _split(solver)
        return [(jax.tree_util.GetAttrKey(n), v) for n, v in children], aux

    def flatten(solver):
        children, aux = _split(solver)
        return [v for _, v in children], aux

    def unflatten(aux, children):
        solver = object.__new__(cls)
        leaves = iter(children)
        for name, value in aux:
            object.__setattr__(solver, name, next(leaves) if value is _LEAF else value)
        object.__setattr__(solver, "_pytree_aux", aux)
        return solver

    jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)


def _concrete_view(solver: Solver) -> Solver | None:
    """``solver`` with concrete scalar arrays as Python numbers, for the construction checks;
    ``None`` when a field holds a tracer or a batch of values (a solver built inside ``jit`` or
    ``vmap``, e.g. by ``dataclasses.replace``), which cannot be checked."""
    values = {}
    for fld in dataclasses.fields(solver):
        value = getattr(solver, fld.name)
        if isinstance(value, jax.core.Tracer):
            return None
        if isinstance(value, np.ndarray | np.generic | jax.Array):
            if np.size(value) != 1:
                return None
            value = np.asarray(value).item()
        values[fld.name] = value
    probe = object.__new__(type(solver))
    for name, value in values.items():
        object.__setattr__(probe, name, value)
    return probe


def _is_auto(value) -> bool:
    return isinstance(value, str) and value == "auto"


def _requires_resolved(method):
    """``method`` (a solver's ``init`` or ``step``) preceded by :meth:`Solver.check_resolved`."""

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        self.check_resolved()
        # an "auto" count needs no data: unresolved, it is the number it starts at
        return method(self.with_counts(), *args, **kwargs)

    guarded._checks_resolved = True
    return guarded

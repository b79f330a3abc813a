"""The online bilevel problem: a stream of rounds t = 1, ..., T, each with its own f_t and g_t.

    at round t the learner commits x_t (and y_t), then receives f_t, g_t and is judged by
    F_t(x_t) = f_t(x_t, y*_t(x_t)),   y*_t(x) = argmin_y g_t(x, y)

(problem (P1) of Jia & Chen, "Fully First-Order Algorithms for Online Non-Convex Bilevel
Optimization", arXiv:2602.11665). ``outer`` is f and ``inner`` is g, both called as
``fn(t, x, y, batch)``.

**Rounds count from 1**, as in the paper: ``t`` is 1, ..., ``horizon`` (a traced int32 inside
solvers), so the multiplier rule lambda_{t+1} = (1 + 1/t)^tau lambda_t and the paper's
examples (g_t = mu_g/2 (y - (-1)^t x)^2) read as printed; round t's slice of held data is index
``t - 1``. Every check that can be made before a long computation is made at construction, as
``bl.BilevelProblem`` does, with the same messages.
"""

from __future__ import annotations

import dataclasses
import operator
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from bilevel.core import streams as _data
from bilevel.core.problem import (
    BilevelProblem,
    _ProblemCopies,
    check_finite,
    check_metrics_output,
    check_scalar_output,
    start_in_x_set,
)

PyTree = Any

__all__ = ["OnlineProblem"]

_OWNER = "OnlineProblem"
#: a traced round, for the construction checks (``fn(t, x0, y0, batch)`` with an abstract t)
_ROUND = jax.ShapeDtypeStruct((), jnp.int32)


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True, eq=False)
class OnlineProblem(_ProblemCopies):
    """An online bilevel problem over ``horizon`` rounds (rounds count from 1).

    Args:
        outer: ``f(t, x, y, batch) -> scalar``, round t's upper-level (mean) loss; ``t`` is the
            round, a traced int32 in 1..horizon.
        inner: ``g(t, x, y, batch) -> scalar``, round t's lower-level loss, strongly convex in
            ``y`` (every method here assumes it).
        horizon: T, the number of rounds (a positive int).
        x0, y0: the committed decisions of round 1 (x_1, y_1): pytrees of float arrays, or
            models with other leaves too (an ``equinox.Module``), as in ``BilevelProblem``.
        x_set: a ``bl.sets`` constraint set X for x (``None`` = unconstrained); an ``x0``
            outside it is projected with a ``UserWarning``, as in ``BilevelProblem``.
        outer_data, inner_data: per-round data of each level: ``None`` (deterministic; ``batch``
            is ``None``), a pytree whose leaves have leading axes ``(rounds, samples)`` with
            ``rounds == horizon`` (``batch`` is a minibatch of round t's samples, or all of
            them with ``batch_size=None``), or a sampler ``data(t, key) -> batch`` (leaves with
            a leading sample axis) for streams too large to hold; solvers then draw
            ``data(t, key_i)`` with their own keys, and evaluations use the draw at
            ``jax.random.PRNGKey(0)`` as round t's data.
        metrics: optional ``metrics(t, x, y) -> dict[str, scalar]``, evaluated by
            ``solve_online`` at every round's committed (x_t, y_t), outside the timed region.
        name: a label used in results and plots.
        reference: optional closed forms of a synthetic stream, jit-able functions of a traced
            round t: ``y_star(t, x)``, ``grad_F(t, x)``, ``F(t, x)`` (``solve_online`` takes its
            regret from ``grad_F`` when present; ``bl.metrics.variation`` reads them). Solvers
            never read it; compared by identity.

    Raises:
        TypeError / ValueError: at construction, naming the argument and the fix: ``f`` or
            ``g`` not callable, failing on ``(t, x0, y0, batch)`` with a traced t, or not
            scalar-valued; ``horizon`` not a positive int; data whose rounds axis differs from
            ``horizon``, whose leaves disagree on the sample count, or that holds non-finite
            values or values whose square overflows the dtype (named with the first offending
            round and sample); such ``x0`` / ``y0``; a bad ``x_set`` or ``metrics``.
    """

    outer: Callable[..., Any]
    inner: Callable[..., Any]
    horizon: int
    x0: PyTree
    y0: PyTree
    x_set: Any = None
    outer_data: Any = None
    inner_data: Any = None
    metrics: Callable[..., dict] | None = None
    name: str = "online problem"
    reference: Any = None

    #: the kind of problem a solver checks (see ``BilevelProblem.kind``): a stream of rounds
    kind: ClassVar[str] = "online"

    # ---- pytree: arrays are children; functions, samplers and the horizon are static --------
    def tree_flatten(self):
        held = [None if _data.is_sampler(d) else d for d in (self.outer_data, self.inner_data)]
        samplers = tuple(d if _data.is_sampler(d) else None for d in self._levels())
        children = (self.x0, self.y0, *held, self.x_set)
        aux = (self.outer, self.inner, self.horizon, self.metrics, self.name, self.reference)
        return children, (*aux, samplers)

    @classmethod
    def tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)
        x0, y0, outer_held, inner_held, x_set = children
        outer, inner, horizon, metrics, name, reference, samplers = aux
        fields = dict(
            outer=outer,
            inner=inner,
            horizon=horizon,
            x0=x0,
            y0=y0,
            x_set=x_set,
            outer_data=outer_held if samplers[0] is None else samplers[0],
            inner_data=inner_held if samplers[1] is None else samplers[1],
            metrics=metrics,
            name=name,
            reference=reference,
        )
        for k, v in fields.items():
            object.__setattr__(obj, k, v)
        return obj

    def _levels(self) -> tuple[Any, Any]:
        return self.outer_data, self.inner_data

    def __post_init__(self):
        for arg in ("outer", "inner"):
            if not callable(getattr(self, arg)):
                raise TypeError(
                    f"OnlineProblem({arg}=...) must be a function fn(t, x, y, batch) -> scalar "
                    f"(t the round), got {type(getattr(self, arg)).__name__}."
                )
        object.__setattr__(self, "horizon", _check_horizon(self.horizon))
        x0, y0 = self._split_models(_OWNER, at=1)
        check_finite(x0, "x0", _OWNER)
        check_finite(y0, "y0", _OWNER)
        object.__setattr__(self, "x0", x0)
        object.__setattr__(self, "y0", y0)
        batches = {}
        for arg in ("outer_data", "inner_data"):
            data = getattr(self, arg)
            if _data.is_sampler(data):
                batches[arg] = _check_sampler(data, arg)
            elif data is not None:
                data = _check_round_data(data, arg, self.horizon)
                object.__setattr__(self, arg, data)
                batches[arg] = jax.tree.map(lambda a: a[0, :2], data)
            else:
                batches[arg] = None
        for arg, fn, batch in (
            ("outer", self.outer, batches["outer_data"]),
            ("inner", self.inner, batches["inner_data"]),
        ):
            _check_signature(arg, fn, x0, y0, batch)
        if self.x_set is not None:
            object.__setattr__(self, "x0", start_in_x_set(self.x_set, x0, _OWNER))
        if self.metrics is not None:
            _check_metrics(self.metrics, self.x0, y0)

    # ---- sizes ------------------------------------------------------------------------------
    @property
    def n_outer(self) -> int | None:
        """Outer samples per round (per draw for a sampler); ``None`` if deterministic."""
        return _data.samples_per_draw(self.outer_data)

    @property
    def n_inner(self) -> int | None:
        """Inner samples per round (per draw for a sampler); ``None`` if deterministic."""
        return _data.samples_per_draw(self.inner_data)

    @property
    def sampled(self) -> bool:
        """Whether a level is given by a sampler ``data(t, key)`` (no held samples)."""
        return any(_data.is_sampler(d) for d in self._levels())

    # ---- per round ----------------------------------------------------------------------------
    def at_round(self, t) -> tuple[Callable, Callable]:
        """``(f_t, g_t)``: the round's functions ``fn(x, y, batch)`` (``t`` may be traced), the
        form every oracle and shared solver piece takes."""
        f, g = self.outer, self.inner
        return (lambda x, y, batch: f(t, x, y, batch)), (lambda x, y, batch: g(t, x, y, batch))

    def minibatches(self, t, key: jax.Array, batch_size: int | None, *, outer: int, inner: int):
        """Round t's ``outer`` outer and ``inner`` inner draws (``bilevel.core.streams``)."""
        return _data.round_minibatches(
            self.outer_data, self.inner_data, t, key, batch_size, outer=outer, inner=inner
        )

    def evaluation_data(self, t) -> tuple[PyTree, PyTree]:
        """``(outer, inner)`` data that stands for round t in evaluations: all of its held
        samples, or a sampler's draw at the fixed evaluation key."""
        return (
            _data.evaluation_data(self.outer_data, t),
            _data.evaluation_data(self.inner_data, t),
        )

    def round_problem(self, t: int) -> BilevelProblem:
        """Round ``t`` (a concrete int, 1..horizon) as an offline ``bl.BilevelProblem``: f_t and
        g_t on that round's evaluation data, starting at (x0, y0). ``bl.diagnose`` estimates
        mu_g, L_g on round 1 through it (``lr_inner="auto"``), and an offline solver can be run
        on one round with it. Cached per problem and round."""
        t = _check_round(t, self.horizon)
        cache = _ROUND_PROBLEMS.setdefault(self, {})
        if t not in cache:
            cache[t] = self._build_round_problem(t)
        return cache[t]

    def _build_round_problem(self, t: int) -> BilevelProblem:
        round_t = jnp.asarray(t, jnp.int32)
        outer_data, inner_data = jax.tree.map(np.asarray, self.evaluation_data(round_t))
        f, g = self.at_round(round_t)
        metrics = self.metrics
        return BilevelProblem(
            outer=f,
            inner=g,
            x0=self.x0,
            y0=self.y0,
            outer_data=outer_data,
            inner_data=inner_data,
            x_set=self.x_set,
            metrics=None if metrics is None else (lambda x, y: metrics(round_t, x, y)),
            name=f"{self.name} (round {t})",
        )


_ROUND_PROBLEMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


# ---------------------------------------------------------------------------------------------
def _check_horizon(horizon) -> int:
    if isinstance(horizon, bool) or not isinstance(horizon, int | np.integer) or horizon < 1:
        hint = ""
        if isinstance(horizon, float | np.floating) and float(horizon).is_integer():
            hint = f" (horizon={int(horizon)} as an int)"
        raise ValueError(
            f"OnlineProblem(horizon={horizon!r}) must be a positive int, the number of rounds T "
            f"of the stream{hint}; e.g. horizon=100 with per-round data of shape (100, "
            "samples, ...)."
        )
    return operator.index(horizon)


def _check_round(t, horizon: int) -> int:
    if isinstance(t, bool) or not isinstance(t, int | np.integer) or not 1 <= t <= horizon:
        raise ValueError(
            f"round t={t!r} is not a round of this problem: rounds count from 1 to "
            f"horizon={horizon}."
        )
    return int(t)


def _check_round_data(data: PyTree, arg: str, horizon: int) -> PyTree:
    """Held per-round data: every leaf ``(horizon, samples, ...)``, samples agreeing, finite."""
    leaves = jax.tree_util.tree_leaves_with_path(data)
    if not leaves:
        raise ValueError(f"OnlineProblem({arg}=...) holds no arrays; use None for no data.")
    samples = {}
    for path, leaf in leaves:
        where = jax.tree_util.keystr(path) or "(root)"
        shape = np.shape(leaf)
        if len(shape) < 2:
            raise ValueError(
                f"OnlineProblem({arg}=...) leaf {where} has shape {shape}; per-round data needs "
                f"leading axes (rounds, samples): give it shape ({horizon}, samples, ...)."
            )
        if shape[0] != horizon:
            raise ValueError(
                f"OnlineProblem({arg}=...) leaf {where} has {shape[0]} rounds on its leading "
                f"axis but horizon={horizon}: give one slice of samples per round, shape "
                f"({horizon}, samples, ...), or set horizon={shape[0]}."
            )
        samples[where] = shape[1]
    if len(set(samples.values())) > 1:
        listing = ", ".join(f"{k}: {v}" for k, v in samples.items())
        raise ValueError(
            f"OnlineProblem({arg}=...) leaves disagree on the number of samples per round "
            f"(second axis): {listing}."
        )
    if next(iter(samples.values())) == 0:
        raise ValueError(f"OnlineProblem({arg}=...) has zero samples per round.")
    data = jax.tree.map(jnp.asarray, data)
    check_finite(data, arg, _OWNER, axes=("round", "sample"))
    return data


def _check_sampler(sampler, arg: str) -> PyTree:
    """A sampler ``data(t, key) -> batch``: leaves with one leading sample axis, and a finite
    draw at round 1. Returns the batch's shapes (for the signature checks)."""
    try:
        spec = jax.eval_shape(sampler, _ROUND, jax.random.PRNGKey(0))
    except Exception as err:
        raise ValueError(
            f"OnlineProblem({arg}=...) is a function, so it must be a sampler data(t, key) -> "
            f"batch (t the round, a traced int32; key a PRNG key); calling it that way failed "
            f"with {type(err).__name__}: {err}"
        ) from err
    leaves = jax.tree_util.tree_leaves_with_path(spec)
    sizes = {jax.tree_util.keystr(p) or "(root)": s.shape[:1] for p, s in leaves}
    if not sizes or any(len(n) == 0 for n in sizes.values()) or len(set(sizes.values())) > 1:
        raise ValueError(
            f"OnlineProblem({arg}=...) sampler must return a pytree of arrays sharing a leading "
            f"sample axis, got leading shapes {sizes}."
        )
    draw = sampler(jnp.ones((), jnp.int32), jax.random.PRNGKey(0))
    check_finite(draw, f"{arg}(1, key)", _OWNER, axes=("row",))
    return spec


def _check_signature(arg: str, fn, x0, y0, batch) -> None:
    try:
        out = jax.eval_shape(fn, _ROUND, x0, y0, batch)
    except Exception as err:  # the user's function failed on the given shapes: say so plainly
        shapes = (
            f"t a traced int32 round, x0 shapes {jax.tree.map(jnp.shape, x0)}, y0 shapes "
            f"{jax.tree.map(jnp.shape, y0)}, batch "
            f"{'None' if batch is None else jax.tree.map(jnp.shape, batch)}"
        )
        raise ValueError(
            f"OnlineProblem({arg}=...) could not be evaluated as {arg}(t, x0, y0, batch) with "
            f"{shapes}: {type(err).__name__}: {err}"
        ) from err
    check_scalar_output(out, arg, _OWNER)


def _check_metrics(metrics, x0: PyTree, y0: PyTree) -> None:
    try:
        out = jax.eval_shape(metrics, _ROUND, x0, y0)
    except Exception as err:
        raise ValueError(
            f"OnlineProblem(metrics=...) could not be evaluated as metrics(t, x0, y0) (it must "
            f"be a jit-able function of the round t, x and y): {type(err).__name__}: {err}"
        ) from err
    check_metrics_output(out, _OWNER)

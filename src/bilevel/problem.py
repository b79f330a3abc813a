"""The bilevel problem: two scalar functions, their data, a start and an optional set for x.

    min_{x in X} F(x) = f(x, y*(x))    s.t.   y*(x) = argmin_y g(x, y)

``outer`` is f and ``inner`` is g. Both are called as ``fn(x, y, batch)`` where ``batch`` is a
minibatch slice of the corresponding data pytree (leading axis = samples), or ``None`` when the
problem is deterministic. Every check that can be made before a long computation is made here,
at construction, so bad input fails with a message instead of a traceback from inside a scan.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any, Self

import jax
import jax.numpy as jnp
import numpy as np

from . import sampling

PyTree = Any

__all__ = ["BilevelProblem", "ProblemKindError"]


class ProblemKindError(TypeError, ValueError):
    """A solver or driver was given the other kind of problem: an online solver (or
    ``bl.solve_online``) a ``BilevelProblem``, or an offline solver (or ``bl.solve``) an
    ``OnlineProblem``. It is both a ``TypeError`` (the wrong kind of object) and a
    ``ValueError`` (a bad argument), so either ``except`` catches it."""


class _ProblemCopies:
    """What ``BilevelProblem`` and ``bl.OnlineProblem`` share beyond their checks: the
    projection onto ``x_set``, the copies, and whether a level has data. Both are frozen
    dataclasses and pytrees whose children start with ``(x0, y0)``."""

    @property
    def stochastic(self) -> bool:
        return self.outer_data is not None or self.inner_data is not None

    def project_x(self, x: PyTree) -> PyTree:
        """Projection onto ``x_set`` (identity when unconstrained)."""
        return x if self.x_set is None else self.x_set.project(x)

    def with_start(self, x0: PyTree, y0: PyTree) -> Self:
        """A copy starting at ``(x0, y0)`` (an online problem: committing them at round 1),
        without re-validation (usable under jit/vmap, e.g. for random starts drawn per seed)."""
        children, aux = self.tree_flatten()
        return type(self).tree_unflatten(aux, (x0, y0, *children[2:]))

    def replace(self, **changes) -> Self:
        """A copy with some fields changed (re-validated)."""
        return dataclasses.replace(self, **changes)


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True, eq=False)
class BilevelProblem(_ProblemCopies):
    """A bilevel problem ``min_x f(x, y*(x))`` with ``y*(x) = argmin_y g(x, y)``.

    Args:
        outer: ``f(x, y, batch) -> scalar``, the upper-level (mean) loss.
        inner: ``g(x, y, batch) -> scalar``, the lower-level (mean) loss; every method in this
            library assumes it is strongly convex in ``y``.
        x0, y0: starting points, any pytrees of floating arrays.
        outer_data, inner_data: pytrees of arrays whose leaves share a leading sample axis, or
            ``None`` for a deterministic level (then ``batch`` is ``None``).
        x_set: a ``bl.sets`` constraint set for ``x`` (``None`` = unconstrained). An ``x0``
            outside it is projected onto it with a ``UserWarning`` (we chose projecting over
            refusing because every constrained method here projects or uses an LMO anyway).
        metrics: optional ``metrics(x, y) -> dict[str, scalar]`` evaluated by ``solve`` every
            ``eval_every`` steps (outside the timed region). Problems with a closed form
            (``bl.problems.quadratic``) supply exact ones such as ``grad_norm``.
        name: a label used in results and plots.
        reference: optional closed-form information (e.g. ``y_star``, ``grad_F``, ``x_star`` of
            the quadratic family), compared by identity; solvers never read it.
        sampling: how solvers draw minibatches of the data (``bilevel.sampling``): ``"iid"``
            (default; rows uniform with replacement, what the papers analyse) or ``"window"``
            (a cyclic window of consecutive rows at a uniform random start: unbiased, much
            faster for wide rows on CPU, but it needs the rows in random order and draws
            neighbours together; docs/performance.md measures both).

    Raises:
        TypeError / ValueError: at construction, naming the offending argument, when ``f`` or
            ``g`` is not callable, does not accept ``(x0, y0, batch)``, is not scalar-valued; when
            the data leaves disagree on the sample count; when data, ``x0`` or ``y0`` hold
            non-finite values or non-float starts.
    """

    outer: Callable[..., Any]
    inner: Callable[..., Any]
    x0: PyTree
    y0: PyTree
    outer_data: PyTree = None
    inner_data: PyTree = None
    x_set: Any = None
    metrics: Callable[..., dict] | None = None
    name: str = "problem"
    reference: Any = None
    sampling: str = "iid"

    # ---- pytree: arrays are children (traced under jit), functions are static aux data ----
    def tree_flatten(self):
        children = (self.x0, self.y0, self.outer_data, self.inner_data, self.x_set)
        aux = (self.outer, self.inner, self.metrics, self.name, self.reference, self.sampling)
        return children, aux

    @classmethod
    def tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)
        x0, y0, outer_data, inner_data, x_set = children
        outer, inner, metrics, name, reference, scheme = aux
        for k, v in dict(
            outer=outer,
            inner=inner,
            x0=x0,
            y0=y0,
            outer_data=outer_data,
            inner_data=inner_data,
            x_set=x_set,
            metrics=metrics,
            name=name,
            reference=reference,
            sampling=scheme,
        ).items():
            object.__setattr__(obj, k, v)
        return obj

    def __post_init__(self):
        if self.sampling not in sampling.SCHEMES:
            raise ValueError(
                f"BilevelProblem(sampling={self.sampling!r}) is unknown; use one of "
                f"{sampling.SCHEMES}."
            )
        for arg in ("outer", "inner"):
            if not callable(getattr(self, arg)):
                raise TypeError(
                    f"BilevelProblem({arg}=...) must be a function fn(x, y, batch) -> scalar, "
                    f"got {type(getattr(self, arg)).__name__}."
                )
        x0 = as_float_tree(self.x0, "x0")
        y0 = as_float_tree(self.y0, "y0")
        object.__setattr__(self, "x0", x0)
        object.__setattr__(self, "y0", y0)
        for arg in ("outer_data", "inner_data"):
            data = getattr(self, arg)
            if data is not None:
                object.__setattr__(self, arg, _check_data(data, arg))
        check_finite(x0, "x0")
        check_finite(y0, "y0")
        for arg, fn, data in (
            ("outer", self.outer, self.outer_data),
            ("inner", self.inner, self.inner_data),
        ):
            _check_signature(arg, fn, x0, y0, data)
        if self.x_set is not None:
            object.__setattr__(self, "x0", start_in_x_set(self.x_set, x0))

        if self.metrics is not None:
            _check_metrics(self.metrics, x0, self.y0)

    # ---- sizes ------------------------------------------------------------------------------
    @property
    def n_outer(self) -> int | None:
        """Number of outer samples (None if deterministic)."""
        return sampling.num_samples(self.outer_data)

    @property
    def n_inner(self) -> int | None:
        """Number of inner samples (None if deterministic)."""
        return sampling.num_samples(self.inner_data)


# ---------------------------------------------------------------------------------------------
# The checks below are shared with bl.OnlineProblem: ``owner`` names the class in the messages.
def start_in_x_set(x_set, x0: PyTree, owner: str = "BilevelProblem") -> PyTree:
    """``x0``, projected onto ``x_set`` with a ``UserWarning`` when it lies outside, after
    checking that ``x_set`` is a ``bl.sets`` set that fits ``x0``."""
    for meth in ("project", "lmo"):
        if not callable(getattr(x_set, meth, None)):
            raise TypeError(
                f"{owner}(x_set=...) must be a bl.sets set with project() and lmo(), got "
                f"{type(x_set).__name__}."
            )
    _check_x_set(x_set, x0, owner)
    if bool(x_set.contains(x0)):
        return x0
    warnings.warn(
        f"x0 lies outside x_set={type(x_set).__name__}; it was projected onto the set.",
        UserWarning,
        stacklevel=4,
    )
    return x_set.project(x0)


def as_float_tree(tree: PyTree, arg: str, owner: str = "BilevelProblem") -> PyTree:
    leaves = jax.tree.leaves(tree)
    if not leaves:
        raise ValueError(f"{owner}({arg}=...) holds no arrays; give at least one array.")
    out = []
    for leaf in leaves:
        arr = jnp.asarray(leaf)
        if not jnp.issubdtype(arr.dtype, jnp.floating):
            if jnp.issubdtype(arr.dtype, jnp.integer) or arr.dtype == bool:
                arr = arr.astype(jnp.result_type(float))
            else:
                raise TypeError(
                    f"{owner}({arg}=...) leaves must be real arrays, got dtype {arr.dtype}."
                )
        out.append(arr)
    return jax.tree.unflatten(jax.tree.structure(tree), out)


def check_finite(tree: PyTree, arg: str, owner: str = "BilevelProblem") -> None:
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        a = np.asarray(leaf)
        if a.dtype.kind in "fc" and not np.all(np.isfinite(a)):
            bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
            where = jax.tree_util.keystr(path) or "(root)"
            raise ValueError(
                f"{owner}({arg}=...) has {bad} non-finite value(s) (NaN or inf) in leaf "
                f"{where}; every entry must be finite."
            )


def _check_data(data: PyTree, arg: str) -> PyTree:
    leaves = jax.tree.leaves(data)
    if not leaves:
        raise ValueError(f"BilevelProblem({arg}=...) holds no arrays; use None for no data.")
    counts = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(data):
        shape = np.shape(leaf)
        if len(shape) == 0:
            raise ValueError(
                f"BilevelProblem({arg}=...) leaf {jax.tree_util.keystr(path) or '(root)'} is a "
                "scalar; every data leaf needs a leading sample axis."
            )
        counts[jax.tree_util.keystr(path) or "(root)"] = shape[0]
    if len(set(counts.values())) > 1:
        listing = ", ".join(f"{k}: {v}" for k, v in counts.items())
        raise ValueError(
            f"BilevelProblem({arg}=...) leaves disagree on the number of samples (leading axis): "
            f"{listing}."
        )
    if next(iter(counts.values())) == 0:
        raise ValueError(f"BilevelProblem({arg}=...) has zero samples.")
    data = jax.tree.map(jnp.asarray, data)
    check_finite(data, arg)
    return data


def _check_signature(arg: str, fn, x0, y0, data) -> None:
    batch = None if data is None else jax.tree.map(lambda a: a[:2], data)
    try:
        out = jax.eval_shape(fn, x0, y0, batch)
    except Exception as err:  # the user's function failed on the given shapes: say so plainly
        shapes = (
            f"x0 shapes {jax.tree.map(jnp.shape, x0)}, y0 shapes {jax.tree.map(jnp.shape, y0)}, "
            f"batch {'None' if batch is None else jax.tree.map(jnp.shape, batch)}"
        )
        raise ValueError(
            f"BilevelProblem({arg}=...) could not be evaluated as {arg}(x0, y0, batch) with "
            f"{shapes}: {type(err).__name__}: {err}"
        ) from err
    check_scalar_output(out, arg)


def check_scalar_output(out, arg: str, owner: str = "BilevelProblem") -> None:
    """``out`` (an ``eval_shape`` result of f or g) must be one float scalar."""
    leaves = jax.tree.leaves(out)
    if len(leaves) != 1 or leaves[0].shape != ():
        raise ValueError(
            f"{owner}({arg}=...) must return a scalar (the mean loss over the batch), "
            f"got output of shape {jax.tree.map(lambda s: s.shape, out)}."
        )
    if not jnp.issubdtype(leaves[0].dtype, jnp.floating):
        raise ValueError(f"{owner}({arg}=...) must return a float, got {leaves[0].dtype}.")


def _shapes(tree: PyTree) -> PyTree:
    return jax.tree.map(lambda a: tuple(np.shape(a)), tree)


def _check_x_set(x_set, x0: PyTree, owner: str = "BilevelProblem") -> None:
    """``x_set`` must project and take LMOs of pytrees shaped like ``x0`` (before any compile)."""
    name = type(x_set).__name__
    for meth in ("project", "lmo"):
        try:
            out = jax.eval_shape(getattr(x_set, meth), x0)
        except Exception as err:
            reason = str(err).rstrip(".")
            raise ValueError(
                f"{owner}(x_set={name}(...)) does not fit x0 (shapes {_shapes(x0)}): "
                f"x_set.{meth}(x0) fails with {type(err).__name__}: {reason}. Give the set's "
                "parameters (e.g. Box bounds) as scalars, or with the shapes of x0."
            ) from err
        if jax.tree.structure(out) != jax.tree.structure(x0) or _shapes(out) != _shapes(x0):
            raise ValueError(
                f"{owner}(x_set={name}(...)) does not fit x0: x_set.{meth}(x0) has "
                f"shapes {_shapes(out)}, x0 has {_shapes(x0)}. Give the set's parameters (e.g. "
                "Box bounds) as scalars, or with the shapes of x0."
            )


def _check_metrics(metrics, x0: PyTree, y0: PyTree) -> None:
    """``metrics(x, y)`` must return a dict of scalars: one history column each."""
    try:
        out = jax.eval_shape(metrics, x0, y0)
    except Exception as err:
        raise ValueError(
            f"BilevelProblem(metrics=...) could not be evaluated as metrics(x0, y0) (it must be "
            f"a jit-able function of x and y): {type(err).__name__}: {err}"
        ) from err
    check_metrics_output(out)


def check_metrics_output(out, owner: str = "BilevelProblem") -> None:
    """``out`` (an ``eval_shape`` result of ``metrics``) must be a dict name -> scalar."""
    if not isinstance(out, dict):
        raise ValueError(
            f"{owner}(metrics=...) must return a dict name -> scalar, got {type(out).__name__}."
        )
    for key, value in out.items():
        shape = np.shape(value) if not isinstance(value, jax.ShapeDtypeStruct) else value.shape
        if not isinstance(key, str) or shape != ():
            raise ValueError(
                f"{owner}(metrics=...) entry {key!r} has shape {shape}; every metric "
                "must be a scalar (one history column): reduce it (e.g. jnp.linalg.norm) or "
                "return one entry per component."
            )

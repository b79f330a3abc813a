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
from typing import Any, ClassVar, Self

import jax
import jax.numpy as jnp
import numpy as np

from bilevel.core import sampling
from bilevel.core.finite import check_values

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

    # ---- models as variables (an equinox model as x0 or y0) -----------------------------------
    @property
    def model_parts(self) -> tuple[PyTree, PyTree]:
        """``(x_static, y_static)``: what the user's ``x0`` and ``y0`` hold besides parameters
        (their trees with ``None`` at every parameter), or ``None`` for a start made only of
        parameters. ``x0`` and ``y0`` themselves are the parameters (``None`` elsewhere)."""
        fn = self.inner
        return (fn.x_static, fn.y_static) if isinstance(fn, OnModels) else (None, None)

    def models(self, x: PyTree, y: PyTree) -> tuple[PyTree, PyTree]:
        """The user's models at parameters ``x`` and ``y`` (of any leading axes, e.g. seeds):
        ``(x, y)`` themselves unless ``x0`` or ``y0`` held non-parameter leaves."""
        x_static, y_static = self.model_parts
        return combine(x, x_static), combine(y, y_static)

    def parameters(self, x: PyTree, y: PyTree) -> tuple[PyTree, PyTree]:
        """The parameters of models ``x`` and ``y`` (the inverse of :meth:`models`; trees of
        parameters, and any x or y of a problem without models, come back unchanged). Usable
        under jit."""
        x_static, y_static = self.model_parts
        return (
            x if x_static is None else _parameters(x),
            y if y_static is None else _parameters(y),
        )

    def _split_models(self, owner: str, at: int) -> tuple[PyTree, PyTree]:
        """The parameters of ``x0`` and ``y0`` (:func:`split_model`). When either held other
        leaves, ``outer``, ``inner`` and ``metrics`` become :class:`OnModels` views that put
        them back, ``x`` and ``y`` being their arguments ``at`` and ``at + 1``; a copy of such a
        problem (``replace``), whose starts are parameters already, keeps its views' parts."""
        x0, x_static = split_model(self.x0, "x0", owner)
        y0, y_static = split_model(self.y0, "y0", owner)
        if x_static is None and y_static is None:
            x_static, y_static = self.model_parts
        if x_static is not None or y_static is not None:
            for name in ("outer", "inner", "metrics"):
                fn = getattr(self, name)
                if fn is not None:
                    fn = fn.fn if isinstance(fn, OnModels) else fn
                    object.__setattr__(self, name, OnModels(fn, x_static, y_static, at))
        return x0, y0


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True, eq=False)
class BilevelProblem(_ProblemCopies):
    """A bilevel problem ``min_x f(x, y*(x))`` with ``y*(x) = argmin_y g(x, y)``.

    Args:
        outer: ``f(x, y, batch) -> scalar``, the upper-level (mean) loss.
        inner: ``g(x, y, batch) -> scalar``, the lower-level (mean) loss; every method in this
            library assumes it is strongly convex in ``y``.
        x0, y0: starting points: pytrees of float arrays, or models holding other leaves too
            (an ``equinox.Module`` such as ``eqx.nn.MLP``, whose activation is a function).
            Only float arrays are parameters, as in equinox (``eqx.is_inexact_array``); other
            leaves (functions, strings, Python ints and floats) are constants. The solvers see
            the parameters (``problem.x0``: the tree with ``None`` at every constant), while
            ``outer``, ``inner`` and ``metrics`` receive the whole model, so ``model(a)`` works
            in them, and ``bl.solve`` returns models (``problem.models``).
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
        sampling: how solvers draw minibatches of the data (``bilevel.core.sampling``): ``"iid"``
            (default; rows uniform with replacement, what the papers analyse) or ``"window"``
            (a cyclic window of consecutive rows at a uniform random start: unbiased, much
            faster for wide rows on CPU, but it needs the rows in random order and draws
            neighbours together; docs/performance.md measures both).
        batch_chunks: evaluate f and g on every minibatch as the row-weighted mean over this
            many consecutive parts of it (default 1: whole). It needs losses that are means over
            the batch's rows (plus terms that do not read the batch), which is checked on the
            first rows of the data; the values and every derivative are then the whole batch's,
            up to float rounding. Why: a part small enough to stay in the CPU's cache between
            its copy and the products that read it; worth it when each row is large (per-sample
            matrices: 1.3-1.4x per F2SA step on benchopt's quadratic, docs/performance.md item 13),
            not for rows of a few thousand floats. Methods that read batches row by row (SABA)
            keep them whole.

    Raises:
        TypeError / ValueError: at construction, naming the offending argument, when ``f`` or
            ``g`` is not callable, does not accept ``(x0, y0, batch)``, is not scalar-valued; when
            the data leaves disagree on the sample count; when data, ``x0`` or ``y0`` hold
            non-finite values or values whose square overflows the dtype (``|v| >
            sqrt(finfo.max)``, 1.8e19 in float32: named with the leaf, the first offending row
            or index and its value, :mod:`bilevel.core.finite`), when ``x0`` or ``y0`` hold no
            float array, or an array of another dtype (integer, bool, complex: named by its key
            path).
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
    batch_chunks: int = 1

    #: the kind of problem, which a solver checks before anything compiles: ``"offline"`` (one
    #: f and g, ``bl.solve``) or ``"online"`` (a stream of rounds, ``bl.OnlineProblem``)
    kind: ClassVar[str] = "offline"

    # ---- pytree: arrays are children (traced under jit), functions are static aux data ----
    def tree_flatten(self):
        children = (self.x0, self.y0, self.outer_data, self.inner_data, self.x_set)
        aux = (self.outer, self.inner, self.metrics, self.name, self.reference, self.sampling)
        return children, (*aux, self.batch_chunks)

    @classmethod
    def tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)
        x0, y0, outer_data, inner_data, x_set = children
        outer, inner, metrics, name, reference, scheme, batch_chunks = aux
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
            batch_chunks=batch_chunks,
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
        self._set_chunks()
        x0, y0 = self._split_models("BilevelProblem", at=0)
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
            if self.batch_chunks > 1 and data is not None:
                _check_row_mean(arg, fn, x0, y0, data)
        if self.x_set is not None:
            object.__setattr__(self, "x0", start_in_x_set(self.x_set, x0))

        if self.metrics is not None:
            _check_metrics(self.metrics, x0, self.y0)

    def _set_chunks(self) -> None:
        """``outer`` and ``inner`` as :class:`bilevel.core.sampling.ChunkMean` views when
        ``batch_chunks > 1``, the user's functions otherwise (inside an :class:`OnModels` view)."""
        k = self.batch_chunks
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
            raise ValueError(
                f"BilevelProblem(batch_chunks={k!r}) must be a positive int (1: whole batches)."
            )
        object.__setattr__(self, "batch_chunks", int(k))
        for name in ("outer", "inner"):
            object.__setattr__(self, name, _chunked(getattr(self, name), k > 1))

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


def is_parameter(leaf) -> bool:
    """Whether a leaf of ``x0`` / ``y0`` is optimised: a JAX or NumPy array of a float dtype
    (equinox's ``is_inexact_array``, whose complex arrays no method here supports)."""
    return isinstance(leaf, jax.Array | np.ndarray | np.generic) and jnp.issubdtype(
        leaf.dtype, jnp.floating
    )


def split_model(
    tree: PyTree, arg: str, owner: str = "BilevelProblem"
) -> tuple[PyTree, PyTree | None]:
    """``(params, static)``, as ``eqx.partition(tree, eqx.is_inexact_array)``: ``params`` is
    ``tree`` with ``None`` in place of every leaf that is not a float array, ``static`` the
    reverse (or ``None`` when every leaf is a float array).

    A tree made only of numbers (arrays and Python scalars, the usual ``x0``) is all
    parameters: integer and bool leaves and Python scalars are cast to float, as the library
    always did. Only a tree holding something else (a function, a string, a Python bool: a
    model) follows
    equinox's rule; its integer or complex arrays are then refused with their key path, since
    they cannot be optimised and would otherwise silently become constants."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    if all(_is_number(leaf) for _, leaf in leaves):
        return _as_float_tree(tree, arg, owner), None
    for path, leaf in leaves:
        if isinstance(leaf, jax.Array | np.ndarray | np.generic) and not is_parameter(leaf):
            where = jax.tree_util.keystr(path) or "(root)"
            raise TypeError(
                f"{owner}({arg}=...) leaf {where} is an array of dtype {leaf.dtype}, which "
                "cannot be optimised: only float arrays are parameters. Cast it to float "
                "(jnp.asarray(a, float)) to optimise it, or keep it out of the tree (a static "
                "field, eqx.field(static=True), or a constant your functions close over)."
            )
    if not any(is_parameter(leaf) for _, leaf in leaves):
        raise ValueError(
            f"{owner}({arg}=...) holds no float array to optimise (Python ints and floats are "
            "constants, as in equinox); give at least one, e.g. jnp.asarray(1.0)."
        )
    params = [jnp.asarray(a) if is_parameter(a) else None for _, a in leaves]
    static = [None if is_parameter(a) else a for _, a in leaves]
    static_tree = None if all(a is None for a in static) else treedef.unflatten(static)
    return treedef.unflatten(params), static_tree


def _is_number(leaf) -> bool:
    """An array or a Python int/float; a Python bool is a flag (equinox's ``inference=False``
    of a dropout layer), which marks the tree as a model."""
    if isinstance(leaf, bool):
        return False
    return isinstance(leaf, jax.Array | np.ndarray | np.generic | int | float)


def _as_float_tree(tree: PyTree, arg: str, owner: str) -> PyTree:
    """Every leaf of a tree of numbers as a float array (integers and bools cast)."""
    if not jax.tree.leaves(tree):
        raise ValueError(f"{owner}({arg}=...) holds no arrays; give at least one array.")

    def as_float(leaf):
        arr = jnp.asarray(leaf)
        if jnp.issubdtype(arr.dtype, jnp.floating):
            return arr
        if jnp.issubdtype(arr.dtype, jnp.integer) or arr.dtype == bool:
            return arr.astype(jnp.result_type(float))
        raise TypeError(f"{owner}({arg}=...) leaves must be real arrays, got dtype {arr.dtype}.")

    return jax.tree.map(as_float, tree)


def _parameters(tree: PyTree) -> PyTree:
    return jax.tree.map(lambda a: a if is_parameter(a) else None, tree)


def combine(params: PyTree, static: PyTree | None) -> PyTree:
    """The tree of :func:`split_model`'s parts (``eqx.combine``); ``params`` may carry leading
    axes (seeds), and a whole model in their place comes back unchanged."""
    if static is None:
        return params
    return jax.tree.map(
        lambda p, s: s if p is None else p, params, static, is_leaf=lambda a: a is None
    )


class OnModels:
    """``fn`` (``outer``, ``inner`` or ``metrics``) as the solvers call it: with parameter trees
    ``x`` and ``y`` at positions ``at`` and ``at + 1``, which it completes into the user's models
    (:func:`combine` with ``x_static`` and ``y_static``) before calling ``fn``. Compared by
    identity, as a function is (it is static data of the problem's pytree)."""

    def __init__(self, fn: Callable, x_static: PyTree, y_static: PyTree, at: int):
        self.fn, self.x_static, self.y_static, self.at = fn, x_static, y_static, at

    def __call__(self, *args):
        args, i = list(args), self.at
        args[i], args[i + 1] = combine(args[i], self.x_static), combine(args[i + 1], self.y_static)
        return self.fn(*args)

    def __repr__(self) -> str:
        return f"OnModels({self.fn!r})"


def check_finite(
    tree: PyTree, arg: str, owner: str = "BilevelProblem", axes: tuple[str, ...] = ()
) -> None:
    """Refuse NaN, inf and values whose square overflows the dtype (:mod:`bilevel.core.finite`),
    naming the leaf and the first offending entry: its position on the leading ``axes``
    (``("row",)`` for data) or its index."""
    check_values(tree, arg, owner, axes)


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
    check_finite(data, arg, axes=("row",))
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


def users_function(fn: Callable | None) -> Callable | None:
    """The user's own function inside the :class:`OnModels` and
    :class:`bilevel.core.sampling.ChunkMean` views a problem may hold."""
    if isinstance(fn, OnModels):
        fn = fn.fn
    return fn.fn if isinstance(fn, sampling.ChunkMean) else fn


def _chunked(fn: Callable, on: bool) -> Callable:
    """``fn`` as a :class:`bilevel.core.sampling.ChunkMean` view (``on``) or bare, kept inside an
    :class:`OnModels` view; the same object when nothing changes (no recompilation)."""
    if isinstance(fn, OnModels):
        inner = _chunked(fn.fn, on)
        return fn if inner is fn.fn else OnModels(inner, fn.x_static, fn.y_static, fn.at)
    if isinstance(fn, sampling.ChunkMean):
        return fn if on else fn.fn
    return sampling.ChunkMean(fn) if on else fn


def _check_row_mean(arg: str, fn, x0, y0, data) -> None:
    """``batch_chunks > 1`` is exact only for a loss that is a mean over rows: compare ``fn`` on
    the first (up to) four rows with its mean over two halves of them."""
    rows = min(4, sampling.num_samples(data))
    if rows < 2:
        return
    whole = jax.tree.map(lambda a: a[:rows], data)
    a, b = float(fn(x0, y0, whole)), float(fn(x0, y0, sampling.split_rows(whole, 2)))
    if not abs(a - b) <= 1e-4 * max(abs(a), abs(b)) + 1e-6:
        raise ValueError(
            f"BilevelProblem(batch_chunks=...) needs {arg} to be a mean over the batch's rows: "
            f"on the first {rows} rows of {arg}_data it is {a:.6g}, but the mean of its values "
            f"on two halves of them is {b:.6g}. Use batch_chunks=1 for this loss."
        )


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

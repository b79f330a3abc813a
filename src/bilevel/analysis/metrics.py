"""Reference quantities for small problems: the exact inner solution and hypergradient.

``hypergradient`` is the implicit-function-theorem formula with dense linear algebra,

    grad F(x) = grad_x f(x, y*) - (d^2 g/dx dy)(x, y*) [(d^2 g/dy^2)(x, y*)]^{-1} grad_y f(x, y*),

on the full data (every sample), with ``y*(x)`` found by Newton's method. It is the reference
every solver test compares against; it costs O(dim(y)^3) and is meant for small problems.

With a constrained upper level (``problem.x_set``) ``||grad F(x)||`` is not zero at a solution,
so constrained runs are measured by the stationarity measures of constrained smooth
optimisation, both zero exactly at stationary points of F over X:

* :func:`fw_gap`, the Frank-Wolfe gap ``G(x) = max_{s in X} <grad F(x), x - s>`` (Jaggi 2013;
  the criterion of IBCG, Abolfazli et al. 2025, Definition 2.1), which needs a bounded X;
* :func:`grad_mapping`, the gradient mapping ``||x - Proj_X(x - grad F(x))||`` (Nesterov,
  "Introductory Lectures on Convex Optimization", 2004, Sec. 2.2.3), the measure of projected
  methods.

Called with concrete arguments, each of :func:`inner_solution`, :func:`hypergradient`,
:func:`fw_gap`, :func:`grad_mapping` and :func:`default_metrics` runs one program compiled once
per problem structure (its functions, sets and shapes; :func:`clear_cache`), so evaluating many
points costs one compilation; under ``jax.jit``, ``vmap`` or ``grad`` they are traced into the
caller's program as before.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import threading
from collections.abc import Callable, Hashable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from bilevel.core import oracles
from bilevel.core.compiler import jit_options
from bilevel.core.problem import BilevelProblem
from bilevel.core.tree import tree_axpy, tree_norm, tree_scale, tree_sub, tree_vdot

PyTree = Any

__all__ = [
    "inner_solution",
    "newton_inner_solution",
    "hypergradient",
    "dense_hypergradient",
    "reference_hypergradient",
    "fw_gap",
    "grad_mapping",
    "gradient_mapping",
    "default_metrics",
    "variation",
    "Variation",
    "clear_cache",
]

#: ``default_metrics`` adds the exact ``fw_gap`` / ``grad_mapping`` of a constrained problem when
#: x and y have at most this many entries (the dense hypergradient costs O(dim(y)^3) per eval)
EXACT_METRICS_MAX_DIM = 1000


def inner_solution(
    problem: BilevelProblem, x: PyTree, y: PyTree | None = None, *, newton_steps: int = 30
) -> PyTree:
    """y*(x) by ``newton_steps`` Newton iterations on the full-data g, from ``y`` (or y0).

    Exact in one step for quadratic g; quadratically convergent for strongly convex smooth g.
    Models (an ``equinox.Module`` as x0 / y0) may be given whole; y* comes back as parameters
    (``None`` at the model's constants, like ``problem.y0``).
    """
    x, y = problem.parameters(x, problem.y0 if y is None else y)
    return _cached(_inner_solution, problem, x, y, newton_steps=newton_steps)


def _inner_solution(problem: BilevelProblem, x: PyTree, y: PyTree, newton_steps: int) -> PyTree:
    return newton_inner_solution(problem.inner, x, y, problem.inner_data, newton_steps)


def newton_inner_solution(inner, x: PyTree, y: PyTree, inner_data, newton_steps: int = 30):
    """argmin_y ``inner(x, y, inner_data)`` by ``newton_steps`` dense Newton steps from ``y``
    (the functional core of :func:`inner_solution`, shared with ``bl.solve_online``'s regret,
    which calls it on one round's functions and data)."""
    flat_y, unravel = ravel_pytree(y)

    def newton(fy, _):
        yt = unravel(fy)
        grad = ravel_pytree(oracles.grad_y(inner, x, yt, inner_data))[0]
        hess = oracles.hessian_yy(inner, x, yt, inner_data)
        return fy - jnp.linalg.solve(hess, grad), None

    flat_y, _ = jax.lax.scan(newton, flat_y, None, length=newton_steps)
    return unravel(flat_y)


def hypergradient(
    problem: BilevelProblem, x: PyTree, y: PyTree | None = None, *, newton_steps: int = 30
) -> PyTree:
    """The exact hypergradient grad F(x) (IFT with a dense inner solve), shaped like x's
    parameters (for a model, ``None`` at its constants, as ``eqx.filter_grad`` returns)."""
    x, y = problem.parameters(x, problem.y0 if y is None else y)
    return _cached(_hypergradient, problem, x, y, newton_steps=newton_steps)


def _hypergradient(problem: BilevelProblem, x: PyTree, y: PyTree, newton_steps: int) -> PyTree:
    return dense_hypergradient(
        problem.outer, problem.inner, x, y, problem.outer_data, problem.inner_data, newton_steps
    )


def dense_hypergradient(
    outer, inner, x: PyTree, y: PyTree, outer_data, inner_data, newton_steps: int = 30
) -> PyTree:
    """grad F(x) of ``f = outer``, ``g = inner`` on the given data: y*(x) by dense Newton from
    ``y``, then the IFT formula with a dense Hessian solve (the core of :func:`hypergradient`).
    """
    y_star = newton_inner_solution(inner, x, y, inner_data, newton_steps)
    gx_f, gy_f = oracles.grads(outer, x, y_star, outer_data)
    flat_gy, _ = ravel_pytree(gy_f)
    hess = oracles.hessian_yy(inner, x, y_star, inner_data)
    v = jnp.linalg.solve(hess, flat_gy)
    cross = oracles.jacobian_xy(inner, x, y_star, inner_data) @ v
    flat_gx, unravel_x = ravel_pytree(gx_f)
    return unravel_x(flat_gx - cross)


def reference_hypergradient(
    outer,
    inner,
    x: PyTree,
    y: PyTree,
    outer_data,
    inner_data,
    *,
    gd_steps: int = 2000,
    cg_steps: int = 200,
    power_steps: int = 30,
) -> PyTree:
    """grad F(x) for a y too large for dense Hessians: a high-accuracy matrix-free reference.

    y*(x) by ``gd_steps`` gradient steps on g(x, .) from ``y`` with step ``1 / L``, where L is
    the spectral radius of d^2 g/dy^2 at (x, y) (its largest eigenvalue when g is convex in y),
    estimated as ``||H u|| / ||u||`` after ``power_steps`` power iterations ``u <- H u`` on
    Hessian-vector products (never above the true L; GD is stable for any step below 2/L, so an
    estimate within a factor 2 suffices). Not the Rayleigh quotient ``u^T H u / u^T u``: for a
    non-convex g (a network's weights) the power iteration may settle on a direction of
    negative curvature, where that quotient is negative and ``1 / L`` would be a huge step
    (a NaN reference; issue #35). Then the adjoint
    ``v = [d^2 g/dy^2]^{-1} grad_y f`` by ``cg_steps`` conjugate-gradient iterations
    (``bilevel.core.linsolve.cg``) and ``grad F = grad_x f - (d^2 g/dx dy) v``. Its accuracy is the
    inner problem's: ``(1 - 1/kappa)^gd_steps`` for condition number kappa.
    """
    from bilevel.core.linsolve import cg

    def hvp(y_, v):
        return oracles.hvp_yy(inner, x, y_, inner_data, v)

    def power(v, _):
        w = hvp(y, v)
        return tree_scale(1.0 / jnp.maximum(tree_norm(w), 1e-30), w), None

    # a fixed pseudo-random start: a structured one (all ones) may miss the top eigenvector
    leaves, treedef = jax.tree.flatten(y)
    keys = jax.random.split(jax.random.PRNGKey(0), len(leaves))
    noise = [jax.random.normal(k, a.shape, a.dtype) for k, a in zip(keys, leaves, strict=True)]
    start = jax.tree.unflatten(treedef, noise)
    v, _ = jax.lax.scan(power, start, None, length=power_steps)
    # 1 / L with L = ||H v|| / ||v||, positive whatever the sign of the curvature along v
    step = tree_norm(v) / jnp.maximum(tree_norm(hvp(y, v)), 1e-30)

    def descend(y_, _):
        return tree_axpy(-step, oracles.grad_y(inner, x, y_, inner_data), y_), None

    y_star, _ = jax.lax.scan(descend, y, None, length=gd_steps)
    gx_f, gy_f = oracles.grads(outer, x, y_star, outer_data)
    adjoint = cg(lambda u: hvp(y_star, u), gy_f, num_iters=cg_steps)
    return tree_sub(gx_f, oracles.cross_xy(inner, x, y_star, inner_data, adjoint))


def _require_x_set(problem: BilevelProblem, metric: str):
    if problem.x_set is None:
        raise ValueError(
            f"{metric} needs a constrained upper level, but {problem.name} has no x_set; for an "
            "unconstrained problem use ||hypergradient(problem, x)||."
        )
    return problem.x_set


def fw_gap(problem: BilevelProblem, x: PyTree, grad: PyTree | None = None) -> jax.Array:
    """The Frank-Wolfe gap ``G(x) = max_{s in X} <grad F(x), x - s> = <grad F(x), x - LMO>``.

    Zero exactly at stationary points of F over X and an upper bound on ``F(x) - F*`` when F is
    convex (Abolfazli et al. 2025, Definition 2.1 and eq. (38)). Uses the exact dense
    :func:`hypergradient` unless ``grad`` is given (a solver's estimate gives the cheap
    surrogate ``<F_k, x_k - s_k>``).

    Raises:
        ValueError: when the problem has no ``x_set`` (or ``x_set.lmo`` refuses, as
            ``Reals`` does).
    """
    _require_x_set(problem, "fw_gap")
    return _cached(_fw_gap, problem, x, grad)


def _fw_gap(problem: BilevelProblem, x: PyTree, grad: PyTree | None) -> jax.Array:
    grad = hypergradient(problem, x) if grad is None else grad
    return tree_vdot(grad, tree_sub(x, problem.x_set.lmo(grad)))


def grad_mapping(
    problem: BilevelProblem, x: PyTree, step: float = 1.0, grad: PyTree | None = None
) -> jax.Array:
    """``||x - Proj_X(x - step * grad F(x))|| / step``, with the exact :func:`hypergradient`
    unless ``grad`` is given.

    The gradient mapping (Nesterov 2004, Sec. 2.2.3): ``||grad F(x)||`` when x is interior,
    zero exactly at stationary points of F over X.

    Raises:
        ValueError: when the problem has no ``x_set``.
    """
    _require_x_set(problem, "grad_mapping")
    return _cached(_grad_mapping, problem, x, step, grad)


def _grad_mapping(problem: BilevelProblem, x: PyTree, step, grad: PyTree | None) -> jax.Array:
    grad = hypergradient(problem, x) if grad is None else grad
    return tree_norm(gradient_mapping(problem.x_set, x, grad, step))


def gradient_mapping(x_set, x: PyTree, grad: PyTree, step) -> PyTree:
    """The vector ``G_X(x, grad, step) = (x - Proj_X(x - step * grad)) / step`` (Nesterov 2004,
    Sec. 2.2.3; eq. (3) of Jia & Chen, arXiv:2602.11665), shaped like x; ``grad`` itself when
    ``x_set`` is ``None`` (unconstrained)."""
    if x_set is None:
        return grad
    moved = x_set.project(jax.tree.map(lambda a, g: a - step * g, x, grad))
    return jax.tree.map(lambda a, m: (a - m) / step, x, moved)


def _constrained_metrics(problem: BilevelProblem, x: PyTree, y: PyTree) -> dict[str, jax.Array]:
    """``fw_gap`` (bounded sets with an LMO) and ``grad_mapping`` of a small constrained
    problem, from one exact hypergradient; nothing for a large or unconstrained one."""
    from bilevel.core import sets

    dims = (ravel_pytree(x)[0].size, ravel_pytree(y)[0].size)
    if problem.x_set is None or max(dims) > EXACT_METRICS_MAX_DIM:
        return {}
    grad = hypergradient(problem, x, y)
    out = {"grad_mapping": grad_mapping(problem, x, grad=grad)}
    # the sets whose LMO is finite by construction (a Box may have infinite bounds, and whether
    # they are is not known while the set's parameters are traced)
    if isinstance(problem.x_set, sets.L2Ball | sets.L1Ball | sets.Simplex | sets.NuclearBall):
        out["fw_gap"] = fw_gap(problem, x, grad)
    return out


def default_metrics(problem: BilevelProblem, x: PyTree, y: PyTree) -> dict[str, jax.Array]:
    """Cheap metrics every problem gets: full-data outer loss and inner gradient norm.

    For a constrained problem (``x_set``) with at most ``EXACT_METRICS_MAX_DIM`` entries in x
    and in y, also the exact ``grad_mapping`` and (for a ball or simplex) ``fw_gap``, which
    measure stationarity where ``||grad F||`` does not (one dense hypergradient per call).
    Plus the problem's own ``metrics(x, y)`` (exact ones for closed-form problems). A problem
    whose full data is too large to evaluate often may return its own ``outer_loss`` /
    ``inner_grad_norm`` (on a fixed subset, say, documented by the problem); those replace the
    full-data ones, which are then not computed.
    """
    return _cached(_default_metrics, problem, x, y)


def _default_metrics(problem: BilevelProblem, x: PyTree, y: PyTree) -> dict[str, jax.Array]:
    own = {}
    if problem.metrics is not None:
        own = {k: jnp.asarray(v) for k, v in problem.metrics(x, y).items()}
    out = loss_metrics(
        problem.outer, problem.inner, x, y, problem.outer_data, problem.inner_data, skip=own
    )
    out.update(_constrained_metrics(problem, x, y))
    out.update(own)
    return out


def loss_metrics(outer, inner, x: PyTree, y: PyTree, outer_data, inner_data, skip=()) -> dict:
    """``outer_loss`` f(x, y) and ``inner_grad_norm`` ||grad_y g(x, y)|| on the given data (the
    cheap metrics of :func:`default_metrics`; ``bl.solve_online`` takes them per round), except
    those named in ``skip`` (a problem's own replace them and are then not computed)."""
    out = {}
    if "outer_loss" not in skip:
        out["outer_loss"] = outer(x, y, outer_data)
    if "inner_grad_norm" not in skip:
        out["inner_grad_norm"] = tree_norm(oracles.grad_y(inner, x, y, inner_data))
    return out


# ---- compiled once per problem structure ------------------------------------------------------
try:  # whether no jit / vmap / grad trace is active: JAX spells it only privately
    from jax._src.core import trace_state_clean as _no_trace_active
except ImportError:  # pragma: no cover - a JAX without it: only tracers in the arguments count

    def _no_trace_active() -> bool:
        return True


#: compiled metric programs kept at most, least recently used dropped first: each holds the
#: problem's functions and an executable, which a long process building many problems would
#: otherwise accumulate
MAX_COMPILED = 64
_COMPILED: collections.OrderedDict[Hashable, Callable] = collections.OrderedDict()
_LOCK = threading.Lock()  # a lookup and its reordering, or an insertion and its evictions


def clear_cache() -> None:
    """Drop every compiled metric program (the next call of each metric compiles again)."""
    with _LOCK:
        _COMPILED.clear()


def _is_argument(leaf) -> bool:
    """Whether ``leaf`` can be a ``jax.jit`` argument as it is (an array or a Python number)."""
    return isinstance(leaf, jax.Array | np.ndarray | np.generic | bool | int | float | complex)


def _cached(fn: Callable, problem: BilevelProblem, *args, **static) -> Any:
    """``fn(problem, *args, **static)``, by one ``jax.jit`` of ``fn`` per ``(fn, static, the
    problem's treedef)``: the treedef holds what the program is built from (``outer``,
    ``inner``, ``metrics``, the set's type), while the problem's arrays (starts, data, the
    set's parameters) and ``args`` are its arguments, so a problem of the same structure with
    other data reuses the program with its own values, and jit's own cache handles shapes and
    dtypes.

    Without it every call re-traced ``fn`` and re-compiled its Newton scan and dense Hessians
    (0.5-0.7 s a call on the 10-variable ``bl.problems.quadratic()``, 5-7 s for the first, on
    a loaded 2-core CPU; a cached call takes under 1 ms). The cache serves only
    concrete calls: under a trace (``default_metrics`` inside a solver's evaluation program,
    ``jax.grad`` through a metric) ``fn`` runs plainly into the caller's program, as before,
    since a cached program must not capture a tracer of a trace that ends. Arguments a jit
    cannot take (a model's functions) and problems whose static data cannot be compared run
    plainly too.
    """
    leaves = jax.tree.leaves((problem, args))
    if not _no_trace_active() or any(isinstance(a, jax.core.Tracer) for a in leaves):
        return fn(problem, *args, **static)
    if not all(_is_argument(a) for a in leaves):
        return fn(problem, *args, **static)
    key = (fn, tuple(sorted(static.items())), jax.tree.structure(problem))
    options = jit_options()
    with _LOCK:
        try:
            compiled = _COMPILED.get(key)
        except (TypeError, ValueError):  # unhashable settings, data compared by value
            key = compiled = None
        if key is not None and compiled is None:  # jit traces at the first call, not here
            compiled = _COMPILED[key] = jax.jit(functools.partial(fn, **static), **options)
            while len(_COMPILED) > MAX_COMPILED:
                _COMPILED.popitem(last=False)
        elif key is not None:
            _COMPILED.move_to_end(key)
    if compiled is None:
        return fn(problem, *args, **static)
    return compiled(problem, *args)


# ---- online streams: variation measures (Jia & Chen, arXiv:2602.11665, eq. (4), Sec. 3.2) ----
@dataclasses.dataclass(frozen=True)
class Variation:
    """The variation measures of a stream, cumulative per round: entry ``t - 1`` sums the
    terms of rounds s = 2..t (so entry 0 is 0 and the last entry is the measure at T).

    Attributes:
        V: V_T = sum_t sup_{x in X} |F_{t-1}(x) - F_t(x)| (function variation, eq. (4)).
        H2: H_{2,T} = sum_t sup_{x in X} ||y*_{t-1}(x) - y*_t(x)||^2 (inner-solution drift).
        E_f, E_g: E^f_{y,T} and E^g_{y,T} = sum_t sup_{x,y} ||grad_y f_t - grad_y f_{t-1}||^2
            (and of g; Sec. 3.2), or ``None`` where not available.
        over: what the suprema over x ran over (a closed form over X, a ball, or a finite set
            of points), said in words.
    """

    V: np.ndarray
    H2: np.ndarray
    E_f: np.ndarray | None
    E_g: np.ndarray | None
    over: str

    @classmethod
    def from_increments(cls, V, H2, E_f=None, E_g=None, *, over: str) -> Variation:
        """From the terms of rounds 2..T (arrays of length T - 1; ``None`` where missing)."""

        def cumulative(terms):
            if terms is None:
                return None
            return np.concatenate([[0.0], np.cumsum(np.asarray(terms, np.float64))])

        return cls(cumulative(V), cumulative(H2), cumulative(E_f), cumulative(E_g), over)

    @property
    def P(self) -> np.ndarray | None:
        """P_T = H_{2,T} + E^f_{y,T} + E^g_{y,T} (Theorem 3.2), when both E terms exist."""
        if self.E_f is None or self.E_g is None:
            return None
        return self.H2 + self.E_f + self.E_g

    def totals(self) -> dict[str, float | None]:
        """The measures at the horizon T: ``V_T``, ``H_2T``, ``E_f_yT``, ``E_g_yT``, ``P_T``."""
        last = {"V_T": self.V, "H_2T": self.H2, "E_f_yT": self.E_f, "E_g_yT": self.E_g}
        last["P_T"] = self.P
        return {k: None if v is None else float(v[-1]) for k, v in last.items()}


def variation(problem, xs: PyTree | None = None, *, radius: float | None = None) -> Variation:
    """The variation measures V_T, H_{2,T} (and E^f_{y,T}, E^g_{y,T}, P_T) of an online problem.

    Exact for the synthetic streams of ``bl.problems`` (``drifting_quadratic``,
    ``oscillating``): their ``reference.variation(x_set, radius)`` evaluates the suprema in
    closed form over X (``radius``: over the ball ||x|| <= radius instead, which an unbounded X
    needs whenever F_t drifts, since V_T is then infinite). Otherwise, from a reference with
    ``F(t, x)`` and ``y_star(t, x)``, V_T and H_{2,T} over the finite set of points ``xs`` (a
    pytree whose leaves have one leading axis of points, e.g. a run's ``res.xs``: then the
    suprema are over the visited iterates, a lower bound of the measures over X).

    Raises:
        ValueError: when the problem's reference has neither, or ``xs`` is missing.
    """
    reference = problem.reference
    if hasattr(reference, "variation"):
        return reference.variation(problem.x_set, radius)
    if xs is None or not all(hasattr(reference, name) for name in ("F", "y_star")):
        raise ValueError(
            f"variation({problem.name}) needs closed forms: a reference with variation(), or "
            "one with F(t, x) and y_star(t, x) and points xs= (e.g. a run's res.xs) to take "
            "the suprema over."
        )
    return _variation_over_points(problem, reference, xs)


def _variation_over_points(problem, reference, xs: PyTree) -> Variation:
    """V_T, H_{2,T} with the suprema over the given points (a lower bound over X)."""
    # any leading axes (seeds, rounds) become one axis of points shaped like x0
    points = jax.tree.map(lambda a, ref: jnp.reshape(a, (-1, *ref.shape)), xs, problem.x0)
    rounds = jnp.arange(1, problem.horizon + 1, dtype=jnp.int32)

    def at(t):
        F = jax.vmap(lambda x: reference.F(t, x))(points)
        y = jax.vmap(lambda x: ravel_pytree(reference.y_star(t, x))[0])(points)
        return F, y

    F, y = jax.lax.map(at, rounds)  # (T, points), (T, points, dim y)
    dV = jnp.max(jnp.abs(F[1:] - F[:-1]), axis=1)
    dH = jnp.max(jnp.sum((y[1:] - y[:-1]) ** 2, axis=2), axis=1)
    n = jax.tree.leaves(points)[0].shape[0]
    return Variation.from_increments(
        dV, dH, over=f"the {n} given points (a lower bound of the suprema over X)"
    )

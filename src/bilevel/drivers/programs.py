"""The compiled programs of the drivers, their specification and their cache.

A run compiles four kinds of programs, each a function ``fn(solver, problem, state)`` mapped
over the leading seed axis that every state inside the drivers carries (a single ``seed=`` run
is a batch of one; :func:`over_seeds`):

- ``"init"``: the states at step 0 from the seeds' PRNG keys (:func:`init_states`);
- ``"chunk"``: ``length`` solver steps, :func:`bilevel.drivers.loop.iterate`
  (:func:`compile_chunk`);
- ``"eval"``: the solver's output (x, y), its own metrics, the counters and the health
  (finiteness, iterate norms) of a state (:func:`_evaluation`);
- ``"metrics"``: the problem's metrics of (x, y) (:func:`_problem_metrics`), compiled with
  ``None`` for the solver, so every solver run on a problem shares it: a problem's metrics
  (exact answers, dense Hessians, a network's evaluation) compiled inside each solver's
  ``"eval"`` program took 40-55% of the compile time of a run of several solvers on one
  problem (measured 2026-11-27 on the quadratic and the IBCG toy). :func:`evaluate` runs both.

``bl.solve_online`` adds its own kinds through the ``build`` argument of :func:`program`
(:data:`ONLINE_ROUNDS`, its chunk of rounds, and its evaluation of a chunk's trace).

What a program depends on besides the avals of its arguments is a :class:`ProgramSpec`; the
cache is keyed on the spec and on the structure and avals of (solver, problem, state). The
solver is an argument of the program (a pytree whose numeric hyperparameters are leaves), so
solvers that differ only in those values share one compilation. The step programs
(:data:`STEP_KINDS`) are compiled through the XLA:CPU rewrites that ``spec.cpu_rewrites``
names (``bilevel.drivers._xla_cpu.compile_step``); the others are compiled as traced.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bilevel.analysis.metrics import default_metrics
from bilevel.core import sharding as parallel
from bilevel.core.compiler import jit_options
from bilevel.core.problem import BilevelProblem
from bilevel.core.tree import tree_allfinite
from bilevel.drivers import _xla_cpu
from bilevel.drivers.cpu_rewrites import CpuRewrites, resolve
from bilevel.drivers.divergence import Health, iterate_norms
from bilevel.drivers.grid import grid_axes, over_grid
from bilevel.drivers.loop import iterate
from bilevel.solvers.base import Solver

PyTree = Any

__all__ = [
    "ProgramSpec",
    "ProgramSettings",
    "ONLINE_ROUNDS",
    "STEP_KINDS",
    "BUILDERS",
    "MAX_COMPILED",
    "program",
    "compile_chunk",
    "init_states",
    "evaluate",
    "clear_cache",
    "cached_programs",
    "over_seeds",
    "place",
    "float_leaves_finite",
]

#: the kind of ``bl.solve_online``'s chunk of rounds (:mod:`bilevel.drivers.online`)
ONLINE_ROUNDS = ("online-rounds",)
#: the programs that run solver steps, compiled through the XLA:CPU rewrites
STEP_KINDS = ("chunk", ONLINE_ROUNDS)
#: at most this many compiled programs are kept, least recently used dropped first: every
#: XLA:CPU executable holds memory mappings of its own (a process that compiled ~3000 programs
#: crossed Linux's default limit of 65,530 mappings and crashed inside LLVM)
MAX_COMPILED = 256


@dataclasses.dataclass(frozen=True)
class ProgramSpec:
    """Everything a compiled program depends on besides the avals of its arguments.

    Attributes:
        kind: ``"init"``, ``"chunk"``, ``"eval"``, ``"metrics"`` or an extension's kind (any
            hashable that names everything static its builder depends on, e.g.
            :data:`ONLINE_ROUNDS`).
        length: the steps (or rounds) of a chunk; 0 for the other kinds.
        over_grid: ``bl.sweep``: the solver's leaves and the state carry a leading axis of grid
            points, and the program is vmapped over it (:mod:`bilevel.drivers.grid`).
        init: ``init(key) -> (x0, y0)`` of an ``"init"`` program drawing random starts.
        mesh: ``solve(devices=...)``: minibatches split over it, outputs replicated on it.
        grid_mesh: ``sweep(devices=...)``: arguments split over it along their grid axis.
        cpu_rewrites: the XLA:CPU rewrites a step program is compiled through (none for the
            other kinds).
    """

    kind: Hashable
    length: int = 0
    over_grid: bool = False
    init: Callable | None = None
    mesh: jax.sharding.Mesh | None = None
    grid_mesh: jax.sharding.Mesh | None = None
    cpu_rewrites: CpuRewrites = CpuRewrites.none()

    @property
    def rewritten(self) -> bool:
        """Whether the program is a step program compiled through the rewrites (some rewrite
        on, the CPU backend, no mesh); a rewrite that fails falls back to the traced program."""
        mesh = self.mesh if self.mesh is not None else self.grid_mesh
        return self.kind in STEP_KINDS and _xla_cpu.applies(self.cpu_rewrites, mesh)


@dataclasses.dataclass(frozen=True)
class ProgramSettings:
    """What all programs of one run share: the grid axis, the meshes, the CPU rewrites."""

    over_grid: bool = False
    mesh: jax.sharding.Mesh | None = None
    grid_mesh: jax.sharding.Mesh | None = None
    cpu_rewrites: CpuRewrites = CpuRewrites.none()

    def spec(self, kind: Hashable, length: int = 0, init: Callable | None = None) -> ProgramSpec:
        """The spec of a ``kind`` program; only step programs keep the rewrite options (the
        others are compiled as traced, so one compilation serves every option)."""
        rewrites = self.cpu_rewrites if kind in STEP_KINDS else CpuRewrites.none()
        return ProgramSpec(kind, length, self.over_grid, init, self.mesh, self.grid_mesh, rewrites)


# ---- the per-seed programs --------------------------------------------------------------------
def float_leaves_finite(state) -> jax.Array:
    """Whether every floating-point leaf of ``state`` is finite (integers and keys are)."""
    floats = [leaf for leaf in jax.tree.leaves(state) if jnp.issubdtype(leaf.dtype, jnp.floating)]
    return tree_allfinite(floats)


def _chunk(spec: ProgramSpec) -> Callable:
    def chunk(solver, problem, state):
        return iterate(solver, problem, state, spec.length)

    return chunk


def _evaluation(spec: ProgramSpec) -> Callable:
    """``((x, y), own metrics, counts, Health(finite, norms))`` of a state: the solver's output,
    what the method recorded itself (the last hypergradient estimate's norm, ...), the counters,
    whether the state and those metrics are finite, and the iterate norms. The problem's metrics
    of ``(x, y)`` are the ``"metrics"`` program's (:func:`_problem_metrics`), which every
    solver on the problem shares. The iterate norms come out with the metrics, not as history
    columns: the history compares them with the start's to catch iterates that run away while
    every metric looks fine (``bilevel.drivers.divergence``)."""

    def evaluate(solver, problem, state):
        x, y = solver.output(state)
        own = solver.state_metrics(state)
        finite = float_leaves_finite(state) & tree_allfinite(own)
        norms = iterate_norms(x, y, own.get("hypergrad_estimate_norm"))
        return (x, y), own, state.counts, Health(finite, norms)

    return evaluate


def _problem_metrics(spec: ProgramSpec) -> Callable:
    """``(metrics, finite)``: :func:`bilevel.analysis.metrics.default_metrics` of ``(x, y)``
    and whether every one is finite. Its solver argument is ``None``: one compilation per
    problem (and shapes of x, y) serves every solver run on it, where a metric program inside
    each solver's evaluation compiled the problem's metrics (exact answers, dense Hessians, a
    network's evaluation) once per solver."""

    def metrics(_, problem, xy):
        values = default_metrics(problem, *xy)
        return values, tree_allfinite(values)

    return metrics


def evaluate(spec: ProgramSpec, solver: Solver, problem, state) -> tuple:
    """``(metrics, counts, Health)`` of ``state`` on the host, by the ``"eval"`` program of
    ``spec`` (a spec of kind ``"eval"``) and the problem's ``"metrics"`` program: the
    problem's metrics and the solver's own (which win a shared name), by name as one program
    returned them (a dict comes out of a program with sorted keys: the history's columns)."""
    xy, own, counts, health = program(spec, solver, problem, state)(problem, state)
    shared = dataclasses.replace(spec, kind="metrics")
    values, finite = program(shared, None, problem, xy)(problem, xy)
    values, own, counts, health, finite = jax.device_get((values, own, counts, health, finite))
    values.update(own)
    metrics = {name: values[name] for name in sorted(values)}
    return metrics, counts, Health(np.logical_and(health.finite, finite), health.norms)


def _start(spec: ProgramSpec) -> Callable:
    def start(solver, problem, key):
        if spec.init is not None:  # a random start per seed, drawn from its own key
            x0, y0 = problem.parameters(*spec.init(jax.random.fold_in(key, 0x5EED)))
            problem = problem.with_start(problem.project_x(x0), y0)
        return solver.init(problem, key)

    return start


#: the builders of the library's own kinds: ``build(spec) -> fn(solver, problem, state)``
BUILDERS = {
    "chunk": _chunk,
    "eval": _evaluation,
    "metrics": _problem_metrics,
    "init": _start,
}


def over_seeds(fn: Callable) -> Callable:
    """``fn(solver, problem, state)`` mapped over the leading seed axis of ``state``.

    A single seed runs unbatched and gets its axis back: a vmap of size 1 is not free on
    XLA:CPU (measured 2026-11-22: 1.55x slower per step of E3's LeNet problem, whose
    window-matrix-product convolutions become batched dots). The seed count is static.
    """
    mapped = jax.vmap(fn, in_axes=(None, None, 0))

    def run(solver, problem, state):
        if jax.tree.leaves(state)[0].shape[0] != 1:
            return mapped(solver, problem, state)
        out = fn(solver, problem, jax.tree.map(lambda a: a[0], state))
        return jax.tree.map(lambda a: a[None], out)

    return run


# ---- the cache -------------------------------------------------------------------------------
class _Entry(NamedTuple):
    spec: ProgramSpec
    compiled: Any  # a jax.stages.Compiled
    serial: int  # insertion order


#: compiled programs by key, least recently used first
_CACHE: collections.OrderedDict[Hashable, _Entry] = collections.OrderedDict()
_SERIAL = itertools.count()


def clear_cache() -> None:
    """Drop every compiled program."""
    _CACHE.clear()


def cached_programs(kind: Hashable | None = None) -> list[tuple[ProgramSpec, Any]]:
    """The cached ``(spec, compiled)`` pairs in insertion order, optionally only those whose
    ``spec.kind == kind``; ``compiled`` is a ``jax.stages.Compiled`` (``.as_text()``)."""
    entries = sorted(_CACHE.values(), key=lambda entry: entry.serial)
    return [(e.spec, e.compiled) for e in entries if kind is None or e.spec.kind == kind]


def _leaf_aval(leaf) -> tuple:
    """``(shape, dtype, weak_type)`` without converting arrays: ``jnp.asarray`` on every leaf
    of the problem (its data included) cost ~0.5 ms per program lookup, 40% of a short
    ``solve``'s Python time (measured 2026-11-24, 2000 steps in 20 chunks)."""
    if isinstance(leaf, jax.Array):
        return leaf.shape, str(leaf.dtype), bool(leaf.weak_type)
    if isinstance(leaf, np.ndarray | np.generic):
        return leaf.shape, str(leaf.dtype), False
    a = jnp.asarray(leaf)  # Python scalars (weakly typed) and anything else array-like
    return a.shape, str(a.dtype), a.weak_type


def _aval_key(tree: PyTree) -> tuple:
    """A cache key of ``tree`` (problem, state or solver): its treedef (for a solver, the class
    and static settings) and the avals of its leaves, weak typing included (a Python float and
    an np.float64 lower to different programs)."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple(_leaf_aval(leaf) for leaf in leaves)


def program(
    spec: ProgramSpec, solver: Solver, problem, state, build: Callable | None = None
) -> Callable:
    """The compiled ``spec`` program for these arguments, as ``fn(problem, state)``.

    ``build(spec) -> fn(solver, problem, state)`` makes the per-seed function of a kind other
    than the library's own (:data:`BUILDERS`); ``spec.kind`` must then name everything static
    it depends on, since the builder is not part of the cache key.
    """
    key = (spec, _aval_key(solver), _aval_key(problem), _aval_key(state))
    entry = _CACHE.get(key)
    if entry is not None:
        _CACHE.move_to_end(key)
    else:
        raw = over_seeds((build or BUILDERS[spec.kind])(spec))
        entry = _Entry(spec, _compile(spec, raw, (solver, problem, state)), next(_SERIAL))
        _CACHE[key] = entry
        while len(_CACHE) > MAX_COMPILED:
            _CACHE.popitem(last=False)
    return functools.partial(entry.compiled, solver)


def _compile(spec: ProgramSpec, raw: Callable, args: tuple):
    """``raw`` (mapped over the grid when ``spec.over_grid``) lowered and compiled for
    ``args``: traced with minibatches split over ``spec.mesh`` and its outputs replicated there
    (:mod:`bilevel.core.sharding`), a step program through the CPU rewrites."""
    if spec.over_grid:
        raw = over_grid(raw, spec.kind, *args)
    jit_kwargs = dict(jit_options())  # the miscompile guard (bilevel.core.compiler)
    if spec.mesh is not None:
        jit_kwargs["out_shardings"] = parallel.replicated(spec.mesh)
    with parallel.use_mesh(spec.mesh):
        if spec.kind not in STEP_KINDS:
            return jax.jit(raw, **jit_kwargs).lower(*args).compile()
        mesh = spec.mesh if spec.mesh is not None else spec.grid_mesh
        return _xla_cpu.compile_step(raw, spec.cpu_rewrites, args, mesh=mesh, **jit_kwargs)


# ---- entry points -----------------------------------------------------------------------------
def compile_chunk(
    solver: Solver,
    problem: BilevelProblem,
    state,
    length: int,
    cpu_rewrites: CpuRewrites | bool | None = None,
    *,
    mesh: jax.sharding.Mesh | None = None,
) -> Callable:
    """``bl.solve``'s compiled chunk of ``length`` steps (through the cache), as
    ``chunk(problem, state) -> state`` for a ``state`` with a leading seed axis
    (:func:`init_states`). ``cpu_rewrites`` as in ``bl.solve`` (``None``: the defaults);
    ``mesh``: compiled as ``bl.solve(mesh=...)`` compiles it (the problem placed on it with
    ``bilevel.core.sharding.replicate``)."""
    settings = ProgramSettings(mesh=mesh, cpu_rewrites=resolve(cpu_rewrites))
    return program(settings.spec("chunk", length), solver, problem, state)


def init_states(
    solver: Solver,
    problem: BilevelProblem,
    seeds: Sequence[int],
    init: Callable | None = None,
    *,
    over_grid: bool = False,
    mesh: jax.sharding.Mesh | None = None,
    grid_mesh: jax.sharding.Mesh | None = None,
):
    """The solver's states at step 0 for ``seeds``, with a leading seed axis.

    ``init(key) -> (x0, y0)`` draws a random start per seed (as ``bl.solve(init=...)``).
    ``over_grid`` (``bl.sweep``: a solver stacked over grid points): every point starts from
    the same seeds' keys, so point i runs what ``solve`` with that point's solver runs. With
    ``mesh`` the states are replicated on it; with ``grid_mesh`` split over it along the grid
    axis.
    """
    keys = np.stack([np.asarray(jax.random.key_data(jax.random.key(s))) for s in seeds])
    keys = parallel.replicate(jnp.asarray(keys), mesh if mesh is not None else grid_mesh)
    settings = ProgramSettings(over_grid, mesh, grid_mesh)
    state = program(settings.spec("init", init=init), solver, problem, keys)(problem, keys)
    return parallel.shard_grid(state, grid_mesh, grid_axes(state))


def place(state, mesh=None, grid_mesh=None):
    """``state`` where the compiled programs expect it: replicated on ``mesh``, split over
    ``grid_mesh`` along its grid axis, or as it is."""
    if mesh is None and grid_mesh is None:
        return state
    state = parallel.replicate(state, mesh)
    return parallel.shard_grid(state, grid_mesh, grid_axes(state))

"""``sweep``: a grid of numeric hyperparameters x seeds as one vmapped compiled program.

A solver is a pytree whose numeric hyperparameters are leaves (``solvers/base.py``), so a stack
of solvers that differ only in those values is one pytree with a leading axis of grid points.
``sweep`` runs ``solve``'s own programs (init, the ``lax.scan`` chunk, the evaluation;
:mod:`bilevel.drivers.programs`) vmapped once more over that axis (``ProgramSettings(
over_grid=True)``, :mod:`bilevel.drivers.grid`), with ``solve``'s loop
(:class:`bilevel.drivers.engine.Engine`: timing, divergence checks, history rows and counter
totals) and one :class:`~bilevel.drivers.history.History` per grid point behind the engine's
history interface (:class:`GridHistory`), so a point's rows are what
``bl.solve(problem, solver_at_that_point, seeds=...)`` reports.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from bilevel.core import sharding as parallel
from bilevel.core.problem import BilevelProblem
from bilevel.drivers.checks import (
    check_convexity,
    check_offline_problem,
    check_seeds,
    check_steps,
)
from bilevel.drivers.cpu_rewrites import CpuRewrites, resolve
from bilevel.drivers.curvature import InnerCurvature, followed_fields
from bilevel.drivers.engine import Engine, Schedule
from bilevel.drivers.history import History
from bilevel.drivers.programs import ProgramSettings, init_states
from bilevel.drivers.progress import Progress
from bilevel.solvers import make as _make_solver
from bilevel.solvers.base import Solver
from bilevel.solvers.registry import check_hyperparameters

__all__ = ["sweep", "MEMORY_BUDGET"]

#: the default ``max_batch`` keeps grid points x seeds x state bytes under this (1 GiB)
MEMORY_BUDGET = 1 << 30


def sweep(
    problem: BilevelProblem,
    solver: str | Solver,
    grid: Mapping[str, Sequence[float]],
    *,
    steps: int,
    seeds: Sequence[int] = (0,),
    eval_every: int | None = 100,
    max_batch: int | None = None,
    progress: bool = True,
    init: Callable | None = None,
    devices: int | None = None,
    mesh: jax.sharding.Mesh | None = None,
    cpu_rewrites: CpuRewrites | bool | None = None,
    **hyperparameters: Any,
) -> pd.DataFrame:
    """Run ``solver`` at every point of ``grid`` (their cartesian product) for every seed.

    The whole grid x seeds is one vmapped compiled program (or a few, see ``max_batch``), so a
    16-point grid costs one compilation and runs its points side by side instead of 16 solves.

    Args:
        problem: a :class:`bilevel.BilevelProblem`.
        solver: a solver name (built with ``bl.solvers.make(solver, **hyperparameters)``) or a
            solver (``hyperparameters`` then replace its fields).
        grid: ``{field: values}``; every field must be a numeric hyperparameter of the solver (a
            pytree leaf: step sizes, penalty constants, ...). Static settings (``batch_size``,
            ``inner_steps``, strings, schedules) change the compiled program: loop over them,
            one ``sweep`` per value. ``"auto"`` is allowed where the solver resolves it to a
            number (``lr_inner``).
        steps, eval_every, init: as in :func:`bilevel.solve`; ``steps`` is also the horizon K
            filled into a solver's ``horizon=None`` field, as ``solve`` does.
        seeds: the seeds run at every point (each point gets the same seeds' keys, so its
            trajectories are those of ``bl.solve(problem, point_solver, seeds=seeds)``).
        max_batch: the most grid points in one program; the grid is split into equal batches
            (the last padded with copies of its last point, whose rows are dropped) so every
            batch shares one compilation. Default: as many as keep grid points x seeds x the
            solver state's bytes under :data:`MEMORY_BUDGET` (1 GiB). The state is what the
            program carries; temporaries of a step (minibatch gradients) come on top, so lower
            it for problems whose steps are large next to their state.
        progress: a progress display per batch on stderr.
        devices: spread the grid points over the first ``devices`` of ``jax.devices()`` (one
            process): each device runs its share of every batch's points, all seeds of a
            point on one device. Batches are padded to a multiple of the device count (the
            padded points' rows are dropped) and ``max_batch`` is rounded up to one. Not
            ``solve``'s data parallelism: minibatches stay whole, the points are split.
        mesh: a ``jax.sharding.Mesh`` of your own instead of ``devices``; the points are split
            over all its axes jointly.
        cpu_rewrites: the XLA:CPU rewrites of the compiled steps, as in :func:`bilevel.solve`.
        **hyperparameters: the other solver settings (``batch_size=64``, ...), the same at
            every point.

    Returns:
        One ``pandas.DataFrame`` row per grid point x seed x evaluation: a column per grid
        field, then ``bl.solve``'s history columns (``seed, step, samples``, the oracle-call
        columns, ``seconds``, ``outer_loss``, ``inner_grad_norm``, the problem's metrics,
        ``hypergrad_estimate_norm``). ``seconds`` is the cumulative solver time of the program
        that ran the point: shared by all points of a batch (not the point's own cost). A point
        and seed that diverged keeps its rows up to its last finite evaluation, like ``solve``;
        ``df.attrs["diverged"]`` lists them as ``{field: value, ..., "seed": s}``.

    Raises:
        ValueError: a grid field that is not a numeric leaf of the solver, an empty grid,
            bad ``steps``/``eval_every``/``max_batch``/``seeds``/``devices``/``mesh``, a mesh
            spanning several processes.
        KeyboardInterrupt: on Ctrl-C or SIGTERM (a sweep keeps no checkpoint).
    """
    check_offline_problem(problem, caller="sweep")
    steps, every = check_steps(steps, eval_every, caller="sweep")
    seed_list = check_seeds(None, seeds, caller="sweep")
    fields, points = _grid_points(grid)
    both = [name for name in fields if name in hyperparameters]
    if both:
        raise ValueError(
            f"sweep: {', '.join(map(repr, both))} is given both in grid= and as a keyword; "
            "give it in one place."
        )
    solvers = [_point_solver(problem, solver, fields, p, hyperparameters, steps) for p in points]
    check_convexity(problem)
    grid_mesh = _grid_mesh(devices, mesh)
    settings = ProgramSettings(
        over_grid=True, grid_mesh=grid_mesh, cpu_rewrites=resolve(cpu_rewrites)
    )
    per_device = 1 if grid_mesh is None else grid_mesh.size
    if max_batch is None:  # the budget is per device
        max_batch = per_device * _default_max_batch(solvers[0], problem, len(seed_list))
    elif isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"sweep(max_batch=...) must be a positive int, got {max_batch!r}.")
    rows, diverged = [], []
    for idx in _batches(len(points), max_batch, per_device):
        batch = [(points[i], solvers[i]) for i in idx]
        batch_rows, dead = _run_batch(
            problem, batch, seed_list, Schedule(steps, every), progress, init, settings
        )
        n_real = len(set(idx))  # padded copies of the last point are dropped
        rows.extend(batch_rows[:n_real])
        diverged.extend(points[idx[i]] | {"seed": s} for i, s in dead if i < n_real)
    return _frame(rows, diverged)


def _grid_points(grid) -> tuple[list[str], list[dict]]:
    """The grid's fields and its points (the cartesian product, last field fastest)."""
    if not isinstance(grid, Mapping) or not grid:
        raise ValueError(
            f"sweep(grid=...) must be a non-empty dict such as {{'lr_outer': [0.01, 0.1]}}, "
            f"got {grid!r}."
        )
    fields = list(grid)
    for name in fields:
        values = grid[name]
        if isinstance(values, str | bytes) or not isinstance(values, Sequence | np.ndarray):
            raise ValueError(
                f"sweep(grid={{{name!r}: ...}}) must be a list of values, got {values!r}."
            )
        if len(values) == 0:
            raise ValueError(f"sweep(grid={{{name!r}: []}}) is empty; give at least one value.")
    points = [dict(zip(fields, combo, strict=True)) for combo in itertools.product(*grid.values())]
    return fields, points


def _point_solver(
    problem, solver, fields, point: dict, hyperparameters: dict, steps: int
) -> Solver:
    """The resolved solver of one grid point; its grid fields must be numeric leaves.

    As in ``bl.solve``, a ``horizon=None`` field is filled with ``steps`` before ``resolve``
    (``Solver.with_horizon``), so horizon-dependent ``"auto"`` steps (IBCG's gamma) resolve.
    """
    settings = {**hyperparameters, **point}
    if isinstance(solver, Solver):
        check_hyperparameters(type(solver), solver.name, settings)
        built = dataclasses.replace(solver, **settings)
    elif isinstance(solver, str):
        built = _make_solver(solver, **settings)
    else:
        raise TypeError(
            f"sweep(solver=...) needs a solver name or a solver from bl.solvers.make, got "
            f"{type(solver).__name__}."
        )
    built.check_problem(problem)
    template = built.with_horizon(steps)
    built = template.resolve(problem)
    built.__dict__["_followed"] = tuple(followed_fields(template, built))  # see _run_batch
    leaves = {
        path[-1].name
        for path, _ in jax.tree_util.tree_leaves_with_path(built)
        if isinstance(path[-1], jax.tree_util.GetAttrKey)
    }
    for name in fields:
        if name not in leaves:
            raise ValueError(
                f"sweep(grid=...): {name!r} (= {getattr(built, name)!r}) is a static setting of "
                f"{type(built).__name__}, not a numeric hyperparameter: it sets shapes or code "
                f"paths, so it cannot be vmapped. Loop over it instead (one bl.sweep per "
                f"{name}, passing {name}=... as a keyword)."
            )
    if built.untuned():
        raise ValueError(
            f"sweep: {type(built).__name__}(lr_outer='auto') would be tuned at every grid "
            "point; put lr_outer in grid= or pass lr_outer=... (bl.tune(problem, solver, "
            "steps).value is the automatic choice)."
        )
    return built


def _default_max_batch(solver: Solver, problem: BilevelProblem, n_seeds: int) -> int:
    """Grid points per program that keep points x seeds x state bytes under the budget."""
    shapes = jax.eval_shape(solver.init, problem, jax.random.key(0))
    state_bytes = sum(
        math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize
        for leaf in jax.tree.leaves(shapes)
        if not jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)
    )
    return max(1, MEMORY_BUDGET // max(1, n_seeds * state_bytes))


def _grid_mesh(devices, mesh) -> jax.sharding.Mesh | None:
    """The mesh the grid points are split over (``parallel.make_mesh``), one process only:
    the points are placed from this process's host values."""
    if (devices is not None or mesh is not None) and jax.process_count() > 1:
        raise ValueError(
            "sweep(devices=/mesh=) splits the grid over the devices of one process, and this "
            f"is a jax.distributed run of {jax.process_count()} processes; give each process "
            "its own part of the grid (a sweep without devices=), or run bl.solve(..., "
            "devices=...) per grid point."
        )
    return parallel.make_mesh(devices, mesh, caller="sweep")


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _batches(n_points: int, max_batch: int, multiple: int = 1) -> list[list[int]]:
    """Point indices in equal batches of at most ``max_batch`` (rounded up to a multiple of
    ``multiple``, the devices the points are split over), each padded by repeating its last
    index to a size that ``multiple`` divides: equal shapes share one compiled program."""
    max_batch = _round_up(max_batch, multiple)
    n_batches = -(-n_points // max_batch)
    size = _round_up(-(-n_points // n_batches), multiple)
    out = []
    for start in range(0, n_points, size):
        idx = list(range(start, min(start + size, n_points)))
        out.append(idx + [idx[-1]] * (size - len(idx)))
    return out


def _stack(solvers: list[Solver]) -> Solver:
    """One solver whose leaves have a leading axis of grid points (weak types kept, so a
    Python-float step size stays weakly typed as in ``solve``)."""
    treedefs = {jax.tree.structure(s) for s in solvers}
    if len(treedefs) != 1:
        raise ValueError(
            "sweep(grid=...): the grid points' solvers differ in static settings after "
            f"resolution ({', '.join(map(repr, solvers))}); sweep the points that agree "
            "separately."
        )
    return jax.tree.map(lambda *v: jnp.stack([jnp.asarray(a) for a in v]), *solvers)


class GridHistory:
    """One :class:`~bilevel.drivers.history.History` per grid point behind the history
    interface of :class:`bilevel.drivers.engine.Engine` (``record``, ``alive``, ``seeds``,
    ``rows``): one row logic and one counter-total logic for ``solve`` and ``sweep``.

    ``alive`` is (points, seeds); each point's history holds a view of its row, so the
    engine's in-place updates reach it. ``seeds`` are ``(point index, seed)`` pairs.
    """

    def __init__(self, points: list[dict], seeds: list[int]):
        self.points = [History(seeds) for _ in points]
        self.labels = points
        self.alive = np.ones((len(points), len(seeds)), bool)
        for i, history in enumerate(self.points):
            history.alive = self.alive[i]
        self.seeds = [(i, s) for i in range(len(points)) for s in seeds]
        self.rows: list[dict] = []

    def record(self, metrics: dict, counts, finite, step: int, seconds: float) -> np.ndarray:
        """Each point's rows of one evaluation, with the point's grid values in front.

        ``finite`` (the evaluation's health: finiteness and iterate norms) is picked
        per point like the metrics, so each point's history judges its own divergence;
        ``reasons`` then gathers why each ``(point, seed)`` diverged, in ``seeds`` order, for
        the engine's message.
        """
        out = []
        for i, history in enumerate(self.points):
            start = len(history.rows)
            pick = _pick(i)
            out.append(history.record(pick(metrics), pick(counts), pick(finite), step, seconds))
            new = [self.labels[i] | row for row in history.rows[start:]]
            history.rows[start:] = new
            self.rows.extend(new)
        self.reasons = [r for history in self.points for r in history.reasons]
        return np.stack(out)


def _pick(i: int):
    """A function taking the ``i``-th grid point of every leaf of a tree."""
    return lambda tree: jax.tree.map(lambda a: np.asarray(a)[i], tree)


def _followed(solvers: list[Solver]) -> list[str]:
    """The ``"auto"`` inner steps every point of a batch follows (``bl.solve``'s rule,
    :mod:`bilevel.drivers.curvature`); none when the points are split over devices."""
    common = set(solvers[0].__dict__.get("_followed", ()))
    for s in solvers[1:]:
        common &= set(s.__dict__.get("_followed", ()))
    return sorted(common)


def _run_batch(problem, batch, seeds, schedule: Schedule, progress, init, settings):
    """Run one batch of ``(point, solver)`` pairs: ``(rows per point, [(point index in the
    batch, seed) that diverged])``. With ``settings.grid_mesh`` the points are split over it."""
    grid_mesh = settings.grid_mesh
    points = [p for p, _ in batch]
    stacked = parallel.shard_grid(_stack([s for _, s in batch]), grid_mesh)
    problem = parallel.replicate(problem, grid_mesh)
    state = init_states(stacked, problem, seeds, init, over_grid=True, grid_mesh=grid_mesh)
    history = GridHistory(points, seeds)
    name, runs = batch[0][1].name, len(batch) * len(seeds)
    display = Progress(progress, schedule.steps, name, problem.name, runs)
    followed = _followed([s for _, s in batch]) if grid_mesh is None else []
    adapt = InnerCurvature(stacked, followed, problem, state, grid=True) if followed else None
    if adapt is not None:
        stacked = adapt.at_start(problem, stacked, state)
    engine = Engine(problem, stacked, schedule, history, display, settings=settings, adapt=adapt)
    engine.start(state)
    try:
        _, stopped = engine.loop(state)
    finally:
        display.close()
    if stopped is not None:
        raise KeyboardInterrupt(
            f"sweep stopped by {stopped} at step {engine.done} of {schedule.steps}"
        )
    dead = [(i, s) for i, s in history.seeds if not history.alive[i, seeds.index(s)]]
    return [h.rows for h in history.points], dead


def _frame(rows_per_point, diverged) -> pd.DataFrame:
    """The rows of every point, sorted by point (grid order), seed and step."""
    frames = [pd.DataFrame(rows).assign(_point=i) for i, rows in enumerate(rows_per_point)]
    df = pd.concat(frames, ignore_index=True)
    df = df.sort_values(["_point", "seed", "step"], kind="stable").drop(columns="_point")
    df = df.reset_index(drop=True)
    df.attrs["diverged"] = diverged
    return df


def _metric_columns(df: pd.DataFrame, fields: Sequence[str]) -> list[str]:
    """The metric columns of a sweep's frame (not the grid, seed, step, counters or time)."""
    from bilevel.core.oracles import Counts

    other = {*fields, "seed", "step", "samples", "oracle_calls", "seconds", *Counts._fields}
    return [c for c in df.columns if c not in other]


def final_means(df: pd.DataFrame, fields: Sequence[str]) -> pd.DataFrame:
    """One row per grid point: the mean over seeds of every metric at the last step.

    A point where some seed has no row at the last step (it diverged) scores ``+inf`` in every
    metric: a setting that is unstable for one seed is not a setting to pick.
    """
    fields = list(fields)
    last = df[df["step"] == df["step"].max()]
    metrics = _metric_columns(df, fields)
    n_seeds = df["seed"].nunique()
    grouped = last.groupby(fields, sort=False)
    means = grouped[metrics].mean()
    complete = grouped["seed"].nunique() == n_seeds
    means.loc[~complete, :] = np.inf
    points = df[fields].drop_duplicates().set_index(fields).index
    return means.reindex(points, fill_value=np.inf).reset_index()

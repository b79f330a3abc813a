"""``solve``: the one driver that owns the loop.

It runs ``eval_every`` solver steps inside one compiled ``lax.scan`` (a "chunk"), vmapped over
seeds, then evaluates metrics outside the timed region, appends one history row per seed, updates
the progress bar, checks for divergence and writes a checkpoint. Compiled chunks are cached, so
a second ``solve`` with a solver and a problem of the same structure compiles nothing, also when
the solver's numeric hyperparameters differ (they are arguments of the compiled programs).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import hashlib
import json
import operator
import os
import re
import signal
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from bilevel.analysis.metrics import default_metrics
from bilevel.core import sharding as parallel
from bilevel.core.oracles import Counts
from bilevel.core.problem import BilevelProblem, ProblemKindError, users_function
from bilevel.core.tree import tree_allfinite
from bilevel.drivers import progress as _progress
from bilevel.drivers._xla_cpu import wide_dots
from bilevel.solvers.base import Solver

PyTree = Any

__all__ = ["solve", "Result", "DivergenceWarning", "DivergenceError", "Interrupted"]

_CHECKPOINT_FILE = "checkpoint.npz"
_CHECKPOINT_VERSION = 2  # 2: solver states carry OuterState (direction_norm)


class DivergenceWarning(RuntimeWarning):
    """A run produced non-finite iterates or losses and was stopped (results kept)."""


class DivergenceError(RuntimeError):
    """Raised instead of the warning with ``on_divergence="raise"``; ``.result`` holds the run."""

    def __init__(self, message: str, result: Result):
        super().__init__(message)
        self.result = result


@dataclasses.dataclass
class _Outcome:
    """What a run of ``solve`` or ``bl.solve_online`` ends with (documented by each)."""

    x: PyTree
    y: PyTree
    history: pd.DataFrame
    state: Any
    diverged: list[int]
    message: str
    solver: Solver
    problem_name: str
    seeds: list[int]

    @property
    def ok(self) -> bool:
        return not self.diverged


@dataclasses.dataclass
class Result(_Outcome):
    """What ``solve`` returns.

    Attributes:
        x, y: final iterates (the solver's estimate of y*(x) for y); with ``seeds=`` they carry
            a leading seed axis. For a seed that diverged, its last finite iterates. Models
            (``x0`` or ``y0`` an ``equinox.Module``) come back as models whose arrays carry it.
        history: one row per (seed, evaluation): ``seed, step, samples, samples_outer,
            samples_inner, oracle_calls``, the calls by kind, ``seconds`` (solver time only,
            cumulative) and the metrics: ``outer_loss``, ``inner_grad_norm``, the problem's own,
            and ``hypergrad_estimate_norm`` (the norm of the direction the solver's last outer
            step used, its hypergradient estimate; 0 at step 0), plus what the solver records
            itself (``Solver.state_metrics``: ``fw_gap_estimate`` for Frank-Wolfe methods);
            constrained problems also get ``grad_mapping`` and ``fw_gap`` (bilevel.analysis.metrics).
        state: the final solver state (seed axis with ``seeds=``).
        diverged: seeds that diverged (empty if none).
        message: a human-readable status.
        solver, problem_name, seeds: what was run.
        steps: the steps done (fewer than asked when interrupted or stopped by a time limit).
    """

    steps: int


# ---- compiled pieces (cached) -------------------------------------------------------------------
#: compiled programs, least recently used first; at most MAX_COMPILED are kept, since every
#: XLA:CPU executable holds memory mappings of its own (a process that compiled ~3000 programs
#: crossed Linux's default limit of 65,530 mappings and crashed inside LLVM)
_COMPILED: collections.OrderedDict[Any, Any] = collections.OrderedDict()
MAX_COMPILED = 256
#: the cache kind of ``solve_online``'s rounds program (:mod:`bilevel.drivers.online`)
ONLINE_ROUNDS = ("online-rounds",)
#: the programs that run solver steps (``solve``'s chunk, ``solve_online``'s rounds): compiled
#: through :func:`bilevel.drivers._xla_cpu.wide_dots.keep_wide_dots` on CPU
_STEP_PROGRAMS = ("chunk", ONLINE_ROUNDS)


def _aval_key(tree: PyTree):
    """A compile-cache key of ``tree`` (problem, state or solver): its treedef (for a solver,
    the class and static settings) and the avals of its leaves, weak typing included (a Python
    float and an np.float64 lower to different programs)."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple(_leaf_aval(leaf) for leaf in leaves)


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


def _float_leaves_finite(state) -> jax.Array:
    floats = [leaf for leaf in jax.tree.leaves(state) if jnp.issubdtype(leaf.dtype, jnp.floating)]
    return tree_allfinite(floats)


def _over_seeds(fn):
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


def _make_chunk(length: int, batched: bool):
    def one(solver, problem, state):
        def body(s, _):
            return solver.step(problem, s), None

        state, _ = jax.lax.scan(body, state, None, length=length)
        return state

    return _over_seeds(one) if batched else one


def _make_eval(batched: bool):
    def one(solver, problem, state):
        x, y = solver.output(state)
        metrics = default_metrics(problem, x, y)
        # what the method recorded itself (the last hypergradient estimate's norm, ...)
        metrics.update(solver.state_metrics(state))
        finite = _float_leaves_finite(state) & tree_allfinite(metrics)
        return metrics, state.counts, finite

    return _over_seeds(one) if batched else one


def _make_init(batched: bool, init=None):
    def start(solver, problem, key):
        if init is not None:  # a random start per seed, drawn from its own key
            x0, y0 = problem.parameters(*init(jax.random.fold_in(key, 0x5EED)))
            problem = problem.with_start(problem.project_x(x0), y0)
        return solver.init(problem, key)

    return _over_seeds(start) if batched else start


def _compiled(
    kind: str,
    solver: Solver,
    problem: BilevelProblem,
    state,
    length: int,
    batched: bool,
    init=None,
    over_grid: bool = False,
    build: Callable | None = None,
    mesh: jax.sharding.Mesh | None = None,
    grid_mesh: jax.sharding.Mesh | None = None,
):
    """The compiled ``kind`` program as a function of ``(problem, state)``.

    The solver is an argument of the program (a pytree whose numeric hyperparameters are
    leaves), so the cache is keyed on its structure and the avals of its leaves, not on their
    values: solvers that differ only in numeric hyperparameters share one compilation.
    ``over_grid`` (``bl.sweep``): the solver's leaves and the state carry a leading axis of
    grid points, and the program is the same one vmapped over it. ``build`` (``bl.solve_online``'s
    programs): ``build(length, batched)`` makes the raw ``fn(solver, problem, state)`` of a
    ``kind`` other than "chunk", "eval" and "init"; ``kind`` (any hashable) must then name
    everything static the program depends on, since it is the cache key. ``mesh``
    (``solve(devices=...)``): the program is traced with every minibatch split over it
    (:mod:`bilevel.core.sharding`) and returns its outputs replicated on it. ``grid_mesh``
    (``sweep(devices=...)``): the arguments come split over it along their grid axis
    (:func:`bilevel.core.sharding.shard_grid`), the program is compiled for those placements and
    its outputs keep what XLA's SPMD partitioner gives them. On CPU without a mesh, the step
    programs are compiled through :func:`bilevel.drivers._xla_cpu.wide_dots.keep_wide_dots`.
    """
    rewrite = kind in _STEP_PROGRAMS and wide_dots.enabled(mesh if mesh is not None else grid_mesh)
    key = (
        kind,
        length,
        batched,
        over_grid,
        _aval_key(solver),
        _aval_key(problem),
        _aval_key(state),
        init,
        mesh,
        grid_mesh,
        rewrite,
    )
    fn = _COMPILED.get(key)
    if fn is not None:
        _COMPILED.move_to_end(key)
    else:
        if build is not None:
            raw = build(length, batched)
        elif kind == "chunk":
            raw = _make_chunk(length, batched)
        elif kind == "eval":
            raw = _make_eval(batched)
        else:  # "init": ``state`` holds the PRNG keys
            raw = _make_init(batched, init)
        if over_grid:
            raw = _over_grid(raw, kind, solver, problem, state)
        if rewrite:
            raw = wide_dots.keep_wide_dots(raw)
        out = {} if mesh is None else {"out_shardings": parallel.replicated(mesh)}
        with parallel.use_mesh(mesh):
            fn = jax.jit(raw, **out).lower(solver, problem, state).compile()
        _COMPILED[key] = fn
        while len(_COMPILED) > MAX_COMPILED:
            _COMPILED.popitem(last=False)
    return functools.partial(fn, solver)


def grid_axes(state):
    """The vmap axes of a sweep's state over its grid points: none for the PRNG key (a state
    field named ``key``), 0 for everything else.

    Every grid point runs a seed with that seed's key, so the key -- and with it every
    minibatch index -- is the same for all points. Left unbatched, each minibatch is gathered
    once per seed instead of once per point, and the points' oracles run on one shared batch
    (matrix products instead of one matrix-vector product per point): measured 2026-11-24 on
    F2SA, quadratic dx 5 / dy 10, batch 32, 16 points x 5 seeds, 17.7 -> ~4.2 us per point-step.
    States without a ``key`` field are mapped whole (correct, only slower).
    """
    fields = getattr(state, "_fields", None)
    if fields is None or "key" not in fields:
        return 0
    return type(state)(*(None if name == "key" else 0 for name in fields))


def _over_grid(raw, kind: str, solver: Solver, problem: BilevelProblem, state):
    """``raw`` vmapped over the leading grid axis of the solver's leaves and of the state
    (:func:`grid_axes`); the ``init`` program takes the seeds' keys without that axis."""
    if kind == "init":
        point = jax.tree.map(lambda a: a[0], solver)
        axes = grid_axes(jax.eval_shape(raw, point, problem, state))
        return jax.vmap(raw, in_axes=(0, None, None), out_axes=axes)
    axes = grid_axes(state)
    if kind == "eval":
        return jax.vmap(raw, in_axes=(0, None, axes))
    mapped = jax.vmap(raw, in_axes=(0, None, axes), out_axes=axes)

    def chunk(solver, problem, state):
        try:
            return mapped(solver, problem, state)
        except ValueError as err:
            if "out_axes" not in str(err):  # not the key coming out mapped: the step's own
                raise
            raise ValueError(
                f"sweep: {type(solver).__name__}.step makes its PRNG key depend on the swept "
                "hyperparameters; a sweep shares each seed's key across grid points (the "
                "state's `key` must evolve from the key alone)."
            ) from err

    return chunk


def _init_states(
    solver: Solver,
    problem: BilevelProblem,
    seeds: list[int],
    batched: bool,
    init=None,
    n_points: int | None = None,
    mesh: jax.sharding.Mesh | None = None,
    grid_mesh: jax.sharding.Mesh | None = None,
):
    """The states at step 0; with ``n_points`` (``bl.sweep``: a solver stacked over grid
    points) every point starts from the same seeds' keys, so point i runs what ``solve``
    with that point's solver would run. With ``mesh`` they are replicated on it; with
    ``grid_mesh`` (a sweep over devices) split over it along the grid axis."""
    keys = np.stack([np.asarray(jax.random.key_data(jax.random.key(s))) for s in seeds])
    keys = keys if batched else keys[0]  # over a grid: shared (grid_axes)
    keys = parallel.replicate(jnp.asarray(keys), mesh if mesh is not None else grid_mesh)
    over_grid = n_points is not None
    program = _compiled(
        "init", solver, problem, keys, 0, batched, init, over_grid, mesh=mesh, grid_mesh=grid_mesh
    )
    state = program(problem, keys)
    return parallel.shard_grid(state, grid_mesh, grid_axes(state))


# ---- checkpoints ----------------------------------------------------------------------------
def _strip_addresses(text: str) -> str:
    return re.sub(r" at 0x[0-9a-fA-F]+", "", text)


def _closures(value, depth: int = 0) -> str:
    """The values the functions in ``value`` (a solver field: a schedule, an optax
    transformation, a tuple of them; or a problem's function) closed over, recursively, as text
    without memory addresses ("" if none)."""
    if depth > 4:  # a closure over itself, or a deep chain of schedules: enough to tell apart
        return ""
    if isinstance(value, tuple):
        return "".join(_closures(v, depth + 1) for v in value)
    if isinstance(value, np.ndarray | jax.Array):  # a problem's data or matrices: their bytes
        return _array_digest(value)
    if not callable(value):
        return ""
    parts = []
    for cell in getattr(value, "__closure__", None) or ():
        try:
            content = cell.cell_contents
        except ValueError:  # a cell not filled yet
            continue
        parts.append(_closures(content, depth + 1) or _strip_addresses(repr(content)))
    return f"({';'.join(parts)})" if parts else ""


def _signature(
    problem: BilevelProblem, solver: Solver, seeds, batched, eval_every, init=None
) -> str:
    """A fingerprint of everything that determines the trajectory (not ``steps``)."""
    h = hashlib.sha256()
    # functions (schedules, an optax outer optimiser) print with their memory address, which
    # differs in every process: a resumed run must not look like another run
    h.update(_strip_addresses(repr(solver)).encode())
    # ... which also hides what a function closed over: optax.trace(decay=0.5) and (decay=0.9),
    # or two exponential decays, print alike; their closures tell them apart
    for fld in dataclasses.fields(solver):
        h.update(_closures(getattr(solver, fld.name)).encode())
    h.update(repr((problem.name, seeds, batched, eval_every, _CHECKPOINT_VERSION)).encode())
    if getattr(problem, "batch_chunks", 1) > 1:  # (absent before the option: old prints hold)
        h.update(f"batch_chunks {problem.batch_chunks}".encode())
    children, _ = problem.tree_flatten()
    leaves, treedef = jax.tree.flatten(children)
    h.update(str(treedef).encode())  # structure only: function reprs hold memory addresses
    if any(part is not None for part in problem.model_parts):  # a model's functions, ...
        h.update(_strip_addresses(repr(problem.model_parts)).encode())
    for fn in (problem.outer, problem.inner, problem.metrics, init):
        fn = users_function(fn)
        code = getattr(fn, "__code__", None)
        h.update(
            repr((getattr(fn, "__module__", None), getattr(fn, "__qualname__", None))).encode()
        )
        h.update(code.co_code if code is not None else b"")
        h.update(_closures(fn).encode())  # the constants a problem's functions closed over
    for leaf in leaves:
        h.update(_array_digest(leaf).encode())
    return h.hexdigest()


def _array_digest(value) -> str:
    """Shape, dtype and a hash of the bytes of an array (every 1/4096th row above 16 MB)."""
    a = np.ascontiguousarray(np.asarray(value))
    data = a.tobytes() if a.nbytes <= 1 << 24 else a[:: max(1, a.shape[0] // 4096)].tobytes()
    return f"{a.shape}{a.dtype}{hashlib.sha256(data).hexdigest()}"


def _save_checkpoint(directory: Path, state, meta: dict, history: list[dict]) -> None:
    """Write atomically: a temporary file in the same directory, fsync, then ``os.replace``."""
    directory.mkdir(parents=True, exist_ok=True)
    leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(state)]
    arrays = {f"leaf_{i}": a for i, a in enumerate(leaves)}
    arrays["meta"] = np.array(json.dumps(meta))
    arrays["history"] = np.array(json.dumps(history))
    fd, tmp = tempfile.mkstemp(prefix=".checkpoint-", suffix=".npz", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, directory / _CHECKPOINT_FILE)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load_checkpoint(directory: Path, state_template, signature: str):
    path = directory / _CHECKPOINT_FILE
    if not path.exists():
        return None
    with np.load(path, allow_pickle=False) as npz:
        meta = json.loads(str(npz["meta"]))
        history = json.loads(str(npz["history"]))
        if meta.get("signature") != signature:
            raise ValueError(
                f"the checkpoint in {directory} was written by a different run (solver, "
                "problem, seeds or eval_every differ, or an older bilevel version); use another "
                "checkpoint directory or delete it."
            )
        template, treedef = jax.tree.flatten(state_template)
        leaves = [npz[f"leaf_{i}"] for i in range(len(template))]
    for got, want in zip(leaves, template, strict=True):
        if got.shape != np.shape(want) or got.dtype != np.asarray(want).dtype:
            raise ValueError(f"the checkpoint in {directory} does not match the solver state.")
    state = jax.tree.unflatten(treedef, [jnp.asarray(a) for a in leaves])
    return state, meta, history


# ---- the pieces of a run ---------------------------------------------------------------------
class Interrupted(KeyboardInterrupt):
    """``solve`` was stopped by Ctrl-C (SIGINT) or SIGTERM; nothing computed is lost.

    It subclasses ``KeyboardInterrupt``, so code that does not catch it stops as on Ctrl-C.

    Attributes:
        result: the partial :class:`Result` (history up to the last evaluation, the iterates
            there, ``steps`` = the steps done).
        checkpoint: the checkpoint directory written at that evaluation (``None`` when the run
            had no ``checkpoint=``); calling ``solve`` again with the same arguments resumes
            from it.
        signal: ``"SIGINT"`` or ``"SIGTERM"``.
    """

    def __init__(self, message: str, result: Result, checkpoint: Path | None, signal: str):
        super().__init__(message)
        self.result = result
        self.checkpoint = checkpoint
        self.signal = signal


class _StopRequested(BaseException):
    """Raised by the signal handler to leave a running chunk (a ``BaseException``, like
    ``KeyboardInterrupt``, so that no ``except Exception`` on the way swallows it)."""


class _StopSignals:
    """SIGINT and SIGTERM while ``solve`` runs: a request to stop at a consistent point.

    Outside bookkeeping the handler raises at once (JAX's wait for a chunk is interruptible,
    and the chunk's result is simply dropped: the last evaluation is at most one chunk
    behind). Inside :meth:`bookkeeping` (history rows, checkpoint writes) it only records the
    request, acted on after that block, so rows, counters and state always describe one step.
    A second signal aborts at once with a plain ``KeyboardInterrupt``. Handlers are installed
    only in the main thread (Python allows no other), not for a signal the process ignores
    (a shell starts background jobs with SIGINT ignored; Python itself leaves it so), and
    restored on exit.
    """

    def __init__(self):
        self.requested: str | None = None
        self._critical = False
        self._previous: dict[int, Any] = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(sig) is signal.SIG_IGN:
                    continue  # ignored on purpose (a shell's background job): leave it so
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False

    def _handle(self, signum, frame):
        if self.requested is not None:
            raise KeyboardInterrupt  # second signal: the user wants out now
        self.requested = signal.Signals(signum).name
        if not self._critical:
            raise _StopRequested

    @contextlib.contextmanager
    def bookkeeping(self):
        """A block a (first) signal does not interrupt; the caller checks ``requested`` after."""
        self._critical = True
        try:
            yield
        finally:
            self._critical = False


class _History:
    """History rows and per-seed Python-int counter totals (int32 counters may wrap)."""

    def __init__(self, seeds: list[int]):
        self.seeds = seeds
        self.rows: list[dict] = []
        self.totals = [{k: 0 for k in Counts._fields} | {"raw": {}} for _ in seeds]
        self.alive = np.ones(len(seeds), bool)

    def restore(self, meta: dict, rows: list[dict]) -> None:
        self.rows = rows
        self.totals = [dict(t) for t in meta["totals"]]
        self.alive = np.array(meta["alive"], bool)

    def meta(self) -> dict:
        return {"totals": self.totals, "alive": self.alive.tolist()}

    def record(self, metrics: dict, counts: Counts, finite, step: int, seconds: float):
        """Add the rows of one evaluation; returns which seeds are finite (and not exploded)."""
        finite = np.atleast_1d(np.asarray(finite)) & ~_exploded(metrics, step, self)
        # the int32 counters as unsigned values, converted once for all seeds
        raw = {
            k: np.atleast_1d(np.asarray(v)).astype(np.int64) & 0xFFFFFFFF
            for k, v in counts._asdict().items()
        }
        new_rows = []
        for i, seed in enumerate(self.seeds):
            totals = self._add_counts(i, raw)
            if self.alive[i] and finite[i]:
                new_rows.append(self._row(seed, step, seconds, totals, metrics, i))
        self.rows.extend(new_rows)
        return finite

    def _add_counts(self, i: int, raw: dict[str, np.ndarray]) -> dict:
        t = self.totals[i]
        for k, v in raw.items():  # add deltas mod 2^32
            now = int(v[i] if v.size > 1 else v[0])
            t[k] += (now - t["raw"].get(k, 0)) % (1 << 32)
            t["raw"][k] = now
        return t

    @staticmethod
    def _row(seed, step, seconds, t, metrics, i) -> dict:
        calls = {k: t[k] for k in Counts._fields if not k.startswith("samples")}
        row = {
            "seed": seed,
            "step": step,
            "samples": t["samples_outer"] + t["samples_inner"],
            "samples_outer": t["samples_outer"],
            "samples_inner": t["samples_inner"],
            "oracle_calls": sum(calls.values()),
            **calls,
            "seconds": seconds,
        }
        for name, v in metrics.items():
            v = np.atleast_1d(np.asarray(v))
            row[name] = float(v[i] if v.size > 1 else v[0])
        return row


class _Checkpointer:
    """Atomic saves at most every ``interval`` seconds (always when forced), and the resume."""

    def __init__(self, directory: Path | None, signature: str, interval: float):
        self.directory = directory
        self.signature = signature
        self.interval = interval
        self.last_save = time.monotonic()

    def load(self, state_template, history: _History, steps: int):
        """``(state, step, seconds)`` of the checkpoint, or ``None`` when there is none."""
        if self.directory is None:
            return None
        loaded = _load_checkpoint(self.directory, state_template, self.signature)
        if loaded is None:
            return None
        state, meta, rows = loaded
        done = int(meta["step"])
        if done > steps:
            raise ValueError(
                f"the checkpoint in {self.directory} is at step {done}, beyond steps={steps}; "
                f"ask for at least {done} steps or use another checkpoint directory."
            )
        history.restore(meta, rows)
        return state, done, float(meta["seconds"])

    def save(self, state, history: _History, step: int, seconds: float, force: bool) -> None:
        if self.directory is None or not parallel.is_main_process():  # one writer per run
            return
        if not force and time.monotonic() - self.last_save < self.interval:
            return
        meta = {"signature": self.signature, "step": step, "seconds": seconds} | history.meta()
        _save_checkpoint(self.directory, state, meta, history.rows)
        self.last_save = time.monotonic()


def _check_seeds(seed, seeds, caller: str = "solve") -> list[int]:
    """The seeds as a list of ints; ``caller`` (``solve``, ``sweep``) names the function."""
    if seeds is None:
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
            raise TypeError(f"{caller}(seed=...) must be an int, got {seed!r}.")
        return [int(seed)]
    if isinstance(seeds, int | np.integer):
        raise TypeError(
            f"{caller}(seeds={seeds!r}): seeds is a list of seeds, not a count; for {seeds} "
            f"seeds use seeds=range({seeds})."
        )
    try:
        seed_list = [operator.index(s) for s in seeds]
    except TypeError as err:
        raise TypeError(
            f"{caller}(seeds=...) must be a sequence of ints such as range(5), got {seeds!r}."
        ) from err
    if not seed_list:
        raise ValueError(f"{caller}(seeds=...) is empty; give at least one seed.")
    if len(set(seed_list)) != len(seed_list):
        raise ValueError(f"{caller}(seeds=...) has repeated seeds: {seed_list}.")
    return seed_list


def _check_checkpoint_dir(checkpoint) -> Path | None:
    """The checkpoint directory, created now: a bad path fails before anything is compiled."""
    if checkpoint is None:
        return None
    path = Path(checkpoint)
    if path.exists() and not path.is_dir():
        raise ValueError(
            f"solve(checkpoint={str(path)!r}) is a file, not a directory; give a directory "
            f"(it will hold {_CHECKPOINT_FILE}), e.g. {str(path.with_suffix(''))!r}_ckpt."
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(
            f"solve(checkpoint={str(path)!r}) cannot be created: {err.strerror or err}; give a "
            "writable directory."
        ) from err
    if not os.access(path, os.W_OK):
        raise ValueError(f"solve(checkpoint={str(path)!r}) is not writable; give another one.")
    return path


def _check_offline_problem(problem, caller: str = "solve") -> None:
    """Refuse anything but a ``BilevelProblem`` (a stream names ``solve_online``)."""
    from bilevel.core.online_problem import OnlineProblem

    if isinstance(problem, OnlineProblem):
        raise ProblemKindError(
            f"{caller}(problem=...) needs a bl.BilevelProblem, got the bl.OnlineProblem "
            f"{problem.name}: run a stream with bl.solve_online(problem, solver) and an online "
            "solver such as 'f2obo' (bl.solvers.names('online')), or one of its rounds with "
            f"bl.{caller}(problem.round_problem(t), ...)."
        )
    if not isinstance(problem, BilevelProblem):
        raise TypeError(
            f"{caller}(problem=...) needs a bl.BilevelProblem, got {type(problem).__name__}."
        )


def _check_arguments(problem, solver, steps, on_divergence, eval_every) -> tuple[int, int]:
    """``(steps, every)`` after checking the plain arguments of ``solve``."""
    _check_offline_problem(problem)
    if not isinstance(solver, Solver):
        raise TypeError(
            f"solve(solver=...) needs a solver from bl.solvers.make(...), got "
            f"{type(solver).__name__}."
        )
    _check_on_divergence(on_divergence)
    return _check_steps(steps, eval_every)


def _check_on_divergence(on_divergence) -> None:
    if on_divergence not in ("warn", "raise"):
        raise ValueError(f"on_divergence must be 'warn' or 'raise', got {on_divergence!r}.")


def _check_steps(steps, eval_every, caller: str = "solve") -> tuple[int, int]:
    """``(steps, every)``, every capped at steps; ``caller`` (``solve``, ``sweep``) names the
    function in the messages."""
    if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps < 1:
        raise ValueError(f"{caller}(steps=...) must be a positive int, got {steps!r}.")
    every = steps if eval_every is None else eval_every
    if isinstance(every, bool) or not isinstance(every, int | np.integer) or every < 1:
        raise ValueError(f"{caller}(eval_every=...) must be a positive int, got {eval_every!r}.")
    return int(steps), min(int(every), int(steps))


#: the convexity probe of every ``solve``: a few Lanczos steps on one minibatch's Hessian
CONVEXITY_PROBE = {"steps": 20, "batch_size": 1024, "num_batches": 1}


def _check_convexity(problem: BilevelProblem) -> None:
    """Warn (``NotStronglyConvexWarning``) when g(x0, .) does not look strongly convex.

    Every method here assumes it; with an explicit ``lr_inner`` nothing else would look, and a
    concave inner problem would only show as a divergence stop much later. The probe is cheap
    (:data:`CONVEXITY_PROBE`: 20 Lanczos steps on one minibatch of at most 1024 samples; the
    full ``bl.diagnose`` took 350 s on E3's LeNet problem). The smallest Ritz value is never
    below the smallest eigenvalue, so the probe does not invent negative curvature; it is
    cached per problem like every diagnosis.
    """
    from bilevel.analysis.diagnose import diagnose

    diagnose(problem, warn=True, **CONVEXITY_PROBE)


# ---- the driver ---------------------------------------------------------------------------
def solve(
    problem: BilevelProblem,
    solver: Solver,
    steps: int,
    *,
    seed: int = 0,
    seeds: Sequence[int] | None = None,
    eval_every: int | None = 100,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_interval: float = 30.0,
    progress: bool = True,
    on_divergence: str = "warn",
    init: Callable[[jax.Array], tuple[PyTree, PyTree]] | None = None,
    time_limit: float | None = None,
    devices: int | None = None,
    mesh: jax.sharding.Mesh | None = None,
) -> Result:
    """Run ``solver`` on ``problem`` for ``steps`` outer iterations.

    Args:
        problem: a :class:`bilevel.BilevelProblem`.
        solver: from ``bl.solvers.make(name, ...)``.
        steps: number of outer iterations; also the horizon K of a solver whose step sizes
            depend on it (a ``horizon=None`` field, e.g. IBCG's, is filled with ``steps``).
        seed: the PRNG seed of a single run.
        seeds: several seeds (a sequence such as ``range(5)``) run as one vmapped program;
            results get a leading seed axis.
        eval_every: steps between evaluations (metrics, history rows, progress, divergence
            checks, checkpoints); ``None`` = once at the end. Capped at ``steps``.
        checkpoint: a directory (created if missing). The run saves there (atomically, at most
            every ``checkpoint_interval`` seconds, at the end and when interrupted) and, called
            again with the same arguments, resumes from the latest checkpoint and ends
            bit-identical to an uninterrupted run. The file is an ``.npz`` read with
            ``allow_pickle=False``.
        checkpoint_interval: minimum seconds between checkpoint writes (0 = every evaluation).
        progress: show progress on stderr: a bar (step count, rate, ETA) on a terminal, one
            line per evaluation otherwise; also says when a run resumes.
        on_divergence: ``"warn"`` (a :class:`DivergenceWarning`, results kept) or ``"raise"``
            (a :class:`DivergenceError` whose ``.result`` holds them).
        init: optional ``init(key) -> (x0, y0)`` drawing a random start per seed (the "random
            initialisations" of the papers' protocols); x0 is projected onto x_set. It must be
            a jit-able function of the key, returning pytrees shaped like the problem's x0, y0.
        time_limit: seconds of solver time (the history's ``seconds``: compilation, metrics
            and checkpoints excluded) after which the run stops, at the first evaluation that
            reaches it: the papers' "K iterations or T seconds, whichever comes first". The
            result then holds fewer than ``steps`` steps (``result.steps``; its message says
            so); ``eval_every`` sets how far past the limit the last chunk may run.
        devices: data parallelism over the first ``devices`` of ``jax.devices()`` (a 1-D mesh;
            under ``jax.distributed`` the devices of every process): each minibatch is split
            over them and the gradient estimates are all-reduced by XLA, so the results match a
            one-device run up to floating-point summation order. ``batch_size`` must be a
            multiple of the device count; full batches (``batch_size=None``) stay replicated.
            Under ``jax.distributed`` only process 0 prints progress and writes checkpoints.
            See ``docs/distributed.md`` and :mod:`bilevel.core.sharding`.
        mesh: a ``jax.sharding.Mesh`` of your own instead of ``devices``; minibatches are split
            over all its axes jointly.

    Returns:
        A :class:`Result`.

    Raises:
        Interrupted: on Ctrl-C (SIGINT) or SIGTERM, after writing the checkpoint (when one was
            asked for); its ``.result`` holds the history and iterates of the steps done.
        NotStronglyConvexWarning: (a warning) when g(x0, .) does not look strongly convex.
    """
    steps, every = _check_arguments(problem, solver, steps, on_divergence, eval_every)
    number = isinstance(time_limit, int | float) and not isinstance(time_limit, bool)
    if time_limit is not None and not (number and time_limit > 0):
        raise ValueError(
            f"time_limit must be None or a positive number of seconds, got {time_limit!r}."
        )
    batched = seeds is not None
    seed_list = _check_seeds(seed, seeds)
    mesh = parallel.make_mesh(devices, mesh)
    ckpt_dir = _check_checkpoint_dir(checkpoint)
    solver.check_problem(problem)
    solver = solver.with_horizon(steps).resolve(problem)
    parallel.check_batch_size(getattr(solver, "batch_size", None), mesh)
    _check_convexity(problem)

    placed = parallel.replicate(problem, mesh)  # the data on every device of the mesh
    state = _init_states(solver, placed, seed_list, batched, init, mesh=mesh)
    history = _History(seed_list)
    # only a checkpoint needs the fingerprint (it hashes the data: not free on large problems)
    signature = (
        "" if ckpt_dir is None else _signature(problem, solver, seed_list, batched, every, init)
    )
    checkpointer = _Checkpointer(ckpt_dir, signature, checkpoint_interval)
    show = progress and parallel.is_main_process()  # one progress display per run
    display = _progress.Progress(show, steps, solver.name, problem.name, len(seed_list))
    run = _Run(placed, solver, batched, every, steps, history, checkpointer, display, mesh=mesh)
    run.time_limit = time_limit
    resumed = checkpointer.load(state, history, steps)
    if resumed is not None:
        state, run.done, run.seconds = resumed
        state = run.place(state)
        display.note(f"resuming from step {run.done:,} (checkpoint in {ckpt_dir})")
    else:
        run.record_start(state)
    try:
        state, stopped = run.loop(state)
    finally:
        display.close()
    result = run.result(state, resumed is not None)
    return _finish(result, stopped, ckpt_dir, on_divergence)


def _finish(result, stopped: str | None, checkpoint: Path | None, on_divergence: str):
    """``result``, or the stop it ended with: :class:`Interrupted` after a signal, a
    :class:`DivergenceWarning` (or ``DivergenceError``) when a seed diverged (shared by
    ``solve`` and ``solve_online``, whose caller the warning points at)."""
    if stopped is not None:
        raise Interrupted(result.message, result, checkpoint, stopped)
    if result.diverged:
        if on_divergence == "raise":
            raise DivergenceError(result.message, result)
        warnings.warn(result.message, DivergenceWarning, stacklevel=3)
    return result


@dataclasses.dataclass
class _Run:
    """The loop of one ``solve``: compiled chunks, evaluations, checkpoints, the result."""

    problem: BilevelProblem
    solver: Solver
    batched: bool
    every: int
    steps: int
    history: _History
    checkpointer: _Checkpointer
    display: _progress.Progress
    done: int = 0
    seconds: float = 0.0
    diverged_at: dict = dataclasses.field(default_factory=dict)
    over_grid: bool = False  # bl.sweep: a leading axis of grid points (history: _GridHistory)
    unit: str = "step"  # what ``steps`` counts, in messages ("round" in bl.solve_online)
    time_limit: float | None = None  # seconds of solver time after which the loop stops
    mesh: jax.sharding.Mesh | None = None  # solve(devices=...): minibatches split over it
    grid_mesh: jax.sharding.Mesh | None = None  # sweep(devices=...): grid points split over it

    def _out_of_time(self) -> bool:
        return self.time_limit is not None and self.seconds >= self.time_limit

    def _program(self, kind: str, state, length: int = 0):
        return _compiled(
            kind,
            self.solver,
            self.problem,
            state,
            length,
            self.batched,
            over_grid=self.over_grid,
            mesh=self.mesh,
            grid_mesh=self.grid_mesh,
        )

    def place(self, state):
        """``state`` where the compiled programs expect it: replicated on ``mesh``, split
        over ``grid_mesh`` along its grid axis, or as it is."""
        state = parallel.replicate(state, self.mesh)
        return parallel.shard_grid(state, self.grid_mesh, grid_axes(state))

    def evaluate(self, state, step: int):
        evaluate = self._program("eval", state)
        metrics, counts, finite = jax.device_get(evaluate(self.problem, state))
        return self.history.record(metrics, counts, finite, step, self.seconds)

    def record_start(self, state) -> None:
        finite = self.evaluate(state, 0)
        if not np.all(finite):
            flat = np.ravel(finite)
            bad = [s for s, ok in zip(self.history.seeds, flat, strict=True) if not ok]
            raise ValueError(
                f"the starting point is not finite for seeds {bad} (the initial state or "
                "metrics contain NaN/inf); check x0, y0 and the data."
            )

    def loop(self, state):
        """Chunks until ``steps`` or until every seed diverged; ``(state, signal or None)``."""
        self.display.update(self.done, self.history.rows)
        with _StopSignals() as stop:
            try:
                while self.done < self.steps and self.history.alive.any():
                    if self._out_of_time():
                        break
                    state = self._chunk(state, stop)
                    if stop.requested is not None:  # arrived during the bookkeeping
                        break
            except (_StopRequested, KeyboardInterrupt):  # the running chunk is dropped
                stop.requested = stop.requested or "SIGINT"
            if stop.requested is None:
                return state, None
            with stop.bookkeeping():
                self.save(state, force=True)
            return state, stop.requested

    def _chunk(self, state, stop: _StopSignals):
        length = min(self.every, self.steps - self.done)
        chunk = self._program("chunk", state, length)
        t0 = time.perf_counter()
        new_state = jax.block_until_ready(chunk(self.problem, state))
        elapsed = time.perf_counter() - t0
        with stop.bookkeeping():
            self.seconds += elapsed
            self.done += length
            finite = self.evaluate(new_state, self.done)
            alive = self.history.alive
            for i in np.flatnonzero(alive & ~finite):  # flat over (point, seed) in a sweep
                self.diverged_at[self.history.seeds[i]] = self.done
            alive &= finite
            state = self.place(_keep_good(new_state, state, alive, self.batched))
            self.display.update(self.done, self.history.rows)
            last = self.done >= self.steps or self._out_of_time()
            self.save(state, force=last or not alive.all())
        return state

    def save(self, state, force: bool) -> None:
        self.checkpointer.save(state, self.history, self.done, self.seconds, force)

    def diverged_seeds(self) -> list[int]:
        return [s for s, ok in zip(self.history.seeds, self.history.alive, strict=True) if not ok]

    def result(self, state, resumed: bool) -> Result:
        x, y = self.problem.models(*self.solver.output(state))
        diverged = self.diverged_seeds()
        return Result(
            x=x,
            y=y,
            history=pd.DataFrame(self.history.rows),
            state=state,
            diverged=diverged,
            message=self._message(diverged, resumed),
            solver=self.solver,
            problem_name=self.problem.name,
            seeds=self.history.seeds,
            steps=self.done,
        )

    def _message(self, diverged: list[int], resumed: bool) -> str:
        name, problem = self.solver.name, self.problem.name
        if self.diverged_at or diverged:
            detail = ", ".join(f"seed {s} by {self.unit} {k}" for s, k in self.diverged_at.items())
            return (
                f"{name} diverged on {problem} ({detail or ', '.join(map(str, diverged))}): "
                f"non-finite iterates or metrics, or a headline metric beyond "
                f"{EXPLOSION_FACTOR:.0e} x its start. Kept the history and the last finite "
                "iterates of those seeds; try smaller step sizes (lr_outer, lr_inner)."
            )
        if self.done < self.steps and self._out_of_time():
            return (
                f"stopped at {self.unit} {self.done} of {self.steps}: the time limit of "
                f"{self.time_limit:g} s of solver time was reached ({self.seconds:.3g} s)"
            )
        if self.done < self.steps and self.history.alive.any():
            saved = self.checkpointer.directory
            where = f"; checkpoint in {saved}" if saved is not None else ""
            return f"interrupted at {self.unit} {self.done} of {self.steps}{where}"
        return ("resumed; " if resumed else "") + f"completed {self.done} {self.unit}s"


#: a run whose headline metric grows beyond this factor of its start (and of 1) is diverged
EXPLOSION_FACTOR = 1e12


def _exploded(metrics: dict, step: int, history: _History) -> np.ndarray:
    """Seeds whose headline metric exploded: finite but beyond ``EXPLOSION_FACTOR`` x its start.

    Some runs blow up without ever producing inf (a zeroth-order method whose finite difference
    underflows to 0 stalls at |x| ~ 1e21); they are diverged all the same.
    """
    n_seeds = len(history.seeds)
    name = next((n for n in _progress.HEADLINE if n in metrics), None)
    if name is None or step == 0:
        return np.zeros(n_seeds, bool)
    values = np.broadcast_to(np.atleast_1d(np.asarray(metrics[name], float)), (n_seeds,))
    start = {}  # each seed's first row: step 0 in solve, round 1 in solve_online
    for r in history.rows:
        if name in r:
            start.setdefault(r["seed"], r[name])
    base = np.array([abs(start.get(s, np.inf)) for s in history.seeds])
    return np.abs(values) > EXPLOSION_FACTOR * np.maximum(base, 1.0)


def _keep_good(new_state, old_state, alive: np.ndarray, batched: bool):
    """Seeds that diverged keep their last finite state (so nothing computed is lost).

    ``alive`` has the state's leading axes: (seed,) or, in a sweep, (point, seed); there the
    PRNG key shared by the points (:func:`grid_axes`) moves on (it is not a point's result).
    """
    if alive.all():
        return new_state
    if not batched:
        return old_state
    mask = jnp.asarray(alive)

    def pick(n, o):
        return jnp.where(mask.reshape(mask.shape + (1,) * (n.ndim - mask.ndim)), n, o)

    if alive.ndim == 1:
        return jax.tree.map(pick, new_state, old_state)
    axes = grid_axes(new_state)
    if axes == 0:
        return jax.tree.map(pick, new_state, old_state)
    return type(new_state)(
        *(
            n if ax is None else jax.tree.map(pick, n, o)
            for n, o, ax in zip(new_state, old_state, axes, strict=True)
        )
    )

"""``solve``: the one driver that owns the loop.

It runs ``eval_every`` solver steps inside one compiled ``lax.scan`` (a "chunk"), vmapped over
seeds, then evaluates metrics outside the timed region, appends one history row per seed, updates
the progress bar, checks for divergence and writes a checkpoint. Compiled chunks are cached, so
a second ``solve`` with an equal solver and a problem of the same structure compiles nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from ._tree import tree_allfinite
from .metrics import default_metrics
from .oracles import Counts
from .problem import BilevelProblem
from .solvers.base import OuterState, Solver

PyTree = Any

__all__ = ["solve", "Result", "DivergenceWarning", "DivergenceError"]

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
class Result:
    """What ``solve`` returns.

    Attributes:
        x, y: final iterates (the solver's estimate of y*(x) for y); with ``seeds=`` they carry
            a leading seed axis. For a seed that diverged, its last finite iterates.
        history: one row per (seed, evaluation): ``seed, step, samples, samples_outer,
            samples_inner, oracle_calls``, the calls by kind, ``seconds`` (solver time only,
            cumulative) and the metrics: ``outer_loss``, ``inner_grad_norm``, the problem's own,
            and ``hypergrad_estimate_norm`` (the norm of the direction the solver's last outer
            step used, its hypergradient estimate; 0 at step 0).
        state: the final solver state (seed axis with ``seeds=``).
        diverged: seeds that diverged (empty if none).
        message: a human-readable status.
        solver, problem_name, seeds: what was run.
    """

    x: PyTree
    y: PyTree
    history: pd.DataFrame
    state: Any
    diverged: list[int]
    message: str
    solver: Solver
    problem_name: str
    seeds: list[int]
    steps: int

    @property
    def ok(self) -> bool:
        return not self.diverged


# ---- compiled pieces (cached) -------------------------------------------------------------------
_COMPILED: dict[Any, Any] = {}


def _aval_key(tree: PyTree):
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((np.shape(a), str(jnp.asarray(a).dtype)) for a in leaves)


def _float_leaves_finite(state) -> jax.Array:
    floats = [leaf for leaf in jax.tree.leaves(state) if jnp.issubdtype(leaf.dtype, jnp.floating)]
    return tree_allfinite(floats)


def _over_seeds(fn):
    """``fn(problem, state, hyper)`` mapped over the leading seed axis of ``state``.

    A single seed runs unbatched and gets its axis back: a vmap of size 1 is not free on
    XLA:CPU (measured 2026-11-22: 1.55x slower per step of E3's LeNet problem, whose
    window-matrix-product convolutions become batched dots). The seed count is static.
    """
    mapped = jax.vmap(fn, in_axes=(None, 0, None))

    def run(problem, state, hyper):
        if jax.tree.leaves(state)[0].shape[0] != 1:
            return mapped(problem, state, hyper)
        out = fn(problem, jax.tree.map(lambda a: a[0], state), hyper)
        return jax.tree.map(lambda a: a[None], out)

    return run


def _make_chunk(template: Solver, length: int, batched: bool):
    def one(problem, state, hyper):
        solver = template.with_step_sizes(hyper)

        def body(s, _):
            return solver.step(problem, s), None

        state, _ = jax.lax.scan(body, state, None, length=length)
        return state

    return _over_seeds(one) if batched else one


def _make_eval(template: Solver, batched: bool):
    def one(problem, state, hyper):
        x, y = template.with_step_sizes(hyper).output(state)
        metrics = default_metrics(problem, x, y)
        outer_state = getattr(state, "outer_state", None)
        if isinstance(outer_state, OuterState):  # the last hypergradient estimate's norm
            metrics["hypergrad_estimate_norm"] = outer_state.direction_norm
        finite = _float_leaves_finite(state) & tree_allfinite(metrics)
        return metrics, state.counts, finite

    return _over_seeds(one) if batched else one


def _compiled(
    kind: str,
    solver: Solver,
    problem: BilevelProblem,
    state,
    length: int,
    batched: bool,
    init=None,
):
    """The compiled ``kind`` program as a function of ``(problem, state)``.

    Numeric step sizes are arguments of the program, not constants in it (see
    ``Solver.split_step_sizes``), so solvers that differ only in them share one compilation.
    """
    template, values = solver.split_step_sizes()
    # weakly typed, like the Python floats they replace: they take the dtype of what they scale
    hyper = {name: jnp.asarray(v) for name, v in values.items()}
    key = (kind, template, length, batched, _aval_key(problem), _aval_key(state), init)
    fn = _COMPILED.get(key)
    if fn is None:
        if kind == "chunk":
            raw = _make_chunk(template, length, batched)
        elif kind == "eval":
            raw = _make_eval(template, batched)
        else:  # "init": ``state`` holds the PRNG keys

            def start(problem, key, hyper):
                if init is not None:  # a random start per seed, drawn from its own key
                    x0, y0 = init(jax.random.fold_in(key, 0x5EED))
                    problem = problem.with_start(problem.project_x(x0), y0)
                return template.with_step_sizes(hyper).init(problem, key)

            raw = _over_seeds(start) if batched else start
        fn = jax.jit(raw).lower(problem, state, hyper).compile()
        _COMPILED[key] = fn
    return functools.partial(_call_with, fn, hyper)


def _call_with(fn, hyper, problem, state):
    return fn(problem, state, hyper)


def _init_states(
    solver: Solver, problem: BilevelProblem, seeds: list[int], batched: bool, init=None
):
    keys = np.stack([np.asarray(jax.random.key_data(jax.random.key(s))) for s in seeds])
    keys = jnp.asarray(keys if batched else keys[0])
    return _compiled("init", solver, problem, keys, 0, batched, init)(problem, keys)


# ---- checkpoints ----------------------------------------------------------------------------
def _signature(
    problem: BilevelProblem, solver: Solver, seeds, batched, eval_every, init=None
) -> str:
    """A fingerprint of everything that determines the trajectory (not ``steps``)."""
    h = hashlib.sha256()
    h.update(repr(solver).encode())
    h.update(repr((problem.name, seeds, batched, eval_every, _CHECKPOINT_VERSION)).encode())
    children, _ = problem.tree_flatten()
    leaves, treedef = jax.tree.flatten(children)
    h.update(str(treedef).encode())  # structure only: function reprs hold memory addresses
    for fn in (problem.outer, problem.inner, problem.metrics, init):
        code = getattr(fn, "__code__", None)
        h.update(
            repr((getattr(fn, "__module__", None), getattr(fn, "__qualname__", None))).encode()
        )
        h.update(code.co_code if code is not None else b"")
    for leaf in leaves:
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(str((a.shape, a.dtype)).encode())
        h.update(a.tobytes() if a.nbytes <= 1 << 24 else a[:: max(1, a.shape[0] // 4096)].tobytes())
    return h.hexdigest()


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
) -> Result:
    """Run ``solver`` on ``problem`` for ``steps`` outer iterations.

    Args:
        problem: a :class:`bilevel.BilevelProblem`.
        solver: from ``bl.solvers.make(name, ...)``.
        steps: number of outer iterations.
        seed: the PRNG seed of a single run.
        seeds: several seeds run as one vmapped program (results get a leading seed axis).
        eval_every: steps between evaluations (metrics, history rows, progress, divergence
            checks, checkpoints); ``None`` = once at the end. Capped at ``steps``.
        checkpoint: a directory. The run saves there (atomically, at most every
            ``checkpoint_interval`` seconds and at the end) and, called again with the same
            arguments, resumes from the latest checkpoint and ends bit-identical to an
            uninterrupted run. The file is an ``.npz`` read with ``allow_pickle=False``.
        checkpoint_interval: minimum seconds between checkpoint writes (0 = every evaluation).
        progress: show a progress bar (step, samples, latest metric, ETA).
        on_divergence: ``"warn"`` (a :class:`DivergenceWarning`, results kept) or ``"raise"``
            (a :class:`DivergenceError` whose ``.result`` holds them).
        init: optional ``init(key) -> (x0, y0)`` drawing a random start per seed (the "random
            initialisations" of the papers' protocols); x0 is projected onto x_set. It must be
            a jit-able function of the key, returning pytrees shaped like the problem's x0, y0.

    Returns:
        A :class:`Result`.
    """
    if not isinstance(problem, BilevelProblem):
        raise TypeError(
            f"solve(problem=...) needs a bl.BilevelProblem, got {type(problem).__name__}."
        )
    if not isinstance(solver, Solver):
        raise TypeError(
            f"solve(solver=...) needs a solver from bl.solvers.make(...), got "
            f"{type(solver).__name__}."
        )
    if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps < 1:
        raise ValueError(f"solve(steps=...) must be a positive int, got {steps!r}.")
    steps = int(steps)
    if on_divergence not in ("warn", "raise"):
        raise ValueError(f"on_divergence must be 'warn' or 'raise', got {on_divergence!r}.")
    batched = seeds is not None
    seed_list = [int(s) for s in (seeds if batched else [seed])]
    if batched and not seed_list:
        raise ValueError("solve(seeds=...) is empty; give at least one seed.")
    if len(set(seed_list)) != len(seed_list):
        raise ValueError(f"solve(seeds=...) has repeated seeds: {seed_list}.")
    every = steps if eval_every is None else int(eval_every)
    if every < 1:
        raise ValueError(f"solve(eval_every=...) must be a positive int, got {eval_every!r}.")
    every = min(every, steps)
    solver.check_problem(problem)
    solver = solver.resolve(problem)

    state = _init_states(solver, problem, seed_list, batched, init)
    evaluate = _compiled("eval", solver, problem, state, 0, batched)

    ckpt_dir = Path(checkpoint) if checkpoint is not None else None
    signature = _signature(problem, solver, seed_list, batched, every, init)
    rows: list[dict] = []
    done, seconds = 0, 0.0
    totals = None  # per-seed Python-int totals of the counters (no int32 overflow)
    alive = np.ones(len(seed_list), bool)
    resumed = ckpt_dir is not None and (ckpt_dir / _CHECKPOINT_FILE).exists()
    if resumed:
        state, meta, rows = _load_checkpoint(ckpt_dir, state, signature)
        done, seconds = int(meta["step"]), float(meta["seconds"])
        totals = [dict(t) for t in meta["totals"]]
        alive = np.array(meta["alive"], bool)
        if done > steps:
            raise ValueError(
                f"the checkpoint in {ckpt_dir} is at step {done}, beyond steps="
                f"{steps}; ask for at least {done} steps or use another directory."
            )

    def record(state_now, step_now):
        nonlocal totals
        metrics, counts, finite = jax.device_get(evaluate(problem, state_now))
        counts_np = {
            k: np.atleast_1d(np.asarray(v)).astype(np.int64) & 0xFFFFFFFF
            for k, v in counts._asdict().items()
        }
        if totals is None:
            totals = [
                {k: 0 for k in Counts._fields} | {"raw": {k: 0 for k in Counts._fields}}
                for _ in seed_list
            ]
        finite = np.atleast_1d(np.asarray(finite))
        exploded = _exploded(metrics, step_now, len(seed_list), rows, seed_list)
        finite = finite & ~exploded
        for i, s in enumerate(seed_list):
            t = totals[i]
            for k in Counts._fields:  # counters are int32 and may wrap: add deltas mod 2^32
                raw = int(counts_np[k][i] if counts_np[k].size > 1 else counts_np[k][0])
                t[k] += (raw - t["raw"][k]) % (1 << 32)
                t["raw"][k] = raw
            if not (alive[i] and finite[i]):
                continue
            row = {
                "seed": s,
                "step": step_now,
                "samples": t["samples_outer"] + t["samples_inner"],
                "samples_outer": t["samples_outer"],
                "samples_inner": t["samples_inner"],
                "oracle_calls": sum(t[k] for k in Counts._fields if not k.startswith("samp")),
            }
            row.update({k: t[k] for k in Counts._fields if not k.startswith("samples")})
            row["seconds"] = seconds
            for name, v in metrics.items():
                v = np.atleast_1d(np.asarray(v))
                row[name] = float(v[i] if v.size > 1 else v[0])
            rows.append(row)
        return finite

    if not resumed:
        finite0 = record(state, 0)
        if not np.all(finite0):
            bad = [s for s, ok in zip(seed_list, finite0, strict=True) if not ok]
            raise ValueError(
                f"the starting point is not finite for seeds {bad} (the initial "
                "state or metrics contain NaN/inf); check x0, y0 and the data."
            )

    progress_bar = _Progress(progress, steps, problem.name, solver.name)
    progress_bar.update(done, rows)
    last_save = time.monotonic()
    diverged_at: dict[int, int] = {}
    try:
        while done < steps and alive.any():
            length = min(every, steps - done)
            chunk = _compiled("chunk", solver, problem, state, length, batched)
            t0 = time.perf_counter()
            new_state = chunk(problem, state)
            jax.block_until_ready(new_state)
            seconds += time.perf_counter() - t0
            done += length
            finite = record(new_state, done)
            newly = alive & ~finite
            for i in np.flatnonzero(newly):
                diverged_at[seed_list[i]] = done
            alive &= finite
            state = _keep_good(new_state, state, alive, batched)
            progress_bar.update(done, rows)
            if ckpt_dir is not None and (
                time.monotonic() - last_save >= checkpoint_interval
                or done >= steps
                or not alive.all()
            ):
                meta = {
                    "signature": signature,
                    "step": done,
                    "seconds": seconds,
                    "totals": totals,
                    "alive": alive.tolist(),
                }
                _save_checkpoint(ckpt_dir, state, meta, rows)
                last_save = time.monotonic()
    finally:
        progress_bar.close()

    history = pd.DataFrame(rows)
    x, y = solver.output(state)
    diverged = [s for s, ok in zip(seed_list, alive, strict=True) if not ok]
    if diverged_at or diverged:
        detail = ", ".join(f"seed {s} by step {k}" for s, k in diverged_at.items()) or ", ".join(
            f"seed {s}" for s in diverged
        )
        message = (
            f"{solver.name} diverged on {problem.name} ({detail}): non-finite iterates or "
            f"metrics, or a headline metric beyond {EXPLOSION_FACTOR:.0e} x its start. Kept "
            "the history and the last finite iterates of those seeds; try smaller step sizes "
            "(lr_outer, lr_inner)."
        )
    else:
        message = f"completed {done} steps"
    result = Result(
        x=x,
        y=y,
        history=history,
        state=state,
        diverged=diverged,
        message=message,
        solver=solver,
        problem_name=problem.name,
        seeds=seed_list,
        steps=done,
    )
    if diverged:
        if on_divergence == "raise":
            raise DivergenceError(message, result)
        warnings.warn(message, DivergenceWarning, stacklevel=2)
    return result


#: a run whose headline metric grows beyond this factor of its start (and of 1) is diverged
EXPLOSION_FACTOR = 1e12
_HEADLINE = ("grad_norm", "outer_loss")


def _exploded(metrics: dict, step: int, n_seeds: int, rows: list[dict], seeds: list[int]):
    """Seeds whose headline metric exploded: finite but beyond ``EXPLOSION_FACTOR`` x its start.

    Some runs blow up without ever producing inf (a zeroth-order method whose finite difference
    underflows to 0 stalls at |x| ~ 1e21); they are diverged all the same.
    """
    name = next((n for n in _HEADLINE if n in metrics), None)
    if name is None or step == 0:
        return np.zeros(n_seeds, bool)
    values = np.broadcast_to(np.atleast_1d(np.asarray(metrics[name], float)), (n_seeds,))
    start = {r["seed"]: r[name] for r in rows if r["step"] == 0 and name in r}
    base = np.array([abs(start.get(s, np.inf)) for s in seeds])
    return np.abs(values) > EXPLOSION_FACTOR * np.maximum(base, 1.0)


def _keep_good(new_state, old_state, alive: np.ndarray, batched: bool):
    """Seeds that diverged keep their last finite state (so nothing computed is lost)."""
    if alive.all():
        return new_state
    if not batched:
        return old_state
    mask = jnp.asarray(alive)

    def pick(n, o):
        return jnp.where(mask.reshape((-1,) + (1,) * (n.ndim - 1)), n, o)

    return jax.tree.map(pick, new_state, old_state)


class _Progress:
    """A rich progress bar: step, samples, the latest headline metric and an ETA."""

    HEADLINE = ("grad_norm", "outer_loss")

    def __init__(self, enabled: bool, steps: int, problem_name: str, solver_name: str):
        self.bar = None
        if not enabled:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(
            TextColumn(f"[bold]{solver_name}[/] on {problem_name[:40]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
        )
        self.task = self.bar.add_task("solve", total=steps, info="")
        self.bar.start()

    def update(self, done: int, rows: list[dict]) -> None:
        if self.bar is None:
            return
        info = ""
        if rows:
            last = rows[-1]
            info = f"samples {last['samples']:,}"
            for name in self.HEADLINE:
                if name in last:
                    info += f"  {name} {last[name]:.3e}"
                    break
        self.bar.update(self.task, completed=done, info=info)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()

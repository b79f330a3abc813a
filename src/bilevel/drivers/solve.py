"""``solve``: run a solver on an offline problem with :class:`bilevel.drivers.engine.Engine`.

``solve`` checks its arguments, resolves the solver, draws the seeds' starting states, takes up
a checkpoint if there is one, and hands the loop to the engine. Compiled programs are cached
(:mod:`bilevel.drivers.programs`), so a second ``solve`` with a solver and a problem of the same
structure compiles nothing, also when the solver's numeric hyperparameters differ (they are
arguments of the compiled programs). The pure loop it compiles is
:func:`bilevel.drivers.loop.iterate`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax

from bilevel.core import sharding as parallel
from bilevel.core.oracles import Counts
from bilevel.core.problem import BilevelProblem
from bilevel.drivers.checkpoints import Checkpointer, Resume, remove_partial_writes, signature
from bilevel.drivers.checks import (
    check_arguments,
    check_checkpoint_dir,
    check_convexity,
    check_seeds,
    check_time_limit,
)
from bilevel.drivers.cpu_rewrites import CpuRewrites, resolve
from bilevel.drivers.curvature import InnerCurvature, followed_fields
from bilevel.drivers.engine import Engine, Schedule
from bilevel.drivers.history import History
from bilevel.drivers.loggers import check_log_to, logged
from bilevel.drivers.programs import ProgramSettings, init_states
from bilevel.drivers.progress import Progress
from bilevel.drivers.results import Result, finish
from bilevel.drivers.retries import PathScores, Run, final_of, lowest_run, retry_reason
from bilevel.drivers.run_lock import RunLock
from bilevel.drivers.tuning import needs_tuning, tune
from bilevel.drivers.tuning_runs import DEAD, GRADIENT_SCORES
from bilevel.drivers.writes import WriteError
from bilevel.solvers.base import Solver

PyTree = Any

__all__ = ["solve"]


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
    cpu_rewrites: CpuRewrites | bool | None = None,
    log_to: str | os.PathLike | None = None,
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
            ``allow_pickle=False``, carrying a sha256 of its content: a damaged or edited one is
            refused, as is one written under other ``cpu_rewrites``, another float width
            (``jax_enable_x64``) or another JAX version. The run owns the directory while it
            goes (a lock file, ``bilevel.lock``, naming its pid and host): a second run on it
            is refused while the first is alive (docs/runs.md).
            With ``lr_outer="auto"`` the tuning runs again (deterministically) before the run
            resumes; its length follows ``steps``, so to extend a tuned run to more steps give
            ``lr_outer=res.tuning.step`` (another tuning may choose another step, and the
            checkpoint of a run with another step is refused).
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
        cpu_rewrites: which XLA:CPU rewrites the compiled steps go through (a
            :class:`bilevel.CpuRewrites`; ``None`` or ``True``: the defaults, ``False``: none).
            They change values only by floating-point summation order, and apply on the CPU
            backend without a mesh (``bilevel.drivers.cpu_rewrites``).
        log_to: a directory (created if missing) to stream the history to TensorBoard as the
            run goes (``tensorboard --logdir DIR``): one TensorBoard run per seed
            (``DIR/seed_<s>``), every numeric column of ``result.history`` a scalar (float32)
            at its ``step``, and the solver's hyperparameters and the run's settings in the
            HParams and Text dashboards. Flushed every few seconds, at the end and when
            interrupted; a run resumed from ``checkpoint`` continues the log from its
            checkpoint's step, and a fresh run replaces what an earlier one logged there
            (:mod:`bilevel.drivers.loggers`). Needs ``pip install 'bilevel[tensorboard]'``.

    Returns:
        A :class:`Result`.

    Raises:
        Interrupted: on Ctrl-C (SIGINT) or SIGTERM, after writing the checkpoint (when one was
            asked for); its ``.result`` holds the history and iterates of the steps done.
        ImportError: ``log_to`` without ``tensorboardX`` installed (naming the extra).
        ValueError: bad arguments; a checkpoint directory in use by another run
            (:class:`bilevel.drivers.run_lock.DirectoryInUse`); a corrupt checkpoint
            (:class:`bilevel.drivers.checkpoint_integrity.CorruptCheckpoint`) or one of
            another run.
        WriteError: (an ``OSError``, :class:`bilevel.drivers.writes.WriteError`) when a
            checkpoint cannot be written (a full disk, a read-only directory): it names the
            file and keeps the errno; its ``.result`` holds the steps done; the previous
            checkpoint stays, so the same call resumes from it once the fault is gone.
        NotStronglyConvexWarning: (a warning) when g(x0, .) does not look strongly convex.
    """
    steps, every = check_arguments(problem, solver, steps, on_divergence, eval_every)
    check_time_limit(time_limit)
    seed_list = check_seeds(seed, seeds)
    mesh = parallel.make_mesh(devices, mesh)
    ckpt_dir = check_checkpoint_dir(checkpoint)
    log_dir = check_log_to(log_to)
    settings = ProgramSettings(mesh=mesh, cpu_rewrites=resolve(cpu_rewrites))
    plan = _Plan(steps, every, seed_list, seeds is not None, init, settings, mesh, ckpt_dir,
                 checkpoint_interval, progress, time_limit, log_dir)  # fmt: skip
    with _owned(ckpt_dir, progress):
        result, stopped = _solve(problem, solver, plan)
    # here, so that a DivergenceWarning points at solve's caller
    return finish(result, stopped, ckpt_dir, on_divergence)


def _solve(problem, solver: Solver, plan: _Plan) -> tuple[Result, str | None]:
    """``solve`` once its arguments are checked and its checkpoint directory is owned:
    ``(result, signal or None)``."""
    solver.check_problem(problem)
    solver = solver.with_horizon(plan.steps)
    solver, tuning = _tuned(problem, solver, plan.steps, plan.seeds[0], plan.init, plan.settings)
    parallel.check_batch_size(getattr(solver, "batch_size", None), plan.mesh)
    check_convexity(problem)
    run, stopped = _attempt(problem, solver, tuning, plan)
    runs = [run]
    # a tuned step whose run diverged or drifted: the next smaller candidate
    checkpointed = plan.ckpt_dir is not None
    while stopped is None and (reason := retry_reason(problem, run, plan.steps, checkpointed)):
        tuning = tuning.retried(_smaller(tuning), run.spent, reason)
        solver = dataclasses.replace(solver, lr_outer=tuning.step)
        run, stopped = _attempt(problem, solver, tuning, plan)
        runs.append(run)
    result = run.result
    if stopped is None and len(runs) > 1:
        result, tuning = lowest_run(runs)
    _note_tuning(result, tuning)
    return result, stopped


@contextlib.contextmanager
def _owned(ckpt_dir, progress: bool):
    """The checkpoint directory held by this run for its duration (a lock file,
    :class:`bilevel.drivers.run_lock.RunLock`; refused while another live run holds it), and
    the temporary files of a checkpoint write killed mid-way removed. Only process 0 writes
    checkpoints, so only it takes the lock."""
    if ckpt_dir is None or not parallel.is_main_process():
        yield
        return

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with RunLock(ckpt_dir, "checkpoint directory", log=say if progress else None):
        remove_partial_writes(ckpt_dir)
        yield


class _Plan(NamedTuple):
    """How ``solve`` runs, checked: what each attempt (:func:`_attempt`) needs."""

    steps: int
    every: int
    seeds: list[int]
    batched: bool  # seeds= (a leading seed axis in the result)
    init: Callable | None
    settings: ProgramSettings
    mesh: jax.sharding.Mesh | None
    ckpt_dir: Any
    interval: float
    progress: bool
    time_limit: float | None
    log_to: Any = None  # the TensorBoard directory (loggers)


def _attempt(problem, solver: Solver, tuning, plan: _Plan) -> tuple[Run, str | None]:
    """One run of ``solver`` (``lr_outer`` a number or a schedule): ``(run, signal or None)``,
    the run with the counter totals spent and, for a tuned step, its final and lowest scores."""
    template, solver = solver, solver.resolve(problem)
    placed = parallel.replicate(problem, plan.mesh)  # the data on every device of the mesh
    state = init_states(solver, placed, plan.seeds, plan.init, mesh=plan.mesh)
    followed = followed_fields(template, solver)
    adapt = InnerCurvature(solver, followed, placed, state) if followed else None
    if adapt is not None:
        solver = adapt.at_start(placed, solver, state)
    history = History(plan.seeds, offset=None if tuning is None else tuning.counts)
    checkpointer = _checkpointer(problem, solver, plan)
    resume = None if checkpointer is None else checkpointer.load(state, history, plan.steps)
    show = plan.progress and parallel.is_main_process()  # one progress display per run
    display = Progress(show, plan.steps, solver.name, problem.name, len(plan.seeds))
    if tuning is not None:
        display.note(tuning.summary())
    display = _logged(display, problem, solver, plan, history, resume)
    schedule = Schedule(plan.steps, plan.every, plan.time_limit)
    path = PathScores(problem, solver, tuning, plan.steps) if _scored(tuning, plan) else None
    engine = Engine(placed, solver, schedule, history, display, settings=plan.settings,
                    checkpointer=checkpointer, resume=resume, adapt=adapt, watch=path)  # fmt: skip
    try:
        state, stopped = _run(engine, state, resume, plan.ckpt_dir)
    except WriteError as err:  # a checkpoint write failed: the steps done go with the error
        if err.state is not None:
            err.result = engine.result(err.state, seed_axis=plan.batched)
        raise
    # what the seeds drew and called, diverged evaluations included (a retry counts them)
    spent = {k: max(t[k] for t in history.totals) for k in Counts._fields}
    result = engine.result(state, seed_axis=plan.batched)
    if path is None:
        return Run(result, spent, tuning, math.nan), stopped
    final = final_of(problem, result, tuning, plan.steps, plan.batched)
    return Run(result, spent, tuning, final, path.lowest_in(result)), stopped


def _scored(tuning, plan: _Plan) -> bool:
    """Whether a run keeps its final and lowest gradient-type scores, which decide its retry:
    a tuned step with such a score, and no checkpoint (a checkpointed run is never retried)."""
    return tuning is not None and plan.ckpt_dir is None and tuning.score in GRADIENT_SCORES


def _run(engine: Engine, state, resume: Resume | None, ckpt_dir):
    """The engine's loop from the checkpoint, or from a fresh ``state`` (checked first);
    ``(state, signal or None)``."""
    if resume is not None:
        state = engine.place(resume.state)
        engine.adapt_to(state)  # the steps the uninterrupted run had here
        engine.display.note(f"resuming from step {resume.step:,} (checkpoint in {ckpt_dir})")
    else:
        engine.start(state)
    try:
        return engine.loop(state)
    finally:
        engine.display.close()


def _logged(display: Progress, problem, solver: Solver, plan: _Plan, history, resume):
    """``display``, with the run's TensorBoard log behind it when ``log_to`` was given (on
    process 0 only): the rows a resumed run restored are not logged again."""
    if not parallel.is_main_process():
        return display
    settings = {
        "problem": problem.name,
        "steps": plan.steps,
        "eval_every": plan.every,
        "seeds": len(plan.seeds),
        "time_limit": plan.time_limit,
        "devices": 1 if plan.mesh is None else plan.mesh.size,
        "init": "random" if plan.init is not None else "x0",
    }
    first = 0 if resume is None else resume.step + 1
    return logged(display, plan.log_to, solver, settings, history, first)


def _note_tuning(result: Result, tuning) -> None:
    """Attach the tuning to ``result``; when the run diverged, say what to lower and to what."""
    result.tuning = tuning
    if tuning is not None and result.diverged:
        tried = "".join(f", then {v:.3g}" for v in tuning.retries)
        result.message += (
            f" lr_outer was chosen by a {tuning.steps}-step tuning run ({tuning.value:.3g}"
            f"{tried}); give lr_outer={_smaller(tuning):.3g} (the next smaller candidate) "
            "instead."
        )


def _checkpointer(problem, solver: Solver, plan: _Plan) -> Checkpointer | None:
    """The run's :class:`Checkpointer`, or ``None`` without a checkpoint directory."""
    if plan.ckpt_dir is None:
        return None
    # the fingerprint hashes the data: not free on large problems
    rewrites = _applied_rewrites(plan.settings)
    fingerprint = signature(
        problem, solver, plan.seeds, plan.batched, plan.every, plan.init, rewrites
    )
    return Checkpointer(plan.ckpt_dir, fingerprint, plan.interval, plan.batched, rewrites)


def _tuned(problem, solver: Solver, steps: int, seed: int, init, settings: ProgramSettings):
    """``(solver, tuning)``: with ``lr_outer="auto"`` a short run on this problem chooses it
    (:func:`bilevel.drivers.tuning.tune`); otherwise ``(solver, None)``."""
    if not needs_tuning(solver):
        return solver, None
    tuning = tune(problem, solver, steps, seed=seed, init=init, cpu_rewrites=settings.cpu_rewrites)
    return dataclasses.replace(solver, lr_outer=tuning.step), tuning


def _smaller(tuning) -> float:
    """The next smaller candidate that did not diverge in the tuning run (one that did would
    diverge in the longer run too), or a tenth of the value when there is none."""
    below = [
        v for v, why in zip(tuning.grid, tuning.dropped, strict=True)
        if v < tuning.value and why not in DEAD
    ]  # fmt: skip
    return below[-1] if below else tuning.value / 10


def _applied_rewrites(settings: ProgramSettings) -> CpuRewrites:
    """The rewrite options the run's step programs go through (none on another backend or
    with a mesh): they move the rounding, so a checkpoint records them and a resume under
    others is refused."""
    chunk = settings.spec("chunk")
    return chunk.cpu_rewrites if chunk.rewritten else CpuRewrites.none()

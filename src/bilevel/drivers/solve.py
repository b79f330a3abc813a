"""``solve``: run a solver on an offline problem with :class:`bilevel.drivers.engine.Engine`.

``solve`` checks its arguments, resolves the solver, draws the seeds' starting states, takes up
a checkpoint if there is one, and hands the loop to the engine. Compiled programs are cached
(:mod:`bilevel.drivers.programs`), so a second ``solve`` with a solver and a problem of the same
structure compiles nothing, also when the solver's numeric hyperparameters differ (they are
arguments of the compiled programs). The pure loop it compiles is
:func:`bilevel.drivers.loop.iterate`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import jax

from bilevel.core import sharding as parallel
from bilevel.core.problem import BilevelProblem
from bilevel.drivers.checkpoints import Checkpointer, Resume, signature
from bilevel.drivers.checks import (
    check_arguments,
    check_checkpoint_dir,
    check_convexity,
    check_seeds,
    check_time_limit,
)
from bilevel.drivers.cpu_rewrites import CpuRewrites, resolve
from bilevel.drivers.engine import Engine, Schedule
from bilevel.drivers.history import History
from bilevel.drivers.programs import ProgramSettings, init_states
from bilevel.drivers.progress import Progress
from bilevel.drivers.results import Result, finish
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
            ``allow_pickle=False``. A checkpoint written under other ``cpu_rewrites`` is refused.
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

    Returns:
        A :class:`Result`.

    Raises:
        Interrupted: on Ctrl-C (SIGINT) or SIGTERM, after writing the checkpoint (when one was
            asked for); its ``.result`` holds the history and iterates of the steps done.
        NotStronglyConvexWarning: (a warning) when g(x0, .) does not look strongly convex.
    """
    steps, every = check_arguments(problem, solver, steps, on_divergence, eval_every)
    check_time_limit(time_limit)
    seed_list = check_seeds(seed, seeds)
    mesh = parallel.make_mesh(devices, mesh)
    ckpt_dir = check_checkpoint_dir(checkpoint)
    settings = ProgramSettings(mesh=mesh, cpu_rewrites=resolve(cpu_rewrites))
    solver.check_problem(problem)
    solver = solver.with_horizon(steps).resolve(problem)
    parallel.check_batch_size(getattr(solver, "batch_size", None), mesh)
    check_convexity(problem)

    placed = parallel.replicate(problem, mesh)  # the data on every device of the mesh
    state = init_states(solver, placed, seed_list, init, mesh=mesh)
    history = History(seed_list)
    checkpointer, batched = None, seeds is not None
    if ckpt_dir is not None:  # the fingerprint hashes the data: not free on large problems
        rewrites = _applied_rewrites(settings)
        fingerprint = signature(problem, solver, seed_list, batched, every, init, rewrites)
        checkpointer = Checkpointer(ckpt_dir, fingerprint, checkpoint_interval, batched, rewrites)
    resume = None if checkpointer is None else checkpointer.load(state, history, steps)
    show = progress and parallel.is_main_process()  # one progress display per run
    display = Progress(show, steps, solver.name, problem.name, len(seed_list))
    schedule = Schedule(steps, every, time_limit)
    engine = Engine(
        placed,
        solver,
        schedule,
        history,
        display,
        settings=settings,
        checkpointer=checkpointer,
        resume=resume,
    )
    state, stopped = _run(engine, state, resume, ckpt_dir)
    result = engine.result(state, seed_axis=batched)
    return finish(result, stopped, ckpt_dir, on_divergence)


def _run(engine: Engine, state, resume: Resume | None, ckpt_dir):
    """The engine's loop from the checkpoint, or from a fresh ``state`` (checked first);
    ``(state, signal or None)``."""
    if resume is not None:
        state = engine.place(resume.state)
        engine.display.note(f"resuming from step {resume.step:,} (checkpoint in {ckpt_dir})")
    else:
        engine.start(state)
    try:
        return engine.loop(state)
    finally:
        engine.display.close()


def _applied_rewrites(settings: ProgramSettings) -> CpuRewrites:
    """The rewrite options the run's step programs go through (none on another backend or
    with a mesh): they move the rounding, so a checkpoint records them and a resume under
    others is refused."""
    chunk = settings.spec("chunk")
    return chunk.cpu_rewrites if chunk.rewritten else CpuRewrites.none()

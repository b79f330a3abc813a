"""The loop engine every driver runs: compiled chunks, evaluations, stops, the result.

:class:`Engine` runs ``schedule.every`` solver steps at a time in one compiled program (a
"chunk", :mod:`bilevel.drivers.programs`), vmapped over seeds; between chunks, outside the
timed region, it records the history, marks the seeds that diverged (they keep their last
finite state, :mod:`bilevel.drivers.divergence`), updates the progress display and writes a
checkpoint. It stops after ``schedule.steps``, when every seed diverged, when the time limit is
reached, or on a signal (:mod:`bilevel.drivers.signals`). The state always carries a leading
seed axis; :meth:`Engine.result` removes it for a single ``seed=`` run.

Extending the engine. ``bl.solve`` uses it as it is. The other drivers change it through its
public interface only:

- ``bl.sweep`` (:mod:`bilevel.drivers.sweep`) passes ``ProgramSettings(over_grid=True)``, so
  every program is also vmapped over a leading axis of grid points, and a history with one
  :class:`~bilevel.drivers.history.History` per point behind the same interface: ``seeds``,
  ``rows``, ``alive`` (a boolean array over the state's leading axes, updated in place) and
  ``record(metrics, counts, finite, step, seconds) -> finite``.
- ``bl.solve_online`` (:mod:`bilevel.drivers.online`) subclasses :class:`Engine` and overrides
  its three hooks: :meth:`Engine.step_program` (the compiled program of a chunk: there a scan of
  rounds that also returns every round's trace), :meth:`Engine.record` (what a chunk's output
  adds to the history: there one row per round and the regret) and :meth:`Engine.start` (the
  check of the starting point).

The chunk loop itself (timing, stops, divergence bookkeeping, checkpoints) is written once,
here.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import jax
import numpy as np
import pandas as pd

from bilevel.core.problem import BilevelProblem
from bilevel.drivers import programs
from bilevel.drivers.checkpoints import Checkpointer, Resume
from bilevel.drivers.divergence import EXPLOSION_FACTOR, keep_good
from bilevel.drivers.progress import Progress
from bilevel.drivers.results import Result, drop_seed_axis
from bilevel.drivers.signals import StopRequested, StopSignals
from bilevel.solvers.base import Solver

__all__ = ["Chunk", "Engine", "Schedule", "ADAPT_EVERY"]

#: a solver that follows the run (``Engine(adapt=...)``) is adapted at least every this many
#: steps, between evaluations too
ADAPT_EVERY = 25


class Schedule(NamedTuple):
    """How long a run goes and how often it evaluates.

    Attributes:
        steps: the steps (rounds) to run.
        every: the steps per chunk, between evaluations (at most ``steps``).
        time_limit: seconds of solver time after which the loop stops (``None``: no limit).
        unit: what ``steps`` counts, in messages (``"round"`` in ``bl.solve_online``).
    """

    steps: int
    every: int
    time_limit: float | None = None
    unit: str = "step"


class Chunk(NamedTuple):
    """One chunk the engine ran, as :meth:`Engine.record` is told about it."""

    first: int  # steps done before it
    length: int  # its steps
    seconds: float  # solver seconds before it
    elapsed: float  # its own solver seconds


class Engine:
    """The loop of one run (see the module docstring); built complete, then :meth:`start`
    (unless resumed), :meth:`loop` and :meth:`result`.

    Args:
        problem: the problem (placed on the run's mesh, if any).
        solver: the resolved solver (stacked over grid points in a sweep).
        schedule: steps, chunk length, time limit.
        history: a :class:`~bilevel.drivers.history.History` or one with its interface.
        display: the progress display.
        settings: what all the run's programs share (grid axis, meshes, CPU rewrites);
            ``None``: none of them.
        checkpointer: where checkpoints go (``None``: none).
        resume: the checkpoint the run takes up from (``None``: a fresh start).
        adapt: ``adapt(problem, solver, state) -> solver``, called after every chunk (and by
            :meth:`adapt_to`): the solver's numeric hyperparameters may follow the run
            (``bl.solve``'s ``"auto"`` inner steps, :mod:`bilevel.drivers.curvature`; their
            ``"auto"`` truncation counts change the program, compiled once per count).
            ``None``: the solver stays as given.
        watch: ``watch(steps_done, state)``, called after every chunk once the state is kept
            (``bl.solve``'s :class:`bilevel.drivers.retries.PathScores`); ``None``: nothing.
    """

    def __init__(
        self,
        problem: BilevelProblem,
        solver: Solver,
        schedule: Schedule,
        history,
        display: Progress,
        *,
        settings: programs.ProgramSettings | None = None,
        checkpointer: Checkpointer | None = None,
        resume: Resume | None = None,
        adapt=None,
        watch=None,
    ):
        self.problem = problem
        self.solver = solver
        self.schedule = schedule
        self.history = history
        self.display = display
        self.settings = programs.ProgramSettings() if settings is None else settings
        self.checkpointer = checkpointer
        self.resumed = resume is not None
        self.done = 0 if resume is None else resume.step
        self.seconds = 0.0 if resume is None else resume.seconds
        self.diverged_at: dict[Any, int] = {}  # seed -> step (round) by which it diverged
        self.adapt = adapt
        self.watch = watch

    # ---- hooks ---------------------------------------------------------------------------
    def step_program(self, state, length: int):
        """Hook: the compiled program of a chunk of ``length`` steps, ``fn(problem, state)``;
        its output goes to :meth:`record`. Default: ``length`` solver steps."""
        return self.program("chunk", state, length)

    def record(self, output, chunk: Chunk) -> tuple[Any, np.ndarray]:
        """Hook: add what a chunk's ``output`` says to the history, after ``done`` and
        ``seconds`` moved past it; ``(new state, finite per seed)``. Default: the evaluation
        of the new state (one row per seed)."""
        return output, self.evaluate(output, self.done)

    def start(self, state) -> None:
        """Hook: the check of a fresh start. Default: its evaluation is the history's first
        row per seed, and a start that is not finite is refused (ValueError)."""
        finite = self.evaluate(state, 0)
        if not np.all(finite):
            flat = np.ravel(finite)
            bad = [s for s, ok in zip(self.history.seeds, flat, strict=True) if not ok]
            raise ValueError(
                f"the starting point is not finite for seeds {bad} (the initial state or "
                "metrics contain NaN/inf); check x0, y0 and the data."
            )

    # ---- the pieces ------------------------------------------------------------------------
    def program(self, kind, state, length: int = 0, build=None):
        """The compiled ``kind`` program of this run (:func:`bilevel.drivers.programs.program`)."""
        spec = self.settings.spec(kind, length)
        return programs.program(spec, self.solver, self.problem, state, build)

    def place(self, state):
        """``state`` where the compiled programs expect it (:func:`programs.place`)."""
        return programs.place(state, self.settings.mesh, self.settings.grid_mesh)

    def evaluate(self, state, step: int) -> np.ndarray:
        """Record the rows of ``state`` at ``step``; which seeds are finite."""
        spec = self.settings.spec("eval")
        metrics, counts, finite = programs.evaluate(spec, self.solver, self.problem, state)
        return self.history.record(metrics, counts, finite, step, self.seconds)

    def adapt_to(self, state) -> None:
        """Let the solver's hyperparameters follow ``state`` (the ``adapt`` argument)."""
        if self.adapt is not None:
            self.solver = self.adapt(self.problem, self.solver, state)

    def out_of_time(self) -> bool:
        limit = self.schedule.time_limit
        return limit is not None and self.seconds >= limit

    def save(self, state, force: bool) -> None:
        if self.checkpointer is not None:
            self.checkpointer.save(state, self.history, self.done, self.seconds, force)

    # ---- the loop --------------------------------------------------------------------------
    def loop(self, state):
        """Chunks until ``steps`` or until every seed diverged; ``(state, signal or None)``."""
        self.display.update(self.done, self.history.rows)
        with StopSignals() as stop:
            try:
                while self.done < self.schedule.steps and self.history.alive.any():
                    if self.out_of_time():
                        break
                    state = self._chunk(state, stop)
                    if stop.requested is not None:  # arrived during the bookkeeping
                        break
            except (StopRequested, KeyboardInterrupt):  # the running chunk is dropped
                stop.requested = stop.requested or "SIGINT"
            if stop.requested is None:
                return state, None
            with stop.bookkeeping():
                self.save(state, force=True)
            return state, stop.requested

    def _chunk(self, state, stop: StopSignals):
        length = min(self.schedule.every, self.schedule.steps - self.done)
        t0 = time.perf_counter()
        output = self._run_pieces(state, length)
        elapsed = time.perf_counter() - t0
        with stop.bookkeeping():
            chunk = Chunk(self.done, length, self.seconds, elapsed)
            self.seconds += elapsed
            self.done += length
            new_state, finite = self.record(output, chunk)
            alive = self.history.alive
            for i in np.flatnonzero(alive & ~finite):  # flat over (point, seed) in a sweep
                self.diverged_at[self.history.seeds[i]] = self.done
            alive &= finite
            state = self.place(keep_good(new_state, state, alive))
            self.adapt_to(state)
            if self.watch is not None:
                self.watch(self.done, state)
            self.display.update(self.done, self.history.rows)
            last = self.done >= self.schedule.steps or self.out_of_time()
            self.save(state, force=last or not alive.all())
        return state

    def _run_pieces(self, state, length: int):
        """A chunk's output: one program of ``length`` steps, or, when the solver follows the
        run (``adapt``), pieces of at most :data:`ADAPT_EVERY` steps with ``adapt`` between
        them (it is part of the solver's work, so it is timed with it)."""
        if self.adapt is None:
            return jax.block_until_ready(self.step_program(state, length)(self.problem, state))
        done = 0
        while done < length:
            piece = min(ADAPT_EVERY, length - done)
            state = jax.block_until_ready(self.step_program(state, piece)(self.problem, state))
            done += piece
            if done < length:
                self.adapt_to(state)
        return state

    # ---- how it ended ----------------------------------------------------------------------
    def diverged_seeds(self) -> list:
        return [s for s, ok in zip(self.history.seeds, self.history.alive, strict=True) if not ok]

    def result(self, state, seed_axis: bool) -> Result:
        """The :class:`Result`; ``seed_axis=False`` (a single ``seed=`` run) drops the axis."""
        if not seed_axis:
            state = drop_seed_axis(state)
        x, y = self.problem.models(*self.solver.output(state))
        diverged = self.diverged_seeds()
        return Result(
            x=x,
            y=y,
            history=pd.DataFrame(self.history.rows),
            state=state,
            diverged=diverged,
            message=self.message(diverged),
            solver=self.solver,
            problem_name=self.problem.name,
            seeds=self.history.seeds,
            steps=self.done,
        )

    def message(self, diverged: list) -> str:
        """How the run ended, in words."""
        name, problem, unit = self.solver.name, self.problem.name, self.schedule.unit
        steps = self.schedule.steps
        if self.diverged_at or diverged:
            # why each seed diverged, where the history kept it (divergence.REASONS)
            why = dict(zip(self.history.seeds, getattr(self.history, "reasons", ()), strict=False))
            seen = self.diverged_at or dict.fromkeys(diverged)
            detail = "; ".join(
                f"seed {s}"
                + ("" if k is None else f" by {unit} {k}")
                + (f": {why[s]}" if why.get(s) else "")
                for s, k in seen.items()
            )
            rules = (
                ""
                if all(why.get(s) for s in seen)
                else f" (a seed diverges on non-finite iterates or metrics, a headline metric "
                f"beyond {EXPLOSION_FACTOR:.0e} x its start, or iterates growing beyond "
                f"{EXPLOSION_FACTOR:.0e} x their start norm)"
            )
            return (
                f"{name} diverged on {problem} ({detail}){rules}. Kept the history and the "
                f"last finite iterates of those seeds; {self.solver.divergence_advice}."
            )
        if self.done < steps and self.out_of_time():
            return (
                f"stopped at {unit} {self.done} of {steps}: the time limit of "
                f"{self.schedule.time_limit:g} s of solver time was reached ({self.seconds:.3g} s)"
            )
        if self.done < steps and self.history.alive.any():
            saved = None if self.checkpointer is None else self.checkpointer.directory
            where = f"; checkpoint in {saved}" if saved is not None else ""
            return f"interrupted at {unit} {self.done} of {steps}{where}"
        return ("resumed; " if self.resumed else "") + f"completed {self.done} {unit}s"

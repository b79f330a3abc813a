"""The engine of ``bl.solve_online`` and its programs: a chunk of rounds, and the evaluation
of its trace.

Both programs are per-seed builders ``build(spec) -> fn(solver, problem, state)`` that
:func:`bilevel.drivers.programs.program` maps over the seeds and compiles (the
``step_program`` and ``record`` hooks of :class:`OnlineEngine`, ``bl.solve``'s
:class:`~bilevel.drivers.engine.Engine` with chunks of rounds and a history row per round).
The evaluation gives, for every round t, the metrics at the committed ``(x_t, y_t)`` and the
term ||G_X(x_t, grad F_t(x_t), gamma)||^2 of the bilevel local regret of Jia & Chen, "Fully
first-order algorithms for online non-convex bilevel optimization" (2026), eq. (2)
(:mod:`bilevel.analysis.regret`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bilevel.analysis import regret as _regret
from bilevel.analysis.metrics import loss_metrics
from bilevel.core.online_problem import OnlineProblem
from bilevel.core.oracles import Counts
from bilevel.core.tree import tree_allfinite
from bilevel.drivers.engine import ADAPT_EVERY, Chunk, Engine, Schedule
from bilevel.drivers.history import History
from bilevel.drivers.programs import (
    ONLINE_ROUNDS,
    ProgramSettings,
    ProgramSpec,
    float_leaves_finite,
)
from bilevel.drivers.progress import Progress
from bilevel.solvers.online.base import OnlineSolver

PyTree = Any

__all__ = [
    "EVAL_BATCH",
    "OnlineEngine",
    "RoundTrace",
    "RoundEvaluation",
    "rounds_program",
    "play_first_rounds",
]

#: rounds evaluated side by side (``lax.map``'s batch) after each chunk: the dense regret
#: oracle holds one Hessian per round of a batch
EVAL_BATCH = 16


class RoundTrace(NamedTuple):
    """What a chunk keeps of each round it played."""

    t: jax.Array  # the round
    x: PyTree  # x_t, committed before the round's update
    y: PyTree  # y_t
    counts: Counts  # the counts after the round
    solver_metrics: dict  # Solver.state_metrics after the round (its step's direction norm)


def rounds_program(spec: ProgramSpec) -> Callable:
    """The per-seed step program: ``spec.length`` rounds in one ``lax.scan``;
    ``(state, trace, finite)``."""

    def rounds(solver, problem, state):
        def body(s, _):
            x, y = solver.output(s)
            new = solver.round(problem, s)
            return new, RoundTrace(s.t, x, y, new.counts, solver.state_metrics(new))

        state, trace = jax.lax.scan(body, state, None, length=spec.length)
        return state, trace, float_leaves_finite(state)

    return rounds


@dataclasses.dataclass(frozen=True)
class RoundEvaluation:
    """The builder of the program evaluating a chunk's trace: per round the metrics, the
    regret term and the gamma it used, and whether the round is finite.

    Attributes:
        oracle: how grad F_t is obtained (``bilevel.analysis.regret``), ``None``: no regret.
        regret_step: the gamma of the gradient mapping (``None``: the solver's gamma_t).
        reference_steps: gradient steps of a reference solve's inner problem.
    """

    oracle: str | None
    regret_step: float | None
    reference_steps: int

    @property
    def kind(self) -> tuple:
        """Its compile-cache kind: everything static the program depends on."""
        return ("online-evaluation", self.oracle, self.regret_step, self.reference_steps)

    def __call__(self, spec: ProgramSpec) -> Callable:
        def evaluate(solver, problem, trace):
            def per_round(args):
                t, x, y = args
                return _round_evaluation(problem, solver, t, x, y, self)

            metrics, term, gamma = jax.lax.map(
                per_round, (trace.t, trace.x, trace.y), batch_size=EVAL_BATCH
            )
            metrics.update(trace.solver_metrics)
            iterates = jax.vmap(lambda x, y: tree_allfinite((x, y)))(trace.x, trace.y)
            values = jnp.stack([jnp.isfinite(v) for v in metrics.values()]).all(axis=0)
            return metrics, term, gamma, iterates & values

        return evaluate


def _round_evaluation(problem, solver, t, x, y, how: RoundEvaluation):
    """One round's metrics on its evaluation data, regret term
    ||G_X(x_t, grad F_t(x_t), gamma)||^2 (eq. (2) of Jia & Chen, 2026) and gamma."""
    f, g = problem.at_round(t)
    outer_data, inner_data = problem.evaluation_data(t)
    own = {} if problem.metrics is None else dict(problem.metrics(t, x, y))
    metrics = loss_metrics(f, g, x, y, outer_data, inner_data, skip=own)
    metrics.update({k: jnp.asarray(v) for k, v in own.items()})
    step = how.regret_step
    gamma = solver.outer_lr(t) if step is None else jnp.asarray(step)
    gamma = jnp.asarray(gamma, jnp.result_type(float))
    if how.oracle is None:
        return metrics, jnp.full((), jnp.nan, gamma.dtype), gamma
    grad = _regret.hypergradient(problem, how.oracle, t, x, y, how.reference_steps)
    return metrics, _regret.regret_term(problem.x_set, x, grad, gamma), gamma


class OnlineEngine(Engine):
    """``solve``'s engine with chunks of rounds and one history row per round (its hooks
    :meth:`step_program`, :meth:`record` and :meth:`start`; :mod:`bilevel.drivers.engine`).

    Args:
        problem, solver, schedule, history, display, settings: as :class:`Engine`'s.
        evaluation: the builder of the program evaluating a chunk's trace.
        adapt: as :class:`Engine`'s (``"auto"`` inner steps following the rounds,
            :class:`~bilevel.drivers.curvature.OnlineInnerCurvature`).
    """

    def __init__(
        self,
        problem: OnlineProblem,
        solver: OnlineSolver,
        schedule: Schedule,
        history: History,
        display: Progress,
        evaluation: RoundEvaluation,
        settings: ProgramSettings | None = None,
        adapt=None,
    ):
        super().__init__(
            problem, solver, schedule, history, display, settings=settings, adapt=adapt
        )
        self.evaluation = evaluation
        self.chunks: list[tuple] = []  # per chunk: (xs, ys, terms, regret, gamma)
        self.start_point = None  # (x_1, y_1) per seed: the traces' shape before any chunk
        self.regret_total = np.zeros(len(history.seeds))  # per seed, the cumulative regret

    def start(self, state) -> None:
        """Refuse a non-finite start (x_1, y_1) with the seeds it concerns."""
        x, y = jax.device_get(self.solver.output(state))
        self.start_point = (x, y)
        leaves = [np.asarray(a).reshape(a.shape[0], -1) for a in jax.tree.leaves((x, y))]
        finite = np.all([np.isfinite(a).all(axis=1) for a in leaves], axis=0)
        if not finite.all():
            bad = [s for s, ok in zip(self.history.seeds, finite, strict=True) if not ok]
            raise ValueError(
                f"the starting point (x_1, y_1) is not finite for seeds {bad} (NaN/inf); check "
                "x0, y0 and init."
            )

    def step_program(self, state, length: int):
        """The chunk of ``length`` rounds; ``(state, trace, finite)``."""
        return self.program(ONLINE_ROUNDS, state, length, rounds_program)

    def _run_pieces(self, state, length: int):
        """A chunk's ``(state, trace, finite)``: with ``adapt``, pieces of at most
        :data:`~bilevel.drivers.engine.ADAPT_EVERY` rounds, the solver adapted between them,
        their traces joined (rounds are the axis after the seeds)."""
        if self.adapt is None:
            return super()._run_pieces(state, length)
        traces, finite, done = [], True, 0
        while done < length:
            piece = min(ADAPT_EVERY, length - done)
            program = self.step_program(state, piece)
            state, trace, ok = jax.block_until_ready(program(self.problem, state))
            traces.append(trace)
            finite = finite & np.asarray(ok)
            done += piece
            if done < length:
                self.adapt_to(state)
        trace = jax.tree.map(lambda *a: jnp.concatenate(a, axis=1), *traces)
        return state, trace, finite

    def record(self, output, chunk: Chunk):
        """Evaluate the chunk's trace and give each of its rounds a row."""
        new_state, trace, end_finite = output
        how = self.evaluation
        evaluate = self.program(how.kind, trace, chunk.length, how)
        evaluated = jax.device_get(evaluate(self.problem, trace))
        self._rounds(jax.device_get(trace), *evaluated, chunk)
        return new_state, np.asarray(end_finite)

    def _rounds(self, trace, metrics, terms, gammas, finite, chunk: Chunk):
        """The rows of a chunk's rounds, the cumulative regret, and its iterates (NaN once a
        seed diverged)."""
        seeds, alive = self.history.seeds, self.history.alive
        kept = np.zeros((len(seeds), chunk.length), bool)
        regret = np.full((len(seeds), chunk.length), np.nan)
        for r in range(chunk.length):
            t = chunk.first + r + 1
            self.regret_total = np.where(alive, self.regret_total + terms[:, r], np.nan)
            row_metrics = {k: v[:, r] for k, v in metrics.items()}
            if self.evaluation.oracle is not None:
                row_metrics |= {"regret_term": terms[:, r], "regret": self.regret_total}
            counts = Counts(*(np.asarray(c)[:, r] for c in trace.counts))
            seconds = chunk.seconds + chunk.elapsed * (r + 1) / chunk.length
            ok = self.history.record(row_metrics, counts, finite[:, r], t, seconds)
            for i in np.flatnonzero(alive & ~ok):
                self.diverged_at[seeds[i]] = t
            alive &= ok
            kept[:, r] = alive
            regret[:, r] = np.where(alive, self.regret_total, np.nan)

        def mask(a):
            a = np.asarray(a, float)
            return np.where(kept.reshape(kept.shape + (1,) * (a.ndim - 2)), a, np.nan)

        xs, ys = jax.tree.map(mask, trace.x), jax.tree.map(mask, trace.y)
        self.chunks.append((xs, ys, np.where(kept, terms, np.nan), regret, gammas[0]))

    def traces(self) -> tuple:
        """``(xs, ys, regret terms, cumulative regret, gamma)`` of the rounds played, joined
        over the chunks (a leading seed axis; NaN after a seed diverged). With no round
        played (a stop during the first chunk), arrays of zero rounds."""
        if not self.chunks:
            seeds = len(self.history.seeds)
            empty = lambda a: np.zeros((seeds, 0, *np.shape(a)[1:]))  # noqa: E731
            xs, ys = (jax.tree.map(empty, part) for part in self.start_point)
            return xs, ys, np.zeros((seeds, 0)), np.zeros((seeds, 0)), np.zeros(0)

        def join(i):
            parts = [c[i] for c in self.chunks]
            return jax.tree.map(lambda *a: np.concatenate(a, axis=1), *parts)

        xs, ys, terms, regret = (join(i) for i in range(4))
        gamma = np.concatenate([c[4] for c in self.chunks])
        return xs, ys, terms, regret, gamma


def play_first_rounds(solver, problem, n: int, evaluation, seed: int, init, settings, key: str):
    """Play the first ``n`` rounds of ``problem`` with ``solver`` (one seed, no display): a
    trial of ``bl.solve_online``'s tuning. ``(per-round values of the history column key,
    counts at the last round, whether the seed played all n rounds soundly)``."""
    from bilevel.drivers.programs import init_states

    state = init_states(solver, problem, [seed], init)
    history = History([seed])
    display = Progress(False, n, solver.name, problem.name, 1, unit="round")
    schedule = Schedule(n, n, unit="round")
    engine = OnlineEngine(problem, solver, schedule, history, display, evaluation, settings)
    engine.start(state)
    _, stopped = engine.loop(state)
    if stopped is not None:
        raise KeyboardInterrupt(stopped)
    rows = history.rows
    values = np.array([r[key] for r in rows], float)
    counts = {
        k: int(rows[-1][k]) if rows else 0 for k in (*Counts._fields, "samples", "oracle_calls")
    }
    alive = bool(history.alive[0]) and len(rows) == n and bool(np.all(np.isfinite(values)))
    return values, counts, alive

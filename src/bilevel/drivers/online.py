"""``solve_online``: ``solve``'s engine for streams of rounds.

It is ``bl.solve``'s loop (:class:`bilevel.drivers.engine.Engine`): ``eval_every`` rounds run
inside one compiled ``lax.scan`` vmapped over seeds, from the same compile cache, with the same
seed handling, progress display, stop signals, history rows and counter totals, and the same
divergence stop that keeps what was done. :class:`OnlineEngine` changes only the engine's hooks:
its step program (:data:`bilevel.drivers.programs.ONLINE_ROUNDS`) returns every round's
committed ``(x_t, y_t)``, counts and the solver's own metrics, and its ``record`` hook gives
every round a history row, with the metrics and the regret term of the round (the bilevel local
regret of Jia & Chen, "Fully first-order algorithms for online non-convex bilevel
optimization", 2026, eq. (2); :mod:`bilevel.analysis.regret`) evaluated after the chunk by a
second program, outside the timed region and the oracle counts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import pandas as pd

from bilevel.analysis import regret as _regret
from bilevel.core.online_problem import OnlineProblem
from bilevel.core.oracles import Counts
from bilevel.core.problem import ProblemKindError
from bilevel.drivers.checks import check_convexity, check_on_divergence, check_seeds, check_steps
from bilevel.drivers.cpu_rewrites import CpuRewrites, resolve
from bilevel.drivers.engine import Chunk, Engine, Schedule
from bilevel.drivers.history import History
from bilevel.drivers.programs import ONLINE_ROUNDS, ProgramSettings, init_states
from bilevel.drivers.progress import Progress
from bilevel.drivers.results import Outcome, drop_seed_axis, finish
from bilevel.drivers.rounds import RoundEvaluation, rounds_program
from bilevel.solvers.base import Solver
from bilevel.solvers.online.base import OnlineSolver

PyTree = Any

__all__ = ["solve_online", "OnlineResult", "OnlineEngine"]


@dataclasses.dataclass
class OnlineResult(Outcome):
    """What ``solve_online`` returns (numpy arrays; with ``seeds=[...]`` a leading seed axis).

    Attributes:
        xs, ys: the decisions committed at each round, x_t and y_t (before round t's update),
            pytrees with a leading rounds axis (after the seed axis). Rounds after a seed
            diverged hold NaN.
        regret: the cumulative bilevel local regret (eq. (2)) per round,
            sum_{s<=t} ||G_X(x_s, grad F_s(x_s), gamma_s)||^2 (``None`` with ``regret=None``).
        regret_terms: its per-round terms ||G_X(...)||^2.
        regret_oracle: how grad F_t was obtained: "closed form", "dense inner solve" or
            "reference solve (N GD steps + M CG)" (``bilevel.analysis.regret``).
        regret_gamma: the gamma of G_X at each round (the solver's outer step gamma_t unless
            ``regret_step`` was given), shape (rounds,).
        history: one row per (seed, round): ``seed, round, samples, samples_outer,
            samples_inner, oracle_calls``, the calls by kind (cumulative), ``seconds``
            (cumulative solver time; a chunk's rounds share its time evenly, since they run
            in one compiled program), the metrics at the committed (x_t, y_t) on round t's
            data (``outer_loss``, ``inner_grad_norm``, the problem's own), the solver's
            (``hypergrad_estimate_norm`` of round t's step), ``regret_term`` and ``regret``.
        x, y: the state after the last round (x_{T+1}, y_{T+1}); for a diverged seed its last
            finite state.
        state: the final solver state.
        diverged: seeds that diverged (empty if none).
        message, solver, problem_name, seeds, rounds: what was run and how it ended.
    """

    xs: PyTree
    ys: PyTree
    regret: np.ndarray | None
    regret_terms: np.ndarray | None
    regret_oracle: str | None
    regret_gamma: np.ndarray
    rounds: int


# ---- the driver ---------------------------------------------------------------------------
def solve_online(
    problem: OnlineProblem,
    solver: OnlineSolver,
    *,
    seed: int = 0,
    seeds: Sequence[int] | None = None,
    eval_every: int | None = 100,
    progress: bool = True,
    on_divergence: str = "warn",
    regret: str | None = "auto",
    regret_step: float | None = None,
    reference_steps: int = 2000,
    init: Callable[[jax.Array], tuple[PyTree, PyTree]] | None = None,
    cpu_rewrites: CpuRewrites | bool | None = None,
) -> OnlineResult:
    """Play the stream ``problem`` with the online ``solver`` for its ``horizon`` rounds.

    Args:
        problem: a :class:`bilevel.OnlineProblem`.
        solver: an online solver from ``bl.solvers.make`` (``bl.solvers.names("online")``).
        seed: the PRNG seed of a single run.
        seeds: several seeds (e.g. ``range(5)``) run as one vmapped program; results get a
            leading seed axis.
        eval_every: rounds per compiled chunk (progress, divergence checks); ``None`` = one
            chunk. Capped at the horizon. Every round gets its history row either way.
        progress: show progress on stderr (rounds, rate, ETA).
        on_divergence: ``"warn"`` (a ``bl.DivergenceWarning``, results kept) or ``"raise"``
            (a ``bl.DivergenceError`` whose ``.result`` holds them).
        regret: the oracle of grad F_t in the regret: ``"auto"`` (the problem's
            ``reference.grad_F`` if any, else a dense inner solve when y has at most
            ``bilevel.analysis.regret.DENSE_MAX_DIM`` entries, else a reference solve),
            ``"closed form"``, ``"dense inner solve"``, ``"reference solve"``, or ``None`` (no
            regret: ``res.regret`` is ``None``).
        regret_step: the gamma of the gradient mapping G_X in the regret; default the solver's
            outer step gamma_t of each round (the paper's analyses use the step size). It only
            matters with an ``x_set`` (unconstrained, G_X = grad F_t).
        reference_steps: gradient steps of the reference solve's inner problem.
        init: optional ``init(key) -> (x0, y0)``: a random start per seed, as in ``bl.solve``.
        cpu_rewrites: the XLA:CPU rewrites of the compiled rounds, as in :func:`bilevel.solve`.

    Returns:
        An :class:`OnlineResult`.

    Raises:
        ProblemKindError: (a TypeError and a ValueError) when ``problem`` is not an
            ``OnlineProblem`` or ``solver`` is not an online solver, naming the fix.
        ValueError: bad arguments; a non-finite start.
        Interrupted: on Ctrl-C or SIGTERM; its ``.result`` holds the rounds done.
    """
    _check_arguments(problem, solver, on_divergence, regret_step)
    _, every = check_steps(problem.horizon, eval_every, caller="solve_online")
    seed_list = check_seeds(seed, seeds, caller="solve_online")
    settings = ProgramSettings(cpu_rewrites=resolve(cpu_rewrites))
    solver.check_problem(problem)
    solver = solver.with_horizon(problem.horizon).resolve(problem)
    oracle = None if regret is None else _regret.choose(problem, regret)
    check_convexity(problem.round_problem(1))

    state = init_states(solver, problem, seed_list, init)
    history = History(seed_list)
    display = Progress(
        progress, problem.horizon, solver.name, problem.name, len(seed_list), unit="round"
    )
    schedule = Schedule(problem.horizon, every, unit="round")
    evaluation = RoundEvaluation(oracle, regret_step, reference_steps)
    engine = OnlineEngine(problem, solver, schedule, history, display, evaluation, settings)
    engine.start(state)
    try:
        state, stopped = engine.loop(state)
    finally:
        display.close()
    result = engine.result(state, seed_axis=seeds is not None)
    return finish(result, stopped, None, on_divergence)


def _check_arguments(problem, solver, on_divergence, regret_step) -> None:
    if not isinstance(problem, OnlineProblem):
        raise ProblemKindError(
            f"solve_online(problem=...) needs a bl.OnlineProblem (a stream of rounds), got "
            f"{type(problem).__name__}; an offline problem runs with bl.solve(problem, solver, "
            "steps)."
        )
    if not isinstance(solver, OnlineSolver):
        if isinstance(solver, Solver):
            raise ProblemKindError(
                f"solve_online(solver=...) needs an online solver, but {solver.name!r} is an "
                f"offline solver; use one of {', '.join(_online_names())} (e.g. "
                "bl.solvers.make('f2obo', lr_outer=..., lr_inner=...)), or run it on one round "
                "with bl.solve(problem.round_problem(t), solver, steps)."
            )
        raise TypeError(
            f"solve_online(solver=...) needs an online solver from bl.solvers.make(...), got "
            f"{type(solver).__name__}."
        )
    check_on_divergence(on_divergence)
    if regret_step is not None and not (
        isinstance(regret_step, int | float)
        and not isinstance(regret_step, bool)
        and 0 < regret_step < float("inf")
    ):
        raise ValueError(
            f"solve_online(regret_step={regret_step!r}) must be a positive float (or None: the "
            "solver's outer step)."
        )


def _online_names() -> list[str]:
    from bilevel.solvers import names

    return names("online")


class OnlineEngine(Engine):
    """``solve``'s engine with chunks of rounds and one history row per round (its hooks
    :meth:`step_program`, :meth:`record` and :meth:`start`; :mod:`bilevel.drivers.engine`).

    Args:
        problem, solver, schedule, history, display, settings: as :class:`Engine`'s.
        evaluation: the builder of the program evaluating a chunk's trace.
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
    ):
        super().__init__(problem, solver, schedule, history, display, settings=settings)
        self.evaluation = evaluation
        self.chunks: list[tuple] = []  # per chunk: (xs, ys, terms, regret, gamma)
        self.regret_total = np.zeros(len(history.seeds))  # per seed, the cumulative regret

    def start(self, state) -> None:
        """Refuse a non-finite start (x_1, y_1) with the seeds it concerns."""
        x, y = jax.device_get(self.solver.output(state))
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

    def result(self, state, seed_axis: bool) -> OnlineResult:
        """The :class:`OnlineResult`; ``seed_axis=False`` (one ``seed=``) drops the axis."""

        def join(i):
            parts = [c[i] for c in self.chunks]
            return jax.tree.map(lambda *a: np.concatenate(a, axis=1), *parts)

        xs, ys, terms, regret = (join(i) for i in range(4))
        gamma = np.concatenate([c[4] for c in self.chunks]) if self.chunks else np.zeros(0)
        x, y = jax.device_get(self.solver.output(state))
        if not seed_axis:
            xs, ys, terms, regret, x, y, state = drop_seed_axis(
                (xs, ys, terms, regret, x, y, state)
            )
        (x, y), (xs, ys) = self.problem.models(x, y), self.problem.models(xs, ys)
        history = pd.DataFrame(self.history.rows).rename(columns={"step": "round"})
        diverged = self.diverged_seeds()
        oracle, steps = self.evaluation.oracle, self.evaluation.reference_steps
        return OnlineResult(
            xs=xs,
            ys=ys,
            regret=None if oracle is None else regret,
            regret_terms=None if oracle is None else terms,
            regret_oracle=None if oracle is None else _regret.describe(oracle, steps),
            regret_gamma=gamma,
            history=history,
            x=x,
            y=y,
            state=state,
            diverged=diverged,
            message=self.message(diverged),
            solver=self.solver,
            problem_name=self.problem.name,
            seeds=self.history.seeds,
            rounds=self.done,
        )

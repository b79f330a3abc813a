"""``solve_online``: ``solve``'s engine for streams of rounds, and the choice of
``lr_outer="auto"`` by a short run on the first rounds.

It is ``bl.solve``'s loop (:class:`bilevel.drivers.engine.Engine`): ``eval_every`` rounds run
inside one compiled ``lax.scan`` vmapped over seeds, from the same compile cache, with the same
seed handling, progress display, stop signals, history rows and counter totals, and the same
divergence stop that keeps what was done. :class:`~bilevel.drivers.rounds.OnlineEngine` changes
only the engine's hooks: its step program (:data:`bilevel.drivers.programs.ONLINE_ROUNDS`)
returns every round's committed ``(x_t, y_t)``, counts and the solver's own metrics, and its
``record`` hook gives every round a history row, with the metrics and the regret term of the
round (the bilevel local regret of Jia & Chen, "Fully first-order algorithms for online
non-convex bilevel optimization", 2026, eq. (2); :mod:`bilevel.analysis.regret`) evaluated
after the chunk by a second program, outside the timed region and the oracle counts.

**The outer step.** Every online solver's ``lr_outer`` defaults to ``"auto"``. The solver's
other settings are resolved first (``resolve_settings``: ``lr_inner="auto"`` and the horizon
rules of each method's theorem), then :func:`tune_outer_step` chooses the step:

1. **Bound**: the largest step at which the method's round map, linearised at (x0, y0) on the
   first and the last round, is stable (``OnlineSolver.stable_outer_step``,
   :mod:`bilevel.solvers.online.auto`: 2 / L_F for an exact gradient step, less with a window
   of stored estimates or lagging inner iterates).
2. **Candidates**: the bound times 2^-1, ..., 2^-8 (:data:`GRID_FRACTIONS`; for a state too
   large for the Jacobian, 2^1, ..., 2^-6 times the step scale 1 / rho(dJ/dgamma)), each run
   on the first :func:`tuning_rounds` rounds of the stream (a tenth of the horizon, at least 10
   and at most 100) from the run's start and first seed, one compiled program for all of them.
3. **Score**: the regret of those rounds (the run's regret oracle), or the sum of their outer
   losses when the run has ``regret=None``; a candidate that diverged is dropped.
4. **Choice**: the best score among the candidates whose next larger one was kept too (a step at
   the edge of stability may diverge later), or the next larger within 1.5x of the best score
   (``bilevel.drivers.tuning.near_best``, as ``bl.solve``'s tuning does).
5. **The whole horizon**: where :mod:`bilevel.solvers.online.settling` predicts the regret, a
   choice predicted above 0.095 of standing still's (``settling.TARGET``: a tenth less 5% for
   the prediction's error), or 1.5x the lowest, gives way to the one
   predicted lowest (``OnlineTuning.predicted``): the first rounds can favour too small a step.
   Where none is predicted to reach it (on 100 rounds or more), "auto" is refused, naming
   what else to change (``check_step=False`` warns and plays it).

The record is a :class:`OnlineTuning` in ``res.tuning`` (the grid, scores, choice, the rounds,
samples, oracle calls and seconds spent); the tuning's samples and oracle calls are added to
every row of ``res.history`` (no free work: ``samples`` at round t is the tuning's plus the
run's first t rounds). The choice is deterministic for a seed. A number given as ``lr_outer``
is checked instead (``check_step=True``: ``OnlineSolver.check_outer_step``, ``check_settling``).

**The inner steps.** ``lr_inner="auto"`` (and the steps derived from it), resolved at round 1,
is rescaled every :data:`~bilevel.drivers.engine.ADAPT_EVERY` rounds by ``min(1, L_g(round 1) /
L_g(round t))`` (:class:`bilevel.drivers.curvature.OnlineInnerCurvature`, ``bl.solve``'s rule).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import pandas as pd

from bilevel.analysis import regret as _regret
from bilevel.core.online_problem import OnlineProblem
from bilevel.core.oracles import Counts
from bilevel.drivers.checks import (
    check_convexity,
    check_online_arguments,
    check_seeds,
    check_steps,
)
from bilevel.drivers.cpu_rewrites import CpuRewrites, resolve
from bilevel.drivers.curvature import OnlineInnerCurvature, followed_fields
from bilevel.drivers.engine import Schedule
from bilevel.drivers.history import History
from bilevel.drivers.loggers import check_log_to, logged
from bilevel.drivers.programs import ProgramSettings, init_states
from bilevel.drivers.progress import Progress
from bilevel.drivers.results import Outcome, drop_seed_axis, finish
from bilevel.drivers.rounds import OnlineEngine, RoundEvaluation, play_first_rounds
from bilevel.drivers.tuning import Tuning, near_best
from bilevel.solvers.online.base import OnlineSolver
from bilevel.solvers.online.settling import predicted_choice

PyTree = Any

__all__ = ["solve_online", "OnlineResult", "OnlineEngine", "OnlineTuning", "tune_outer_step"]
__all__ += ["tuning_rounds", "GRID_FRACTIONS"]

#: the candidates: these fractions of the stable bound (module docstring)
GRID_FRACTIONS = tuple(2.0**-k for k in range(1, 9))


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
            samples_inner, oracle_calls``, the calls by kind (cumulative, the tuning's
            included when ``lr_outer`` was tuned), ``seconds`` (cumulative solver time of the
            run; a chunk's rounds share its time evenly, since they run in one compiled
            program), the metrics at the committed (x_t, y_t) on round t's data
            (``outer_loss``, ``inner_grad_norm``, the problem's own), the solver's
            (``hypergrad_estimate_norm`` of round t's step), ``regret_term`` and ``regret``.
        x, y: the state after the last round (x_{T+1}, y_{T+1}); for a diverged seed its last
            finite state.
        state: the final solver state.
        diverged: seeds that diverged (empty if none).
        message, solver, problem_name, seeds, rounds: what was run and how it ended
            (``solver`` with every setting resolved, ``lr_outer`` the one used).
        tuning: an :class:`OnlineTuning` when ``lr_outer`` was ``"auto"`` (what was tried and
            what it cost), ``None`` when it was given.
    """

    xs: PyTree
    ys: PyTree
    regret: np.ndarray | None
    regret_terms: np.ndarray | None
    regret_oracle: str | None
    regret_gamma: np.ndarray
    rounds: int
    tuning: Any = None


@dataclasses.dataclass(frozen=True)
class OnlineTuning(Tuning):
    """How ``bl.solve_online`` chose ``lr_outer="auto"`` (module docstring): ``bl.solve``'s
    :class:`~bilevel.drivers.tuning.Tuning` (``value`` the choice, ``grid``, ``scores``,
    ``dropped``, ``score`` = ``"regret"`` or ``"outer_loss"``, ``start_score`` = n times round
    1's term, the score of standing still at x0 were the stream not drifting, ``steps`` = n,
    the tuning rounds each candidate played, ``samples``, ``oracle_calls``, ``counts`` summed
    over the candidates, ``seconds`` of wall time with the compilation), and:

    Attributes:
        seed: the seed the candidates ran with.
        bound: the stable bound of ``lr_outer`` (``None`` when not computed).
        scale: the step scale 1 / rho(dJ/dgamma) (1 / L_F for an exact gradient step).
        how: how the bound was obtained, in words.
        predicted: each candidate's predicted regret over the whole horizon against standing
            still's (point 5; ``()`` where none is made, ``inf`` for a dropped candidate).
    """

    seed: int = 0
    bound: float | None = None
    scale: float = math.nan
    how: str = ""
    predicted: tuple[float, ...] = ()


def tuning_rounds(horizon: int) -> int:
    """The rounds each candidate plays: a tenth of the horizon, at least 10 (or the horizon)
    and at most 100."""
    return int(min(horizon, max(10, min(100, math.ceil(horizon / 10)))))


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
    check_step: bool = True,
    log_to: str | os.PathLike | None = None,
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
        check_step: refuse a numeric ``lr_outer`` above the solver's stable bound
            (``OnlineSolver.check_outer_step``), or, with a regret, one predicted to leave it
            above 0.095 of standing still (``OnlineSolver.check_settling``: naming the steps
            that reach it, or what else to change where none does), and ``"auto"`` where no
            candidate is predicted to reach it (module docstring, point 5); ``False`` plays it
            anyway (to study a divergence or a slow step).
        log_to: a TensorBoard directory, as in :func:`bilevel.solve` (the round is the step).

    Returns:
        An :class:`OnlineResult` (``res.tuning`` says how ``lr_outer="auto"`` was chosen).

    Raises:
        ProblemKindError: (a TypeError and a ValueError) when ``problem`` is not an
            ``OnlineProblem`` or ``solver`` is not an online solver, naming the fix.
        ValueError: bad arguments; a non-finite start; a step refused by ``check_step``;
            ``lr_outer="auto"`` when every candidate diverged.
        Interrupted: on Ctrl-C or SIGTERM; its ``.result`` holds the rounds done.
    """
    check_online_arguments(problem, solver, on_divergence, regret_step)
    _, every = check_steps(problem.horizon, eval_every, caller="solve_online")
    seed_list = check_seeds(seed, seeds, caller="solve_online")
    log_dir = check_log_to(log_to, caller="solve_online")
    settings = ProgramSettings(cpu_rewrites=resolve(cpu_rewrites))
    solver.check_problem(problem)
    solver = solver.with_horizon(problem.horizon)
    oracle = None if regret is None else _regret.choose(problem, regret)
    check_convexity(problem.round_problem(1))
    evaluation = RoundEvaluation(oracle, regret_step, reference_steps)
    tuning = None
    if isinstance(solver.lr_outer, str) and solver.lr_outer == "auto":
        tuning = tune_outer_step(
            problem, solver, evaluation, seed_list[0], init, settings, check_step=check_step
        )
        solver = dataclasses.replace(solver, lr_outer=tuning.value)
    template, solver = solver, solver.resolve(problem)
    if check_step and tuning is None:
        solver.check_outer_step(problem)
        if oracle is not None:
            solver.check_settling(problem, oracle)

    state = init_states(solver, problem, seed_list, init)
    followed = followed_fields(template, solver)  # "auto" inner steps follow the rounds
    adapt = OnlineInnerCurvature(solver, followed, problem, state) if followed else None
    history = History(seed_list, offset=None if tuning is None else tuning.counts)
    display = Progress(
        progress, problem.horizon, solver.name, problem.name, len(seed_list), unit="round"
    )
    if tuning is not None:
        display.note(tuning.summary())
    run = {"problem": problem.name, "rounds": problem.horizon, "eval_every": every}
    display = logged(display, log_dir, solver, run | {"seeds": len(seed_list)}, history)
    schedule = Schedule(problem.horizon, every, unit="round")
    engine = OnlineEngine(
        problem, solver, schedule, history, display, evaluation, settings, adapt=adapt
    )
    engine.start(state)
    try:
        state, stopped = engine.loop(state)
    finally:
        display.close()
    result = _result(engine, state, seeds is not None, tuning)
    return finish(result, stopped, None, on_divergence)


def _result(engine: OnlineEngine, state, seed_axis: bool, tuning) -> OnlineResult:
    """The :class:`OnlineResult`; ``seed_axis=False`` (one ``seed=``) drops the axis."""
    xs, ys, terms, regret, gamma = engine.traces()
    x, y = jax.device_get(engine.solver.output(state))
    if not seed_axis:
        xs, ys, terms, regret, x, y, state = drop_seed_axis((xs, ys, terms, regret, x, y, state))
    problem = engine.problem
    (x, y), (xs, ys) = problem.models(x, y), problem.models(xs, ys)
    history = pd.DataFrame(engine.history.rows).rename(columns={"step": "round"})
    diverged = engine.diverged_seeds()
    oracle, steps = engine.evaluation.oracle, engine.evaluation.reference_steps
    message = engine.message(diverged)
    if tuning is not None and diverged:
        smaller = [v for v in tuning.grid if v < tuning.value]
        message += (
            f" lr_outer={tuning.value:.3g} was chosen by a {tuning.steps}-round tuning run; "
            f"give lr_outer={smaller[-1] if smaller else tuning.value / 2:.3g} (the next "
            "smaller candidate) instead."
        )
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
        message=message,
        solver=engine.solver,
        problem_name=problem.name,
        seeds=engine.history.seeds,
        rounds=engine.done,
        tuning=tuning,
    )


# ---- lr_outer="auto" -------------------------------------------------------------------------
def tune_outer_step(
    problem: OnlineProblem,
    solver: OnlineSolver,
    evaluation: RoundEvaluation,
    seed: int = 0,
    init: Callable | None = None,
    settings: ProgramSettings | None = None,
    check_step: bool = True,
) -> OnlineTuning:
    """Choose ``lr_outer`` for ``solver`` on the first rounds of ``problem`` (module docstring).

    Args:
        problem: the stream.
        solver: an online solver (its horizon set); ``lr_outer`` is replaced by each candidate
            and its other settings resolved by ``resolve_settings``.
        evaluation: the regret's oracle and gamma (:class:`RoundEvaluation`; its oracle
            ``None``: the score is the outer loss).
        seed, init: the start of every candidate (the run's first seed and its ``init``).
        settings: the programs' settings (the run's CPU rewrites).
        check_step: refuse a horizon on which no candidate is predicted to settle (point 5);
            ``False`` warns and plays the choice.

    Raises:
        ValueError: when every candidate diverged (naming what to give instead), or none is
            predicted to settle (``check_step``; naming what else to change).
    """
    t0 = time.perf_counter()
    base = solver.resolve_settings(problem)
    bound = base.stable_outer_step(problem)
    if bound.bound is not None:
        grid = tuple(sorted(bound.bound * f for f in GRID_FRACTIONS))
    else:
        grid = tuple(sorted(bound.scale * 4.0 * f for f in GRID_FRACTIONS))
    n, key = tuning_rounds(problem.horizon), "regret_term" if evaluation.oracle else "outer_loss"
    play = (problem, n, evaluation, seed, init, settings, key)
    runs = [  # (values of the score's column per round, counts, whether it played soundly)
        play_first_rounds(dataclasses.replace(base, lr_outer=lr), *play) for lr in grid
    ]
    scores = [float(np.sum(values)) if alive else math.inf for values, _, alive in runs]
    dropped = tuple("" if math.isfinite(s) else "diverged" for s in scores)
    counts = {k: sum(r[1][k] for r in runs) for k in (*Counts._fields, "samples", "oracle_calls")}
    kept = [i for i, d in enumerate(dropped) if not d]
    if not kept:
        raise ValueError(
            f"{solver.name}: lr_outer='auto' found no stable step: every candidate from "
            f"{grid[0]:.3g} to {grid[-1]:.3g} diverged within the first {n} rounds. Lower the "
            f"inner steps (lr_inner={getattr(base, 'lr_inner', None)!r}) or give lr_outer as a "
            "number."
        )
    best, predicted = _choice(scores, dropped), ()
    if evaluation.oracle is not None:  # point 5: the whole horizon, where it can be predicted
        chosen = dataclasses.replace(base, lr_outer=grid[best])
        best, predicted = predicted_choice(
            chosen, problem, evaluation.oracle, grid, kept, best, refuse=check_step
        )
    return OnlineTuning(
        field="lr_outer",
        value=grid[best],
        grid=grid,
        scores=tuple(s if math.isfinite(s) else math.inf for s in scores),
        dropped=dropped,
        score="regret" if evaluation.oracle is not None else "outer_loss",
        start_score=n * float(runs[0][0][0]) if len(runs[0][0]) else math.nan,
        steps=n,
        samples=counts.pop("samples"),
        oracle_calls=counts.pop("oracle_calls"),
        counts=counts,
        seconds=time.perf_counter() - t0,
        largest_stable=grid[max(kept)],
        seed=seed,
        bound=bound.bound,
        scale=bound.scale,
        how=bound.describe(),
        predicted=predicted,
    )


def _choice(scores: list[float], dropped: tuple[str, ...]) -> int:
    """The choice among the kept candidates whose next larger one was kept too, by
    ``near_best`` (module docstring, point 4)."""
    kept = [i for i, d in enumerate(dropped) if not d]
    safe = [i for i in kept if i + 1 == len(scores) or not dropped[i + 1]] or kept
    return near_best(scores, safe)

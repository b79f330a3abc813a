"""``tune``: the outer step size of a solver, chosen by a short run on the user's own problem.

A solver built with ``lr_outer="auto"`` (the default of every offline solver whose outer step is
a plain step size) gets its step here, inside :func:`bilevel.solve`, or on its own from
:func:`tune`. The rule, in order:

1. **Candidates**: a log-spaced grid, ``10^-3 ... 10^2`` in steps of ``10^0.5`` (11 values;
   :data:`GRID`), all run as one :func:`bilevel.sweep` program (one compilation, the candidates
   side by side) from the run's own start, seed and horizon, for a short share of the run:
   ``steps // 20`` steps, at least 50 and at most 200 (:func:`tuning_steps`); on three seeds
   (the run's and the next two) when the problem draws minibatches, since the noise decides
   stability too, on the run's seed otherwise.
2. **Score**: what the problem lets us compute, at the last two of four evaluations (their mean,
   so one noisy minibatch iterate does not decide): the exact hypergradient norm
   ``||grad F(x)||`` where :mod:`bilevel.analysis.metrics` can compute it (``y`` of at most
   ``tuning_runs.EXACT_MAX_DIM`` = 300 entries, no model variables: dense Newton on the
   inner problem, as the reference of every test); a problem's own ``grad_norm`` metric
   when it has one; the Frank-Wolfe gap or gradient mapping of a constrained problem;
   otherwise the outer loss ``outer_loss`` (the problem's own, e.g. on held-out data, or f on
   the full outer data).
3. **Stability**: a candidate that diverged (non-finite values, a metric or the iterates beyond
   ``1e12`` times their start) is dropped, and so is one that did not improve on the start
   (F = f(x, y*(x)) where known, else its score, ended above its start: from a flat start
   ``||grad F||`` rises as F falls), unless none improved; where F is known, one whose final
   F is behind the best one's by more than ``tuning_runs.BEHIND`` = 10% of the best decrease
   ``F(x0) - min F`` (a run into a region where the gradient vanishes: small ``||grad F||``,
   no better point). When every candidate is dropped the grid is
   extended once downwards (``10^-8.5 ... 10^-3.5``); when the largest is the best, once upwards.
   An extension is judged together with the first grid (``tuning_runs.merge``): measured on a
   digits 3-vs-8 logistic regression with one log-penalty, every candidate above 100 ran x to
   -37 ... -118, where exp(x) vanishes, ``||grad F||`` to 7e-150 and F above its start; judged
   on its own, the extension kept them for lack of a better candidate among themselves.
4. **Choice**: the best-scoring candidate among the *safe* ones, those whose next larger
   candidate ran stably (kept, or dropped only as "F behind"; a step below one that diverged
   or made no progress is at the edge of stability and can diverge later in the run), or the
   next larger safe one when it scores within :data:`NEAR` (1.5x) of the best. With none safe,
   the best kept candidate (the ones below it were dropped as slower: F2SA on a minibatch
   ridge ends at 0.10 with it, at 0.24 with the one below), point 5's retry as its guard.
   (PZOBO on the wine cleaning / 32: 100 beside a 316 "F behind" ends at 0.052, the 31.6 that
   treating 316 as an edge gave at 0.113.) Inner steps: :mod:`bilevel.drivers.curvature`.
5. **Retries**: when the run itself diverges with the chosen step (a short run cannot see
   everything: with minibatches, stability depends on the draws), or *drifts* (:func:`drifted`:
   its gradient-type score ends above what the tuning run of the same step reached, e.g. a
   single-loop method whose inner iterate falls behind as the inner problem grows
   ill-conditioned along the path, or above twice its own lowest on the way;
   :mod:`bilevel.drivers.retries`), ``bl.solve`` runs again with the next smaller candidate
   that did not diverge in the tuning run, at most twice (:attr:`Tuning.retries`,
   :attr:`Tuning.retry_reasons`; not with a checkpoint, whose run would change under it).
   The earlier runs' samples and oracle calls are counted too. (Halving the step instead was
   measured worse: off the grid there is no tuning score to judge a drift by.) Of the full
   runs that did not diverge, the one whose gradient-type score ended lowest is returned
   (:attr:`Tuning.finals`; the latest on a tie): a drifted run may end below its successor
   (TTSA on a full-batch logistic regression: 3.16 drifted to 0.070 of its start's
   ``||grad F||``, its tuning run had reached 0.008; the retry's 1 ended at 0.104).

6. **The second half, with minibatches**: a constant step leaves the last iterate of a
   stochastic method at a noise floor that grows with the step, and the tuning picks the step
   of the most progress, so on a run that draws minibatches the chosen step is divided by
   :data:`TAIL_FACTOR` = 10 from the run's middle on (:data:`TAIL_START`; a
   :class:`bilevel.core.schedules.TailDecay`, :attr:`Tuning.tail`), unless the method's own
   schedule already decays it (``solver.outer_step_decays(problem)``: F2SA, F3SA, the
   ``"strongly-convex"`` regimes). Measured on the 42 minibatch runs of
   ``benchmarks/defaults.py`` (3000 steps): 4 more reach a tenth of their start's
   ``||grad F||`` (stocBiO and TTSA on a logistic regression, HOZOG and PZOBO on a ridge
   problem: 0.09-0.12 -> 0.05-0.09), none that reached it before misses it; STABLE on
   hyper-cleaning, progress-bound rather than noise-bound, ends higher (0.11 -> 0.15).

Everything is recorded in a :class:`Tuning` (``res.tuning`` of ``bl.solve``): the grid, the
scores, why each dropped candidate was dropped, the choice, the tail decay, the steps, samples,
oracle calls and seconds it took. The tuning's samples and oracle calls are added to every row
of the run's history (no free work), and the run itself starts afresh from ``(x0, y0)`` with
the chosen step, so ``bl.solve(problem, make(name, lr_outer=res.tuning.step), ...)`` retraces
its iterates (``tuning.step`` is ``tuning.value``, with its tail decay where there is one).
The choice is deterministic for a given seed.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from bilevel.core.oracles import Counts
from bilevel.core.problem import BilevelProblem
from bilevel.core.schedules import TailDecay
from bilevel.drivers import tuning_runs
from bilevel.drivers.retries import drifted
from bilevel.drivers.tuning_runs import Trial, final_score, merge, scoring_problem, trial
from bilevel.solvers.base import Solver

__all__ = [
    "Tuning",
    "TuningError",
    "tune",
    "tuning_steps",
    "needs_tuning",
    "drifted",
    "final_score",
    "GRID",
    "NEAR",
    "near_best",
    "TAIL_START",
    "TAIL_FACTOR",
]

#: the candidate outer steps: 10^-3 ... 10^2 in steps of 10^0.5 (mean losses have small
#: gradients: steps up to 100 are common on them)
GRID = tuple(float(10.0**e) for e in np.arange(-3.0, 2.01, 0.5))
#: tried when every candidate of GRID was dropped (the same size: the same compiled program)
GRID_BELOW = tuple(float(10.0**e) for e in np.arange(-8.5, -3.49, 0.5))
#: tried when GRID's largest candidate scored best
GRID_ABOVE = tuple(float(10.0**e) for e in np.arange(2.5, 7.51, 0.5))
#: the next larger candidate is chosen when its score is within this factor of the best
NEAR = 1.5
#: with minibatches the tuned step is multiplied by TAIL_FACTOR from TAIL_START * steps on
#: (point 6 of the module docstring)
TAIL_START, TAIL_FACTOR = 0.5, 0.1


class TuningError(ValueError):
    """Every candidate step diverged or made no progress; the message names what to change."""


@dataclasses.dataclass(frozen=True)
class Tuning:
    """What the automatic step-size choice did (``res.tuning`` of :func:`bilevel.solve`).

    Attributes:
        field: the tuned hyperparameter (``"lr_outer"``).
        value: the chosen value.
        grid: the candidates tried, in increasing order.
        scores: each candidate's score (lower is better; ``inf`` when dropped).
        dropped: why each candidate was dropped (``""`` when kept).
        score: what the score is: ``"grad_norm"`` (exact ||grad F(x)||), ``"fw_gap"``,
            ``"grad_mapping"`` or ``"outer_loss"``.
        start_score: the score at the start (x0, y0), the same for every candidate.
        steps: steps each candidate ran.
        samples, oracle_calls: what the whole tuning run drew and called, summed over the
            candidates (added to every row of the run's history).
        counts: the same per counter (``bilevel.core.oracles.Counts`` fields).
        seconds: wall-clock seconds of the tuning (compilation included).
        largest_stable: the largest candidate that was not dropped.
        retries: the values whose full run diverged or drifted (``bl.solve`` then runs again
            with the next smaller candidate, at most twice, and ``value`` is the one it ended
            with; the earlier runs' samples and oracle calls are in the counts).
        retry_reasons: why each of ``retries`` was run again: ``"diverged"`` or
            ``"drifted"`` (:func:`drifted`).
        finals: after retries, each full run's final score (``retries``, then the last run;
            ``nan`` where it diverged or has no gradient-type score); the lowest run is
            returned, so ``value`` may be one of ``retries`` (module docstring, point 5).
        tail: ``(start, factor)`` when the run multiplies ``value`` by ``factor`` from
            iteration ``start`` on (a run with minibatches of a method whose outer step is
            constant: module docstring, point 6), else ``None``.
    """

    field: str
    value: float
    grid: tuple[float, ...]
    scores: tuple[float, ...]
    dropped: tuple[str, ...]
    score: str
    start_score: float
    steps: int
    samples: int
    oracle_calls: int
    counts: dict[str, int]
    seconds: float
    largest_stable: float
    retries: tuple[float, ...] = ()
    retry_reasons: tuple[str, ...] = ()
    tail: tuple[float, float] | None = None
    finals: tuple[float, ...] = ()

    @property
    def step(self) -> float | TailDecay:
        """The ``lr_outer`` the run uses: ``value``, or its :class:`TailDecay` by ``tail``."""
        return self.value if self.tail is None else TailDecay(self.value, *self.tail)

    def retried(self, value: float, spent: dict[str, int], reason: str = "diverged") -> Tuning:
        """This tuning after the full run with ``self.value`` diverged or drifted (``reason``):
        ``value`` is used instead, the failed run's value is added to ``retries`` and ``spent``
        (its counter totals, :class:`bilevel.core.oracles.Counts` fields, tuning included)
        become the counts."""
        calls = sum(v for k, v in spent.items() if not k.startswith("samples"))
        return dataclasses.replace(
            self,
            value=value,
            retries=(*self.retries, self.value),
            retry_reasons=(*self.retry_reasons, reason),
            samples=spent["samples_outer"] + spent["samples_inner"],
            oracle_calls=calls,
            counts=dict(spent),
        )

    def kept(self, value: float, finals: Sequence[float]) -> Tuning:
        """This tuning once its runs are over: ``value`` is the step of the run returned and
        ``finals`` every full run's final score (:attr:`finals`)."""
        return dataclasses.replace(self, value=value, finals=tuple(float(f) for f in finals))

    @property
    def chosen(self) -> float:
        """The candidate the tuning run chose (``value`` unless a retry replaced it)."""
        return self.retries[0] if self.retries else self.value

    def table(self) -> pd.DataFrame:
        """One row per candidate: the value, its score, why it was dropped, whether the tuning
        chose it (a retry may have replaced it by a smaller one: ``value``)."""
        return pd.DataFrame(
            {
                self.field: self.grid,
                self.score: self.scores,
                "dropped": self.dropped,
                "chosen": [v == self.chosen for v in self.grid],
            }
        )

    def summary(self) -> str:
        """One line for the progress display and messages."""
        kept = sum(not d for d in self.dropped)
        index = self.grid.index(self.chosen)
        best = self.scores[index]
        # the step below an edge-of-stability candidate may itself be dropped ("no progress"):
        # it has no score to show, only why
        reached = f"{best:.3g}" if math.isfinite(best) else f"no score ({self.dropped[index]})"
        return (
            f"tuned {self.field} = {self.chosen:.3g} ({kept} of {len(self.grid)} candidates "
            f"{self.grid[0]:.0e}..{self.grid[-1]:.0e} stable; {self.score} {self.start_score:.3g}"
            f" -> {reached} in {self.steps} steps; {self.samples:,} samples, "
            f"{self.seconds:.1f} s)"
            + "".join(
                f"; {v:.3g} {why} in the run"
                for v, why in zip(self.retries, self.retry_reasons, strict=True)
            )
            + (self._returned() if self.retries else "")
            + (
                f"; x{self.tail[1]:g} from step {self.tail[0]:g} (minibatches)"
                if self.tail is not None
                else ""
            )
        )

    def _returned(self) -> str:
        """The summary's words on which run was returned, after retries."""
        if self.value not in self.retries:  # the last run
            return f"; ran with {self.value:.3g}"
        final, runs = self.finals[self.retries.index(self.value)], len(self.finals)
        return (
            f"; returned the run with {self.value:.3g} ({self.score} {final:.3g}, the lowest "
            f"of the {runs} runs)"
        )


def tail_decay(problem: BilevelProblem, solver: Solver, steps: int) -> tuple[float, float] | None:
    """``Tuning.tail`` of a run of ``steps`` (module docstring, point 6)."""
    if not solver.draws_minibatches(problem) or solver.outer_step_decays(problem):
        return None
    return float(math.floor(TAIL_START * steps)), TAIL_FACTOR


def needs_tuning(solver: Solver) -> bool:
    """Whether ``solver``'s outer step is ``"auto"`` and chosen here (not by its own rule)."""
    return "lr_outer" in solver.untuned()


def tuning_steps(steps: int) -> int:
    """The steps of the tuning run for a run of ``steps``: a twentieth, in [50, 200], at most
    ``steps``."""
    return int(min(steps, max(50, min(200, steps // 20))))


def tune(
    problem: BilevelProblem,
    solver: Solver | str,
    steps: int = 3000,
    *,
    seed: int = 0,
    grid: Sequence[float] | None = None,
    init=None,
    cpu_rewrites=None,
    **hyperparameters: Any,
) -> Tuning:
    """Choose ``lr_outer`` for ``solver`` on ``problem`` by a short run (module docstring).

    Args:
        problem: a :class:`bilevel.BilevelProblem`.
        solver: a solver, or a name built with ``bl.solvers.make(name, **hyperparameters)``;
            its ``lr_outer`` is replaced by each candidate (other settings are kept).
        steps: the length of the run the step is for: it sets the tuning's length
            (:func:`tuning_steps`) and the horizon of horizon-dependent methods.
        seed: the seed of the tuning run (the choice is deterministic for a seed).
        grid: the candidates (default :data:`GRID`; then extended once if needed).
        init: as in :func:`bilevel.solve`.
        cpu_rewrites: as in :func:`bilevel.solve`.

    Returns:
        A :class:`Tuning`; ``tuning.value`` is the chosen ``lr_outer``, ``tuning.step`` what
        ``bl.solve`` runs (``value`` with its tail decay on a run with minibatches).

    Raises:
        TuningError: when every candidate diverged or made no progress.
    """
    from bilevel.solvers import make

    if isinstance(solver, str):
        solver = make(solver, **hyperparameters)
    elif hyperparameters:
        solver = dataclasses.replace(solver, **hyperparameters)
    solver.check_problem(problem)
    solver = solver.with_horizon(steps)
    n = tuning_steps(steps)
    scoring, score_name = scoring_problem(problem)
    t0 = time.perf_counter()
    given = grid is not None
    candidates = tuple(sorted(float(v) for v in grid)) if given else GRID
    trials = [trial(scoring, solver, candidates, n, seed, init, cpu_rewrites, score_name)]
    if not given:
        first = trials[0]
        if not any(d == "" for d in first.dropped):
            trials.append(
                trial(scoring, solver, GRID_BELOW, n, seed, init, cpu_rewrites, score_name)
            )
        elif _best(first) == len(candidates) - 1:
            trials.append(
                trial(scoring, solver, GRID_ABOVE, n, seed, init, cpu_rewrites, score_name)
            )
    merged = merge(trials)
    seconds = time.perf_counter() - t0
    tuning = _decide(merged, solver, score_name, n, seconds)
    return dataclasses.replace(tuning, tail=tail_decay(problem, solver, steps))


def near_best(scores: Sequence[float], safe: Sequence[int]) -> int:
    """The index of ``safe`` (candidates of an increasing grid) that scores best, or the next
    larger one when it is in ``safe`` and scores within :data:`NEAR` of it (point 4)."""
    choice = min(safe, key=lambda i: scores[i])
    if choice + 1 in safe and scores[choice + 1] <= NEAR * scores[choice]:
        choice += 1
    return choice


def _best(trial: Trial) -> int:
    return int(np.argmin(trial.scores))


def _decide(trial: Trial, solver: Solver, score_name: str, n: int, seconds: float) -> Tuning:
    """The choice (module docstring, point 4), or a :class:`TuningError`."""
    kept = [i for i, d in enumerate(trial.dropped) if not d]
    if not kept:
        raise TuningError(
            f"{solver.name}: every lr_outer candidate from {trial.grid[0]:.0e} to "
            f"{trial.grid[-1]:.0e} diverged or made no progress within {n} steps. The inner "
            f"steps are the likely cause (lr_inner={getattr(solver, 'lr_inner', None)!r}): "
            "lower lr_inner (e.g. to a tenth), or give lr_outer as a number."
        )
    # next larger unstable (diverged, no progress) = at the edge, which a short run says little
    # about (the README's F2SA example: 10 stable for 50 steps, diverged by step 100 of 500)
    stable = tuning_runs.RAN_STABLY
    safe = [i for i in kept if i + 1 == len(trial.grid) or trial.dropped[i + 1] in stable]
    if safe:
        choice = near_best(trial.scores, safe)
    else:  # all at the edge, all below them dropped: the best, bl.solve's retry as its guard
        choice = min(kept, key=lambda i: trial.scores[i])
    return Tuning(
        field="lr_outer",
        value=trial.grid[choice],
        grid=trial.grid,
        scores=tuple(trial.scores),
        dropped=tuple(trial.dropped),
        score=score_name,
        start_score=trial.start,
        steps=n,
        samples=trial.counts["samples"],
        oracle_calls=trial.counts["oracle_calls"],
        counts={k: v for k, v in trial.counts.items() if k in Counts._fields},
        seconds=seconds,
        largest_stable=trial.grid[max(kept)],
    )

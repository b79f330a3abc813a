"""When ``bl.solve`` runs a tuned solve again, and which of its runs it returns.

A tuned ``lr_outer`` (:mod:`bilevel.drivers.tuning`) was judged on a short run, so the full run
is checked (the module docstring of ``tuning``, point 5): when it diverged, or *drifted*, it is
run again with the next smaller candidate, at most :data:`MAX_RETRIES` times, and of the full
runs the one whose gradient-type score ended lowest is returned.

A run drifted (:func:`drifted`) when its final score is

- above what the tuning run of the same step reached, twice that with minibatches (a method
  whose inner iterates fall behind as the inner problem grows ill-conditioned along the
  path), or
- more than :data:`PATH_DRIFT` times the lowest score the run itself had at an evaluation past
  the tuning's horizon (:class:`PathScores`), unless it ended below :data:`SETTLED` of its
  start's. Measured on the defaults benchmark's ``logistic_split`` with batches of 64: F3SA's
  run with its tuned 3.16 reached 0.010 of its start's ``||grad F||`` at step 500 and drifted
  to 0.120 by step 3000; its tuning run of 150 steps had been above that, so only the path
  shows it. (ITD on ``ridge_raw`` before its counts followed the inner step: 0.072 at step
  1000, 0.152 at the end.)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import numpy as np

from bilevel.core.oracles import Counts
from bilevel.drivers import tuning_runs
from bilevel.drivers.history import with_counts_raised
from bilevel.drivers.results import Result

__all__ = ["MAX_RETRIES", "DRIFT", "DRIFT_NOISY", "PATH_DRIFT", "SETTLED", "Run", "PathScores",
           "drifted", "retry_reason", "lowest_run", "final_of"]  # fmt: skip

#: a tuned run that diverges or drifts is run again with the next smaller candidate at most
#: this often
MAX_RETRIES = 2
#: a run has drifted when its final score is above this many times the score its step reached
#: in the tuning run; DRIFT_NOISY with minibatches, where the run's last iterate is noisier than
#: the tuning's mean over three seeds and two evaluations
DRIFT, DRIFT_NOISY = 1.0, 2.0
#: ... or above this many times its own lowest score past the tuning's horizon
PATH_DRIFT = 2.0
#: ... unless it ended below this share of the start's score (nothing worth a retry)
SETTLED = 0.01


class Run(NamedTuple):
    """One full run of a tuned solve: its result, the counter totals spent up to its end
    (tuning and earlier runs included), the tuning it ran with, its final gradient-type score
    (:func:`final_of`) and the lowest score on its path (:class:`PathScores`)."""

    result: Result
    spent: dict[str, int]
    tuning: Any
    final: float
    lowest: float = math.inf


class PathScores:
    """The lowest gradient-type score (the tuning's ``score``: exact ``||grad F||`` or gradient
    mapping, the mean over the seeds) of a tuned run at its evaluations past the tuning's
    horizon and before its last step: ``Engine(watch=...)`` calls it with the steps done and
    the state after every chunk. A score the problem records itself is read from the history
    instead (:meth:`lowest_in`)."""

    def __init__(self, problem, solver, tuning, steps: int):
        self.problem, self.solver, self.score = problem, solver, tuning.score
        self.after, self.steps = tuning.steps, steps
        self.lowest = math.inf
        own = problem.metrics  # a score of the problem's own is in the history: not recomputed
        self.recorded = own is not None and self.score in jax.eval_shape(
            own, problem.x0, problem.y0
        )

    def __call__(self, done: int, state) -> None:
        if self.recorded or not self.after < done < self.steps:
            return
        x = self.solver.output(state)[0]  # a leading seed axis
        value = tuning_runs.exact_score(self.problem, x, self.score, seed_axis=True)
        if np.isfinite(value):
            self.lowest = min(self.lowest, value)

    def lowest_in(self, result: Result) -> float:
        """The lowest score on the path: from the history where the run recorded it."""
        history = result.history
        if self.score not in history:
            return self.lowest
        rows = history[(history["step"] > self.after) & (history["step"] < self.steps)]
        means = rows.groupby("step")[self.score].mean()
        finite = means[np.isfinite(means)]
        return float(finite.min()) if len(finite) else math.inf


def drifted(problem, result, tuning, final: float, lowest: float = math.inf) -> bool:
    """Whether the full run with the tuned step drifted (module docstring): ended *worse* than
    the tuning run of that step, or well above its own lowest score on the way. Only for
    gradient-type scores (``grad_norm``, ``grad_mapping``), which a converging run drives
    down. ``result.steps`` must be the full run, ``final`` its final score
    (:func:`bilevel.drivers.tuning_runs.final_score`)."""
    if tuning.score not in tuning_runs.GRADIENT_SCORES or tuning.value not in tuning.grid:
        return False
    if final > PATH_DRIFT * lowest and final > SETTLED * tuning.start_score:
        return True
    reference = tuning.scores[tuning.grid.index(tuning.value)]
    if not np.isfinite(reference):
        return False
    noisy = result.solver.draws_minibatches(problem)
    return bool(final > (DRIFT_NOISY if noisy else DRIFT) * reference)


def retry_reason(problem, run: Run, steps: int, checkpointed: bool) -> str:
    """Why to run again with a smaller tuned step, or ``""``: the step was tuned, retries are
    left, there is no checkpoint (a retry would be a different run there), and the run diverged,
    or ran all its ``steps`` and drifted (:func:`drifted`)."""
    tuning = run.tuning
    if tuning is None or len(tuning.retries) >= MAX_RETRIES or checkpointed:
        return ""
    if run.result.diverged:
        return "diverged"
    if run.result.steps == steps and drifted(problem, run.result, tuning, run.final, run.lowest):
        return "drifted"
    return ""


def lowest_run(runs: list[Run]) -> tuple[Result, Any]:
    """After retries: the run whose gradient-type score ended lowest among those that ran all
    their steps without diverging (the latest on a tie; the last run when none did), with its
    history's counts raised to include every run's work, and the final tuning that records the
    choice (:meth:`bilevel.drivers.tuning.Tuning.kept`)."""
    last = runs[-1]
    finals = [run.final for run in runs]
    ranked = [(f, -i) for i, f in enumerate(finals) if math.isfinite(f)]
    index = -min(ranked)[1] if ranked else len(runs) - 1
    kept = runs[index]
    result = kept.result
    if index != len(runs) - 1:
        extra = {k: last.spent[k] - kept.spent[k] for k in Counts._fields}
        result = dataclasses.replace(result, history=with_counts_raised(result.history, extra))
    return result, last.tuning.kept(kept.tuning.value, finals)


def final_of(problem, result: Result, tuning, steps: int, batched: bool) -> float:
    """A full run's final gradient-type score (``nan`` when the run diverged or stopped early,
    or the tuning's score is not gradient-type); ``batched``: ``result`` has a seed axis."""
    if result.diverged or result.steps != steps:
        return math.nan
    if tuning.score not in tuning_runs.GRADIENT_SCORES:
        return math.nan
    return tuning_runs.final_score(problem, result, tuning.score, batched)

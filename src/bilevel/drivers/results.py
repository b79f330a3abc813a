"""What the drivers return and raise: :class:`Result`, the divergence warning and error,
:class:`Interrupted`, and :func:`finish`, which turns how a run ended into one of them."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import jax
import pandas as pd

from bilevel.solvers.base import Solver

PyTree = Any

__all__ = [
    "Outcome",
    "Result",
    "DivergenceWarning",
    "DivergenceError",
    "Interrupted",
    "finish",
    "drop_seed_axis",
]


class DivergenceWarning(RuntimeWarning):
    """A run produced non-finite iterates or losses and was stopped (results kept)."""


class DivergenceError(RuntimeError):
    """Raised instead of the warning with ``on_divergence="raise"``; ``.result`` holds the run."""

    def __init__(self, message: str, result: Outcome):
        super().__init__(message)
        self.result = result


@dataclasses.dataclass
class Outcome:
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
class Result(Outcome):
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
            constrained problems also get ``grad_mapping`` and ``fw_gap``
            (bilevel.analysis.metrics).
        state: the final solver state (seed axis with ``seeds=``).
        diverged: seeds that diverged (empty if none).
        message: a human-readable status.
        solver, problem_name, seeds: what was run.
        steps: the steps done (fewer than asked when interrupted or stopped by a time limit).
        tuning: what chose ``lr_outer`` when the solver had ``lr_outer="auto"`` (a
            :class:`bilevel.drivers.tuning.Tuning`: the grid, the scores, the choice, the
            steps, samples and seconds it took), ``None`` when every step size was given.
            Its samples and oracle calls are included in every row of ``history``.
    """

    steps: int
    tuning: Any = None


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

    def __init__(self, message: str, result: Outcome, checkpoint: Path | None, signal: str):
        super().__init__(message)
        self.result = result
        self.checkpoint = checkpoint
        self.signal = signal


def drop_seed_axis(tree: PyTree) -> PyTree:
    """``tree`` without the leading seed axis of a single ``seed=`` run (the drivers carry it
    inside, and remove it only in what they return)."""
    return jax.tree.map(lambda a: a[0], tree)


def finish(result: Outcome, stopped: str | None, checkpoint: Path | None, on_divergence: str):
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

"""The argument checks the drivers share: they fail before anything is compiled, naming the
argument and the fix (``caller`` names the driver: ``solve``, ``sweep``, ``solve_online``)."""

from __future__ import annotations

import operator
import os
from pathlib import Path

import numpy as np

from bilevel.core.online_problem import OnlineProblem
from bilevel.core.problem import BilevelProblem, ProblemKindError
from bilevel.drivers.checkpoints import CHECKPOINT_FILE
from bilevel.solvers import names as solver_names
from bilevel.solvers.base import Solver
from bilevel.solvers.online.base import OnlineSolver

__all__ = [
    "CONVEXITY_PROBE",
    "check_arguments",
    "check_checkpoint_dir",
    "check_convexity",
    "check_offline_problem",
    "check_online_arguments",
    "check_on_divergence",
    "check_seeds",
    "check_steps",
    "check_time_limit",
]

#: the convexity probe of every ``solve``: a few Lanczos steps on one minibatch's Hessian
CONVEXITY_PROBE = {"steps": 20, "batch_size": 1024, "num_batches": 1}


def check_seeds(seed, seeds, caller: str = "solve") -> list[int]:
    """The seeds as a list of ints: ``[seed]`` without ``seeds``."""
    if seeds is None:
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
            raise TypeError(f"{caller}(seed=...) must be an int, got {seed!r}.")
        return [int(seed)]
    if isinstance(seeds, int | np.integer):
        raise TypeError(
            f"{caller}(seeds={seeds!r}): seeds is a list of seeds, not a count; for {seeds} "
            f"seeds use seeds=range({seeds})."
        )
    try:
        seed_list = [operator.index(s) for s in seeds]
    except TypeError as err:
        raise TypeError(
            f"{caller}(seeds=...) must be a sequence of ints such as range(5), got {seeds!r}."
        ) from err
    if not seed_list:
        raise ValueError(f"{caller}(seeds=...) is empty; give at least one seed.")
    if len(set(seed_list)) != len(seed_list):
        raise ValueError(f"{caller}(seeds=...) has repeated seeds: {seed_list}.")
    return seed_list


def check_checkpoint_dir(checkpoint) -> Path | None:
    """The checkpoint directory, created now: a bad path fails before anything is compiled."""
    if checkpoint is None:
        return None
    path = Path(checkpoint)
    if path.exists() and not path.is_dir():
        raise ValueError(
            f"solve(checkpoint={str(path)!r}) is a file, not a directory; give a directory "
            f"(it will hold {CHECKPOINT_FILE}), e.g. {str(path.with_suffix(''))!r}_ckpt."
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(
            f"solve(checkpoint={str(path)!r}) cannot be created: {err.strerror or err}; give a "
            "writable directory."
        ) from err
    if not os.access(path, os.W_OK):
        raise ValueError(f"solve(checkpoint={str(path)!r}) is not writable; give another one.")
    return path


def check_offline_problem(problem, caller: str = "solve") -> None:
    """Refuse anything but a ``BilevelProblem`` (a stream names ``solve_online``)."""
    from bilevel.core.online_problem import OnlineProblem

    if isinstance(problem, OnlineProblem):
        raise ProblemKindError(
            f"{caller}(problem=...) needs a bl.BilevelProblem, got the bl.OnlineProblem "
            f"{problem.name}: run a stream with bl.solve_online(problem, solver) and an online "
            "solver such as 'f2obo' (bl.solvers.names('online')), or one of its rounds with "
            f"bl.{caller}(problem.round_problem(t), ...)."
        )
    if not isinstance(problem, BilevelProblem):
        raise TypeError(
            f"{caller}(problem=...) needs a bl.BilevelProblem, got {type(problem).__name__}."
        )


def check_arguments(problem, solver, steps, on_divergence, eval_every) -> tuple[int, int]:
    """``(steps, every)`` after checking the plain arguments of ``solve``."""
    check_offline_problem(problem)
    if not isinstance(solver, Solver):
        raise TypeError(
            f"solve(solver=...) needs a solver from bl.solvers.make(...), got "
            f"{type(solver).__name__}."
        )
    check_on_divergence(on_divergence)
    return check_steps(steps, eval_every)


def check_on_divergence(on_divergence) -> None:
    if on_divergence not in ("warn", "raise"):
        raise ValueError(f"on_divergence must be 'warn' or 'raise', got {on_divergence!r}.")


def check_steps(steps, eval_every, caller: str = "solve") -> tuple[int, int]:
    """``(steps, every)``, every capped at steps."""
    if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps < 1:
        raise ValueError(f"{caller}(steps=...) must be a positive int, got {steps!r}.")
    every = steps if eval_every is None else eval_every
    if isinstance(every, bool) or not isinstance(every, int | np.integer) or every < 1:
        raise ValueError(f"{caller}(eval_every=...) must be a positive int, got {eval_every!r}.")
    return int(steps), min(int(every), int(steps))


def check_time_limit(time_limit) -> None:
    """``None`` or a positive number of seconds."""
    number = isinstance(time_limit, int | float) and not isinstance(time_limit, bool)
    if time_limit is not None and not (number and time_limit > 0):
        raise ValueError(
            f"time_limit must be None or a positive number of seconds, got {time_limit!r}."
        )


def check_convexity(problem: BilevelProblem) -> None:
    """Warn (``NotStronglyConvexWarning``) when g(x0, .) does not look strongly convex.

    Every method here assumes it; with an explicit ``lr_inner`` nothing else would look, and a
    concave inner problem would only show as a divergence stop much later. The probe is cheap
    (:data:`CONVEXITY_PROBE`: 20 Lanczos steps on one minibatch of at most 1024 samples; the
    full ``bl.diagnose`` took 350 s on E3's LeNet problem). The smallest Ritz value is never
    below the smallest eigenvalue, so the probe does not invent negative curvature; it is
    cached per problem like every diagnosis.
    """
    from bilevel.analysis.diagnose import diagnose

    diagnose(problem, warn=True, **CONVEXITY_PROBE)


def check_online_arguments(problem, solver, on_divergence, regret_step) -> None:
    """``bl.solve_online``'s argument checks: an online problem and solver, the divergence
    policy, a positive ``regret_step``."""
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
                f"offline solver; use one of {', '.join(solver_names('online'))} (e.g. "
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

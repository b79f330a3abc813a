"""``solve_online``: ``solve``'s driver for streams of rounds.

It is ``bl.solve``'s machinery (``bilevel.drivers.run``): ``eval_every`` rounds run inside one compiled
``lax.scan`` vmapped over seeds, from the same compile cache, with the same seed handling,
progress display, stop signals, history rows and counter totals, and the same divergence stop
that keeps what was done. What differs is what a chunk returns: every round's committed
``(x_t, y_t)``, counts and the solver's own metrics, so the history has one row per round, and
the regret (``bilevel.analysis.regret``) and metrics of every round are evaluated after the chunk,
outside the timed region and the oracle counts.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from bilevel.analysis import regret as _regret
from bilevel.analysis.metrics import loss_metrics
from bilevel.core.online_problem import OnlineProblem
from bilevel.core.oracles import Counts
from bilevel.core.problem import ProblemKindError
from bilevel.core.tree import tree_allfinite
from bilevel.drivers import progress as _progress
from bilevel.drivers.run import (
    ONLINE_ROUNDS,
    _check_convexity,
    _check_on_divergence,
    _check_seeds,
    _check_steps,
    _Checkpointer,
    _compiled,
    _finish,
    _float_leaves_finite,
    _History,
    _init_states,
    _keep_good,
    _Outcome,
    _over_seeds,
    _Run,
)
from bilevel.solvers.base import Solver
from bilevel.solvers.online.base import OnlineSolver

PyTree = Any

__all__ = ["solve_online", "OnlineResult"]

#: rounds evaluated side by side (``lax.map``'s batch) after each chunk: the dense regret
#: oracle holds one Hessian per round of a batch
EVAL_BATCH = 16


@dataclasses.dataclass
class OnlineResult(_Outcome):
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


class RoundTrace(NamedTuple):
    """What a chunk keeps of each round it played."""

    t: jax.Array  # the round
    x: PyTree  # x_t, committed before the round's update
    y: PyTree  # y_t
    counts: Counts  # the counts after the round
    solver_metrics: dict  # Solver.state_metrics after the round (its step's direction norm)


def _make_rounds(length: int, batched: bool):
    """The chunk program: ``length`` rounds in one ``lax.scan``; ``(state, trace, finite)``."""

    def one(solver, problem, state):
        def body(s, _):
            x, y = solver.output(s)
            new = solver.round(problem, s)
            return new, RoundTrace(s.t, x, y, new.counts, solver.state_metrics(new))

        state, trace = jax.lax.scan(body, state, None, length=length)
        return state, trace, _float_leaves_finite(state)

    return _over_seeds(one)


def _make_evaluation(oracle: str | None, regret_step: float | None, reference_steps: int):
    """The builder of the evaluation program of a chunk's trace: per round the metrics, the
    regret term and the gamma it used, and whether the round is finite."""

    def build(length: int, batched: bool):
        def one(solver, problem, trace):
            def per_round(args):
                t, x, y = args
                return _round_evaluation(
                    problem, solver, t, x, y, oracle, regret_step, reference_steps
                )

            metrics, term, gamma = jax.lax.map(
                per_round, (trace.t, trace.x, trace.y), batch_size=EVAL_BATCH
            )
            metrics.update(trace.solver_metrics)
            iterates = jax.vmap(lambda x, y: tree_allfinite((x, y)))(trace.x, trace.y)
            values = jnp.stack([jnp.isfinite(v) for v in metrics.values()]).all(axis=0)
            return metrics, term, gamma, iterates & values

        return _over_seeds(one)

    return build


def _round_evaluation(problem, solver, t, x, y, oracle, regret_step, reference_steps):
    """One round's metrics on its evaluation data, regret term and gamma."""
    f, g = problem.at_round(t)
    outer_data, inner_data = problem.evaluation_data(t)
    own = {} if problem.metrics is None else dict(problem.metrics(t, x, y))
    metrics = loss_metrics(f, g, x, y, outer_data, inner_data, skip=own)
    metrics.update({k: jnp.asarray(v) for k, v in own.items()})
    gamma = solver.outer_lr(t) if regret_step is None else jnp.asarray(regret_step)
    gamma = jnp.asarray(gamma, jnp.result_type(float))
    if oracle is None:
        return metrics, jnp.full((), jnp.nan, gamma.dtype), gamma
    grad = _regret.hypergradient(problem, oracle, t, x, y, reference_steps)
    return metrics, _regret.regret_term(problem.x_set, x, grad, gamma), gamma


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

    Returns:
        An :class:`OnlineResult`.

    Raises:
        ProblemKindError: (a TypeError and a ValueError) when ``problem`` is not an
            ``OnlineProblem`` or ``solver`` is not an online solver, naming the fix.
        ValueError: bad arguments; a non-finite start.
        Interrupted: on Ctrl-C or SIGTERM; its ``.result`` holds the rounds done.
    """
    _check_arguments(problem, solver, on_divergence, regret_step)
    _, every = _check_steps(problem.horizon, eval_every, caller="solve_online")
    seed_list = _check_seeds(seed, seeds, caller="solve_online")
    solver.check_problem(problem)
    solver = solver.with_horizon(problem.horizon).resolve(problem)
    oracle = None if regret is None else _regret.choose(problem, regret)
    _check_convexity(problem.round_problem(1))

    state = _init_states(solver, problem, seed_list, True, init)
    history = _History(seed_list)
    display = _progress.Progress(
        progress, problem.horizon, solver.name, problem.name, len(seed_list), unit="round"
    )
    run = _OnlineRun(
        problem,
        solver,
        True,
        every,
        problem.horizon,
        history,
        _Checkpointer(None, "", 0.0),
        display,
        unit="round",
        evaluation=_make_evaluation(oracle, regret_step, reference_steps),
        evaluation_kind=("online-evaluation", oracle, regret_step, reference_steps),
        with_regret=oracle is not None,
    )
    run.check_start(state)
    try:
        state, stopped = run.loop(state)
    finally:
        display.close()
    result = run.online_result(state, seeds is not None, oracle, reference_steps)
    return _finish(result, stopped, None, on_divergence)


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
    _check_on_divergence(on_divergence)
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


@dataclasses.dataclass
class _OnlineRun(_Run):
    """``solve``'s loop (``run._Run``) with chunks of rounds and one history row per round."""

    evaluation: Callable | None = None  # builder of the evaluation program (_make_evaluation)
    evaluation_kind: tuple = ()  # its compile-cache key
    with_regret: bool = True  # regret columns in the history (not with regret=None)
    chunks: list = dataclasses.field(default_factory=list)  # per chunk: (xs, ys, terms, gamma)
    regret_total: np.ndarray | None = None  # per seed, the cumulative regret so far

    def check_start(self, state) -> None:
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
        self.regret_total = np.zeros(len(self.history.seeds))

    def _chunk(self, state, stop):
        length = min(self.every, self.steps - self.done)
        chunk = self._compile(ONLINE_ROUNDS, state, length, _make_rounds)
        t0 = time.perf_counter()
        new_state, trace, end_finite = jax.block_until_ready(chunk(self.problem, state))
        elapsed = time.perf_counter() - t0
        with stop.bookkeeping():
            evaluate = self._compile(self.evaluation_kind, trace, length, self.evaluation)
            evaluated = jax.device_get(evaluate(self.problem, trace))
            self._record(jax.device_get(trace), *evaluated, elapsed, length)
            self.seconds += elapsed
            self.done += length
            alive = self.history.alive
            for i in np.flatnonzero(alive & ~np.asarray(end_finite)):  # the update blew up
                self.diverged_at[self.history.seeds[i]] = self.done
            alive &= np.asarray(end_finite)
            state = _keep_good(new_state, state, alive, True)
            self.display.update(self.done, self.history.rows)
        return state

    def _compile(self, kind, state, length: int, build):
        return _compiled(kind, self.solver, self.problem, state, length, True, build=build)

    def _record(self, trace, metrics, terms, gammas, finite, elapsed: float, length: int):
        """The rows of a chunk's rounds, the cumulative regret, and its iterates (NaN once a
        seed diverged)."""
        seeds, alive = self.history.seeds, self.history.alive
        kept = np.zeros((len(seeds), length), bool)
        regret = np.full((len(seeds), length), np.nan)
        for r in range(length):
            t = self.done + r + 1
            self.regret_total = np.where(alive, self.regret_total + terms[:, r], np.nan)
            row_metrics = {k: v[:, r] for k, v in metrics.items()}
            if self.with_regret:
                row_metrics |= {"regret_term": terms[:, r], "regret": self.regret_total}
            counts = Counts(*(np.asarray(c)[:, r] for c in trace.counts))
            seconds = self.seconds + elapsed * (r + 1) / length
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

    def online_result(self, state, seed_axis: bool, oracle, reference_steps) -> OnlineResult:
        def join(i):
            parts = [c[i] for c in self.chunks]
            return jax.tree.map(lambda *a: np.concatenate(a, axis=1), *parts)

        xs, ys, terms, regret = (join(i) for i in range(4))
        gamma = np.concatenate([c[4] for c in self.chunks]) if self.chunks else np.zeros(0)
        x, y = jax.device_get(self.solver.output(state))
        if not seed_axis:
            xs, ys, terms, regret, x, y = jax.tree.map(
                lambda a: a[0], (xs, ys, terms, regret, x, y)
            )
            state = jax.tree.map(lambda a: a[0], state)
        (x, y), (xs, ys) = self.problem.models(x, y), self.problem.models(xs, ys)
        history = pd.DataFrame(self.history.rows).rename(columns={"step": "round"})
        diverged = self.diverged_seeds()
        return OnlineResult(
            xs=xs,
            ys=ys,
            regret=None if oracle is None else regret,
            regret_terms=None if oracle is None else terms,
            regret_oracle=None if oracle is None else _regret.describe(oracle, reference_steps),
            regret_gamma=gamma,
            history=history,
            x=x,
            y=y,
            state=state,
            diverged=diverged,
            message=self._message(diverged, False),
            solver=self.solver,
            problem_name=self.problem.name,
            seeds=self.history.seeds,
            rounds=self.done,
        )

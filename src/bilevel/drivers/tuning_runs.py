"""The tuning run's candidates: one ``bl.sweep`` per grid, scored (:mod:`bilevel.drivers.tuning`
explains the rule; this module runs and scores the candidates, that one decides)."""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
import pandas as pd
from jax.flatten_util import ravel_pytree

from bilevel.core.oracles import Counts
from bilevel.core.problem import BilevelProblem
from bilevel.core.tree import tree_norm
from bilevel.drivers.sweep import sweep

__all__ = [
    "Trial",
    "scoring_problem",
    "trial",
    "final_score",
    "EXACT_MAX_DIM",
    "EVALUATIONS",
    "BEHIND",
    "settle",
    "merge",
    "DEAD",
    "RAN_STABLY",
    "GRADIENT_SCORES",
]

#: the exact score needs a dense inner Hessian per candidate: only for y of at most this size
EXACT_MAX_DIM = 300
#: the scores a converging run drives down, by which a full run is judged after the tuning
GRADIENT_SCORES = ("grad_norm", "grad_mapping")
#: drop reasons of a candidate whose run did not finish with finite scores
DEAD = ("diverged", "not finite")
#: drop reasons of a candidate whose run was stable: kept (""), or behind the best one's F
RAN_STABLY = ("", "F behind")
#: evaluations of the tuning run (the score averages the last two)
EVALUATIONS = 4
#: a candidate whose exact F ends more than this share of the best decrease behind the best
BEHIND = 0.1


@dataclasses.dataclass
class Trial:
    """Sweeps over candidates: per candidate its score, start score, drop reason, counts.

    ``reasons`` (why each candidate's own run disqualifies it: diverged, not finite, no
    progress, or ``""``), ``reached`` (its score, dropped or not; ``inf`` where it diverged),
    ``final_F`` (its exact F at the end, where known) and ``start_F`` are what :func:`settle`
    judges the candidates by, over every sweep of one tuning together (:func:`merge`)."""

    grid: tuple[float, ...]
    scores: list[float]
    start: float
    dropped: list[str]
    counts: dict[str, int]
    reasons: list[str] = dataclasses.field(default_factory=list)
    reached: list[float] = dataclasses.field(default_factory=list)
    final_F: list[float] | None = None
    start_F: float | None = None


def scoring_problem(problem: BilevelProblem) -> tuple[BilevelProblem, str]:
    """The problem the tuning run evaluates, and the name of its score.

    Small unconstrained problems without models get exact metrics ``grad_norm`` and ``F``
    (dense Newton from the solver's y, then the implicit-function formula); a problem's own
    ``grad_norm`` or a constrained problem's ``fw_gap`` / ``grad_mapping`` are used as they
    are; anything else is scored by ``outer_loss``.
    """
    own = problem.metrics
    names = set()
    if own is not None:
        names = set(jax.eval_shape(own, problem.x0, problem.y0))
    if "grad_norm" in names:
        return problem, "grad_norm"
    models = problem.model_parts != (None, None)
    dim_y = ravel_pytree(problem.y0)[0].size
    dim_x = ravel_pytree(problem.x0)[0].size
    small = not models and dim_y <= EXACT_MAX_DIM and dim_x <= 1000
    if problem.x_set is not None:
        if small:
            from bilevel.core import sets

            bounded = isinstance(
                problem.x_set, sets.L2Ball | sets.L1Ball | sets.Simplex | sets.NuclearBall
            )
            return problem, "fw_gap" if bounded else "grad_mapping"
        return problem, "outer_loss"
    if not small:
        return problem, "outer_loss"
    return problem.replace(metrics=_exact_metrics(problem)), "grad_norm"


def _exact_metrics(problem: BilevelProblem):
    """``metrics(x, y)``: the problem's own, plus the exact ``grad_norm`` and ``F``."""
    from bilevel.analysis.metrics import dense_hypergradient, newton_inner_solution

    own = problem.metrics
    outer, inner = problem.outer, problem.inner
    outer_data, inner_data = problem.outer_data, problem.inner_data

    def metrics(x, y):
        out = {} if own is None else dict(own(x, y))
        y_star = newton_inner_solution(inner, x, y, inner_data, 10)
        grad = dense_hypergradient(outer, inner, x, y_star, outer_data, inner_data, 2)
        out["grad_norm"] = tree_norm(grad)
        out["F"] = outer(x, y_star, outer_data)
        return out

    return metrics


def trial(problem, solver, candidates, n, seed, init, cpu_rewrites, score_name) -> Trial:
    """Run the candidates as one sweep and score them (the mean over the tuning's seeds)."""
    # minibatch noise decides stability too: three seeds, a candidate dropped if one diverges
    seeds = (seed,) if not (problem.stochastic or init is not None) else (seed, seed + 1, seed + 2)
    every = max(1, n // EVALUATIONS)
    df = sweep(
        problem,
        solver,
        grid={"lr_outer": list(candidates)},
        steps=n,
        seeds=seeds,
        eval_every=every,
        progress=False,
        init=init,
        cpu_rewrites=cpu_rewrites,
    )
    dead = {d["lr_outer"] for d in df.attrs.get("diverged", [])}
    df = _seed_means(df)
    reached, reasons, final_F = [], [], []
    counts = {k: 0 for k in ("samples", "oracle_calls", *Counts._fields)}
    start = math.inf
    for value in candidates:
        rows = df[df["lr_outer"] == value].sort_values("step")
        start = float(rows[score_name].iloc[0])
        last = rows.iloc[-1]
        for k in counts:  # a diverged candidate's steps after its last row: extrapolated
            counts[k] += int(round(last[k] * n / max(int(last["step"]), 1)))
        reason = _drop_reason(rows, value in dead, score_name, n)
        reasons.append(reason)
        tail = rows[score_name].iloc[-2:] if len(rows) > 2 else rows[score_name].iloc[-1:]
        reached.append(math.inf if reason in DEAD else float(np.mean(tail)))
        final_F.append(float(rows["F"].iloc[-1]) if "F" in rows else math.nan)
    known = "F" in df
    start_F = float(df.sort_values("step")["F"].iloc[0]) if known else None
    raw = Trial(
        grid=tuple(candidates),
        scores=[],  # settle's, as dropped
        start=start,
        dropped=[],
        counts=counts,
        reasons=reasons,
        reached=reached,
        final_F=final_F if known else None,
        start_F=start_F,
    )
    return settle(raw)


def settle(trial: Trial) -> Trial:
    """The candidates judged together (module docstring of :mod:`bilevel.drivers.tuning`,
    point 3): those whose exact F is behind the best are dropped (:func:`_drop_behind`), and
    when no candidate improved on the start, the stable ones are kept, scored as they are.
    Judged on every sweep of a tuning at once (:func:`merge`): a grid extended upwards whose
    new candidates all ran into a flat region far away must not keep them for lack of a
    better one among themselves."""
    base = trial.reasons
    scores = [math.inf if d else r for d, r in zip(base, trial.reached, strict=True)]
    dropped = list(base)
    if trial.final_F is not None:  # a flat region far away has a small gradient too
        _drop_behind(trial.final_F, trial.start_F, scores, dropped)
    if all(dropped) and not all(d in DEAD for d in dropped):
        # no candidate improved: keep the stable ones, scored as they are
        for i, d in enumerate(base):
            if d == "no progress":
                scores[i], dropped[i] = trial.reached[i], ""
    return dataclasses.replace(trial, scores=scores, dropped=dropped)


def merge(trials: list[Trial]) -> Trial:
    """The trials' candidates in one increasing grid, judged together (:func:`settle`)."""
    if len(trials) == 1:
        return trials[0]
    order = sorted((v, t, i) for t, trial in enumerate(trials) for i, v in enumerate(trial.grid))

    def pick(field):
        return [getattr(trials[t], field)[i] for _, t, i in order]

    known = all(t.final_F is not None for t in trials)
    merged = Trial(
        grid=tuple(v for v, _, _ in order),
        scores=[],  # settle's, from the reasons, scores reached and F of every sweep
        start=trials[0].start,
        dropped=[],
        counts={k: sum(t.counts[k] for t in trials) for k in trials[0].counts},
        reasons=pick("reasons"),
        reached=pick("reached"),
        final_F=pick("final_F") if known else None,
        start_F=trials[0].start_F,
    )
    return settle(merged)


def _seed_means(df: pd.DataFrame) -> pd.DataFrame:
    """One row per candidate and step: the mean over seeds of the metrics, the sum of the
    counters (what all the seeds drew), the rows of steps every seed reached."""
    counters = ["samples", "oracle_calls", *Counts._fields]
    n_seeds = df["seed"].nunique()
    grouped = df.groupby(["lr_outer", "step"], sort=True)
    complete = grouped["seed"].transform("nunique") == n_seeds
    df = df[complete]
    grouped = df.groupby(["lr_outer", "step"], sort=True)
    metrics = [c for c in df.columns if c not in (*counters, "lr_outer", "step", "seed")]
    out = grouped[metrics].mean()
    out[counters] = grouped[counters].sum()
    return out.reset_index()


def _drop_behind(final: list[float], start: float, scores: list, dropped: list) -> None:
    """Drop (in place) the kept candidates whose final exact F is behind the best one's by more
    than :data:`BEHIND` of the best decrease F(x0) - min F (``start`` = F(x0)): a candidate that
    ran into a region where the gradient vanishes (a penalty exp(x_j) -> 0 as x_j -> -inf)
    scores a small ``||grad F||`` without having found a better point."""
    kept = [i for i, d in enumerate(dropped) if not d]
    if not kept:
        return
    best = min(final[i] for i in kept)
    for i in kept:
        if final[i] - best > BEHIND * max(start - best, 0.0):
            dropped[i], scores[i] = "F behind", math.inf


def _drop_reason(rows: pd.DataFrame, diverged: bool, score_name: str, n: int) -> str:
    """Why a candidate is dropped: ``"diverged"`` (the run's divergence rules), ``"not
    finite"``, ``"no progress"`` (its score, or F where known, ended above its start), or
    ``""``."""
    if diverged or int(rows["step"].iloc[-1]) < n:
        return "diverged"
    values = rows[score_name].to_numpy(float)
    if not np.all(np.isfinite(values)):
        return "not finite"
    if "F" in rows:  # the objective itself: ||grad F|| rises on the way out of a flat start
        F = rows["F"].to_numpy(float)
        worse = not np.isfinite(F[-1]) or F[-1] > F[0] + 1e-12 * abs(F[0])
    else:
        worse = values[-1] > values[0]
    return "no progress" if worse else ""


def final_score(problem: BilevelProblem, result, score_name: str, seed_axis: bool) -> float:
    """A finished run's score ``score_name`` at its last iterates, the mean over its seeds: from
    the history where the run recorded it, else exact (``bl.metrics.hypergradient`` /
    ``grad_mapping`` at the final x; ``seed_axis``: ``result.x`` has a leading seed axis);
    ``nan`` for a score that cannot be computed here."""
    history = result.history
    if score_name in history:
        last = history[history["step"] == history["step"].max()]
        return float(last[score_name].mean())
    return exact_score(problem, result.x, score_name, seed_axis)


def exact_score(problem: BilevelProblem, x, score_name: str, seed_axis: bool) -> float:
    """``score_name`` (``grad_norm`` or ``grad_mapping``) at ``x``, exact: the mean over its
    seeds where ``seed_axis`` (a leading axis of seeds); ``nan`` for another score."""
    if score_name not in ("grad_norm", "grad_mapping"):
        return math.nan
    from bilevel.analysis import metrics

    seeds = jax.tree.leaves(x)[0].shape[0] if seed_axis else 1
    xs = [x] if not seed_axis else [jax.tree.map(lambda a, i=i: a[i], x) for i in range(seeds)]
    if score_name == "grad_mapping":
        values = [float(metrics.grad_mapping(problem, x)) for x in xs]
    else:
        values = [float(tree_norm(metrics.hypergradient(problem, x))) for x in xs]
    return float(np.mean(values))

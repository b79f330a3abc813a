"""Shared machinery of the reproduction experiments: run methods, grid-search, write outputs.

An experiment module builds its problem(s), lists its methods (a label, a solver name and
hyperparameters), and calls :func:`run_methods`; this module writes one CSV per curve, the
figures (mean +- std over seeds against samples and against wall time) and ``claims.md`` (each
claim of the paper beside what the run measured, with the data substitute stated).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bilevel.core.problem import BilevelProblem
from bilevel.drivers.results import DivergenceWarning
from bilevel.drivers.solve import solve
from bilevel.drivers.sweep import final_means, sweep
from bilevel.drivers.tuning import needs_tuning
from bilevel.experiments.protocols import PAPER, Protocol
from bilevel.experiments.report import plot_history
from bilevel.solvers import make

__all__ = [
    "HYPERTORCH_AID",
    "Method",
    "Claim",
    "ExperimentOutput",
    "run_methods",
    "grid_search",
    "write_outputs",
    "final_mean",
    "time_to_reach",
    "value_within",
    "verdict",
]


#: AID-CG's and AID-FP's adjoint as the PZOBO paper's baselines ran it (hypertorch): K
#: iterations from v = 0 every step, not the library's warm-started default
HYPERTORCH_AID = {"warm_adjoint": False}


def paper_solver(name: str, **hyper):
    """``bl.solvers.make(name, **hyper)`` for a reproduction: its settings are the paper's, so
    nothing may be left to the automatic tuning of ``lr_outer="auto"`` (a ValueError names the
    missing setting)."""
    solver = make(name, **hyper)
    if needs_tuning(solver):
        raise ValueError(
            f"a reproduction runs the paper's settings, but {name!r} was given no lr_outer "
            "(it would be tuned); give the paper's value."
        )
    return solver


@dataclasses.dataclass(frozen=True)
class Method:
    """One curve of an experiment: ``solver`` with ``hyper`` run for ``steps``."""

    label: str
    solver: str
    hyper: dict
    steps: int
    eval_every: int
    time_limit: float | None = None  # seconds of solver time: bl.solve(time_limit=...)

    def make(self):
        return paper_solver(self.solver, **self.hyper)


@dataclasses.dataclass
class Claim:
    """A claim or number of the paper beside what this run measured, under the protocol named
    (``"paper"``, the paper's own settings, unless a second protocol is judged:
    :mod:`bilevel.experiments.protocols`)."""

    claim: str
    paper: str
    measured: str
    verdict: str  # "reproduced", "partly", "not reproduced", "n/a (quick run)", ...
    protocol: str = PAPER


@dataclasses.dataclass
class ExperimentOutput:
    """What an experiment produced (all of it is also written to disk)."""

    name: str
    out_dir: Path
    histories: dict[str, pd.DataFrame]
    claims: list[Claim]
    notes: list[str]
    quick: bool
    seconds: float


def run_methods(
    problem: BilevelProblem,
    methods: Sequence[Method],
    *,
    seeds: int,
    progress: bool = False,
    log: Callable[[str], None] = print,
    init=None,
    results: dict | None = None,
) -> dict[str, pd.DataFrame]:
    """Run every method on ``problem`` with ``seeds`` vmapped seeds; histories by label.

    A method that diverges keeps the history it made (the warning is turned into a log line).
    ``results``, when given, receives each method's :class:`bilevel.drivers.results.Result` by
    label (its final iterates, for evaluations the history does not hold).
    """
    out = {}
    for m in methods:
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DivergenceWarning)
            res = solve(
                problem,
                m.make(),
                steps=m.steps,
                seeds=list(range(seeds)),
                eval_every=m.eval_every,
                progress=progress,
                init=init,
                time_limit=m.time_limit,
            )
        for w in caught:
            if issubclass(w.category, DivergenceWarning):
                log(f"  [{m.label}] {w.message}")
        if results is not None:
            results[m.label] = res
        hist = res.history.copy()
        hist.insert(0, "method", m.label)
        out[m.label] = hist
        log(f"  {m.label}: {res.steps} steps x {seeds} seeds in {time.perf_counter() - t0:.1f} s")
    return out


def verdict(quick: bool, ok: bool) -> str:
    """A claim's verdict: not judged in a quick run (reduced sizes), else whether it held."""
    return "n/a (quick run)" if quick else ("reproduced" if ok else "not reproduced")


def final_mean(history: pd.DataFrame, column: str) -> float:
    """Mean over seeds of ``column`` at the last evaluation."""
    last = history[history.step == history.step.max()]
    return float(last[column].mean())


def time_to_reach(history: pd.DataFrame, column: str, level: float) -> float:
    """Solver seconds (mean over seeds) at which the seed-mean ``column`` first falls to
    ``level`` or below; ``inf`` if it never does."""
    curve = history.groupby("step")[[column, "seconds"]].mean().sort_index()
    hit = curve[curve[column] <= level]
    return float(hit.seconds.iloc[0]) if len(hit) else math.inf


def value_within(history: pd.DataFrame, column: str, budget: float, by: str = "seconds") -> float:
    """Seed-mean ``column`` at the last evaluation whose seed-mean ``by`` (solver seconds,
    samples) is within ``budget``; NaN if none is."""
    curve = history.groupby("step")[[column, by]].mean().sort_index()
    within = curve[curve[by] <= budget]
    return float(within[column].iloc[-1]) if len(within) else math.nan


def grid_search(
    problem: BilevelProblem,
    solver: str,
    base: dict,
    grid: dict[str, Sequence],
    *,
    steps: int,
    metric: str,
    eval_every: int | None = None,
    seeds: int = 1,
    init=None,
) -> tuple[dict, pd.DataFrame]:
    """Try every combination of ``grid`` on top of ``base``; the best by final ``metric``.

    Each point runs ``seeds`` vmapped seeds (from ``init``'s random starts when given, as
    ``bl.solve(init=...)``) and scores their mean final ``metric``; a point where any seed
    diverged or ended non-finite scores +inf. Returns (best hyperparameters, table of all).
    A grid of float values (step sizes, constants) runs as one ``bl.sweep`` program; a grid
    with other values (None, ints, strings: static settings) runs point by point. A one-point
    grid (quick runs) has nothing to choose: it is returned without a run, its score written
    as NaN.
    """
    keys = list(grid)
    points = list(itertools.product(*(grid[k] for k in keys)))
    if len(points) == 1:
        row = {"solver": solver, **{k: str(v) for k, v in zip(keys, points[0], strict=True)}}
        return dict(base, **dict(zip(keys, points[0], strict=True))), pd.DataFrame(
            [dict(row, **{metric: math.nan})]
        )
    run = _scores_swept if _all_floats(points) else _scores_looped
    scores = run(problem, solver, base, keys, points, steps, metric, eval_every, seeds, init)
    table = pd.DataFrame(
        [
            {"solver": solver, **{k: str(v) for k, v in zip(keys, values, strict=True)}, metric: sc}
            for values, sc in zip(points, scores, strict=True)
        ]
    )
    best_values = points[int(np.argmin(table[metric].to_numpy()))]
    return dict(base, **dict(zip(keys, best_values, strict=True))), table


def _all_floats(points) -> bool:
    return all(isinstance(v, float) for values in points for v in values)


def _scores_swept(problem, solver, base, keys, points, steps, metric, eval_every, seeds, init):
    """The grid as one ``bl.sweep`` program; a point whose seeds did not all reach ``steps``
    finite scores +inf (``sweep.final_means``)."""
    df = sweep(
        problem,
        solver,
        grid={k: list(dict.fromkeys(v[i] for v in points)) for i, k in enumerate(keys)},
        steps=steps,
        seeds=range(seeds),
        eval_every=eval_every or steps,
        progress=False,
        init=init,
        **base,
    )
    means = final_means(df, keys).set_index(keys)[metric]
    if df["step"].max() < steps:  # every point stopped early
        return [math.inf] * len(points)
    scores = [float(means.loc[values if len(keys) > 1 else values[0]]) for values in points]
    return [sc if math.isfinite(sc) else math.inf for sc in scores]


def _scores_looped(problem, solver, base, keys, points, steps, metric, eval_every, seeds, init):
    """One ``bl.solve`` per point (grids over static settings)."""
    scores = []
    for values in points:
        hyper = dict(base, **dict(zip(keys, values, strict=True)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DivergenceWarning)
            res = solve(
                problem,
                paper_solver(solver, **hyper),
                steps=steps,
                seeds=list(range(seeds)),
                eval_every=eval_every or steps,
                progress=False,
                init=init,
            )
        score = final_mean(res.history, metric) if res.ok else math.inf
        if not math.isfinite(score) or res.history.step.max() < steps:
            score = math.inf
        scores.append(score)
    return scores


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def write_outputs(
    name: str,
    out_dir: Path,
    *,
    title: str,
    histories: dict[str, pd.DataFrame],
    claims: list[Claim],
    notes: list[str],
    quick: bool,
    seconds: float,
    metric: str,
    figures: dict[str, dict[str, pd.DataFrame]] | None = None,
    setting: dict | None = None,
    logy: bool = True,
    figure_metrics: dict[str, str] | None = None,
    linear_figures: tuple[str, ...] = (),
    xs: tuple[str, ...] = ("samples", "seconds"),
    protocols: Sequence[Protocol] = (),
) -> ExperimentOutput:
    """Write curves/*.csv, the figures (PNG) and claims.md into ``out_dir``.

    ``protocols`` are listed in claims.md with every setting's source; each claim's row names
    the protocol it was judged on.

    Each figure plots ``metric`` unless ``figure_metrics`` names another for it, on a log axis
    if ``logy`` unless it is one of ``linear_figures`` (accuracies, say), one panel per history
    column in ``xs`` (``"step"`` for deterministic problems, whose samples are full passes).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_curves(out_dir / "curves", histories)
    figs = figures or {name: histories}
    for fig_name, group in figs.items():
        plot_history(
            group,
            out_dir / f"{fig_name}.png",
            metric=(figure_metrics or {}).get(fig_name, metric),
            title=title + (" [QUICK RUN]" if quick else ""),
            logy=logy and fig_name not in linear_figures,
            xs=xs,
        )
    lines = _claims_markdown(title, claims, notes, quick, seconds, setting, protocols)
    lines += ["", "Figures: " + ", ".join(f"`{f}.png`" for f in figs) + "; curves: `curves/*.csv`."]
    (out_dir / "claims.md").write_text("\n".join(lines) + "\n")
    _write_summary(out_dir / "summary.json", name, quick, seconds, histories)
    return ExperimentOutput(
        name=name,
        out_dir=out_dir,
        histories=histories,
        claims=claims,
        notes=notes,
        quick=quick,
        seconds=seconds,
    )


def file_stem(label: str) -> str:
    """A method's label as a file name: characters unsafe in file names as ``_``."""
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)


def _write_curves(curves: Path, histories: dict[str, pd.DataFrame]) -> None:
    """One CSV per history, named by its label (:func:`file_stem`)."""
    curves.mkdir(exist_ok=True)
    for label, hist in histories.items():
        hist.to_csv(curves / f"{file_stem(label)}.csv", index=False)


def _claims_markdown(title, claims, notes, quick, seconds, setting, protocols=()) -> list[str]:
    """The lines of claims.md up to its claims table (the figures' line follows)."""
    lines = [f"# {title}", ""]
    if quick:
        lines += [
            "**QUICK RUN**: reduced steps/sizes for a smoke test; the numbers below are not "
            "the paper's setting and verdicts are not judged.",
            "",
        ]
    lines += [f"Wall time of this run: {seconds:.1f} s.", ""]
    if setting:
        lines += ["## Setting", ""] + [f"- {k}: {_fmt(v)}" for k, v in setting.items()] + [""]
    if protocols:
        lines += ["## Protocols", ""]
        for protocol in protocols:
            lines += protocol.markdown()
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    header = "| protocol | claim | paper | measured | verdict |"
    lines += ["## Claims", "", header, "|---|---|---|---|---|"]
    for c in claims:
        cells = [c.protocol, c.claim, c.paper, c.measured, c.verdict]
        lines.append("| " + " | ".join(s.replace("|", "/") for s in cells) + " |")
    return lines


def _write_summary(path: Path, name: str, quick: bool, seconds: float, histories) -> None:
    """summary.json: the seed-mean final value of every float column of every history."""
    final = {
        label: {
            c: final_mean(h, c)
            for c in h.columns
            if c not in ("method", "seed", "step") and h[c].dtype.kind == "f"
        }
        for label, h in histories.items()
    }
    summary = {"experiment": name, "quick": quick, "seconds": seconds, "final": final}
    path.write_text(json.dumps(summary, indent=2, default=float))

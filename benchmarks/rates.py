"""Measured convergence rates against the theory, on the closed-form quadratic.

For each (solver, regime): run ``--seeds`` vmapped seeds, take the mean over seeds of the error
measure at log-spaced iterations, and fit the log-log slope over the second half of the run
(iterations K/8 .. K). Rates in the papers are upper bounds (up to log factors): a quadratic may
do better, so "measured <= theory" (more negative) is consistent with the theory.

* STABLE (Chen, Sun, Xiao, Yin, AISTATS 2022): strongly convex regime (Theorem 3: E||x_k - x*||^2 =
  O(1/k), steps decaying as k0/(k0+k): the solver's ``regime="strongly-convex"``) and
  nonconvex regime (Theorem 2: constant steps c0/sqrt(K); the
  average of ||grad F(x_k)||^2 over the run is O(K^-1/2), measured across run lengths K).
* F2SA / F3SA (Kwon et al., ICML 2023): E||grad F(x_K)||^2 for the three noise regimes of
  Corollaries 4.2 / 4.4: both noisy (-2/7 / -2/5), outer noise only (-2/5 / -1/2),
  deterministic (-2/3 / -2/3).
* SOBA (Dagreou et al., NeurIPS 2022, Theorem 1): decreasing steps rho_k ~ k^-2/5,
  gamma_k ~ k^-3/5 give E||grad F||^2 = O(log(k) k^-2/5) (the theorem bounds the minimum over
  t <= k; the last iterate is measured).
* SABA (same paper, Theorem 2): constant steps on the finite-sum quadratic give
  1/K sum_{k<K} E||grad F(x_k)||^2 = O(1/K): the running mean over the run (a left Riemann sum
  over the evaluations, every K/64 steps), slope -1.

Writes ``docs/rates.md`` (``--out``) with the measured slope beside the theory's. Run:
``python benchmarks/rates.py [--seeds 10] [--steps 20000]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import warnings
from pathlib import Path

import numpy as np

import bilevel as bl


@dataclasses.dataclass
class Case:
    label: str
    solver: str
    hyper: dict
    noise: str  # "both", "outer", "none"
    measure: str  # history column
    theory: float  # slope of the measure against k
    theory_text: str
    squared: bool = True  # the measure enters squared (||.||^2)
    running: bool = False  # the running mean over iterations 0..k (an average-iterate bound)


def problems():
    det = bl.problems.quadratic()
    sto = bl.problems.quadratic(stochastic=True)
    # f noisy, g exact: the stochastic instance's outer data with the deterministic inner level
    # (same seed, so the same A, B, b, D, e: the generator draws them first)
    outer_only = sto.replace(inner=det.inner, inner_data=None, name=sto.name + ", exact g")
    return {"both": sto, "outer": outer_only, "none": det}


def fit_slope(
    history, column: str, squared: bool, k_min: int, running: bool = False
) -> tuple[float, int]:
    stats = history.groupby("step")[column].apply(
        lambda v: np.mean(np.asarray(v) ** 2) if squared else np.mean(v)
    )
    if running:  # (1/k) sum_{t<k}: left Riemann sum over the evenly spaced evaluations
        spacing = float(stats.index[1] - stats.index[0])
        stats = stats.cumsum().shift(1) * spacing / stats.index.to_numpy(float)
    stats = stats[(stats.index >= k_min) & (stats.index > 0)]
    k, v = np.log(stats.index.to_numpy(float)), np.log(stats.to_numpy(float))
    ok = np.isfinite(v)
    if ok.sum() < 2:
        return float("nan"), int(ok.sum())
    return float(np.polyfit(k[ok], v[ok], 1)[0]), int(ok.sum())


def cases(batch: int) -> list[Case]:
    out = []
    f2sa_theory = {
        "both": (-2 / 7, "-2/7 (Cor. 4.2a)"),
        "outer": (-2 / 5, "-2/5 (Cor. 4.2b)"),
        "none": (-2 / 3, "-2/3 (Cor. 4.2c)"),
    }
    f3sa_theory = {
        "both": (-2 / 5, "-2/5 (Cor. 4.4a)"),
        "outer": (-1 / 2, "-1/2 (Cor. 4.4b)"),
        "none": (-2 / 3, "-2/3 (Cor. 4.4c)"),
    }
    regime = {"both": "stochastic", "outer": "outer-noise", "none": "deterministic"}
    for noise in ("both", "outer", "none"):
        hyper = dict(
            lr_outer=0.05,
            lr_inner=0.1,
            batch_size=None if noise == "none" else batch,
            regime=regime[noise],
            lam0=10.0,
            k0=100.0,
        )
        for label, solver, theory in (("F2SA", "f2sa", f2sa_theory), ("F3SA", "f3sa", f3sa_theory)):
            out.append(
                Case(f"{label}, noise: {noise}", solver, hyper, noise, "grad_norm", *theory[noise])
            )
    out.append(
        Case(
            "STABLE, strongly convex (Thm 3)",
            "stable",
            dict(lr_outer=0.05, lr_inner=0.1, regime="strongly-convex", k0=100.0, batch_size=batch),
            "both",
            "x_err",
            -1.0,
            "-1 (Thm 3: E‖x_k − x*‖² = O(1/k))",
        )
    )
    out.append(
        Case(
            "SOBA, decreasing steps (Thm 1)",
            "soba",
            dict(lr_outer=0.1, lr_inner=0.1, regime="decreasing", k0=100.0, batch_size=batch),
            "both",
            "grad_norm",
            -2 / 5,
            "-2/5 (Thm 1: O(log k · k^-2/5))",
        )
    )
    out.append(
        Case(
            "SABA, constant steps (Thm 2)",
            "saba",
            dict(lr_outer=0.05, lr_inner=0.1, batch_size=batch),
            "both",
            "grad_norm",
            -1.0,
            "-1 (Thm 2: average over the run O(1/K))",
            running=True,
        )
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("docs/rates.md"))
    parser.add_argument("--only", nargs="*", default=None, help="solver names to run")
    args = parser.parse_args()
    probs = problems()
    K = args.steps
    rows = []
    for case in cases(args.batch):
        if args.only and case.solver not in args.only:
            continue
        if case.solver not in bl.solvers.names():
            rows.append((case, None, 0, "solver not registered", 0.0))
            continue
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", bl.DivergenceWarning)
            res = bl.solve(
                probs[case.noise],
                bl.solvers.make(case.solver, **case.hyper),
                steps=K,
                seeds=list(range(args.seeds)),
                eval_every=max(1, K // 64),
                progress=False,
            )
        slope, points = fit_slope(res.history, case.measure, case.squared, K // 8, case.running)
        status = "ok" if res.ok else f"diverged seeds {res.diverged}"
        rows.append((case, slope, points, status, time.perf_counter() - t0))
        print(
            f"{case.label:36s} slope {slope:+.3f}  theory {case.theory:+.3f}  ({status})",
            flush=True,
        )
    stable_nc = nonconvex_stable(probs["both"], args)
    write_report(args, rows, stable_nc)


def nonconvex_stable(problem, args):
    """Theorem 2 protocol: constant steps c0/sqrt(K), average ||grad F||^2 over the run, vs K."""
    if "stable" not in bl.solvers.names() or (args.only and "stable" not in args.only):
        return None
    lengths = [max(250, args.steps // 64 * m) for m in (1, 4, 16)]
    avgs = []
    for K in lengths:
        step = 0.5 / np.sqrt(K)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", bl.DivergenceWarning)
            res = bl.solve(
                problem,
                bl.solvers.make("stable", lr_outer=step, lr_inner=step, batch_size=args.batch),
                steps=K,
                seeds=list(range(args.seeds)),
                eval_every=max(1, K // 50),
                progress=False,
            )
        h = res.history[res.history.step > 0]
        avgs.append(float(np.mean(h.grad_norm.to_numpy() ** 2)))
    slope = float(np.polyfit(np.log(lengths), np.log(avgs), 1)[0])
    print(f"{'STABLE, nonconvex protocol (Thm 2)':36s} slope {slope:+.3f}  theory -0.500")
    return lengths, avgs, slope


def _previous_rows(path: Path) -> dict[str, str]:
    """The result rows of an earlier report, by case label (for ``--only``)."""
    if not path.exists():
        return {}
    labels = {case.label for case in cases(32)}
    rows = [line for line in path.read_text().splitlines() if line.startswith("| ")]
    return {row.split(" | ")[0][2:]: row for row in rows if row.split(" | ")[0][2:] in labels}


_NONCONVEX = "STABLE, nonconvex protocol"


def _notes(old: list[str], stable_nc) -> list[str]:
    """The paragraphs between the table and the analysis: an ``--only`` run keeps the earlier
    report's (``old``; a full run starts afresh), with the STABLE nonconvex line replaced when
    it was rerun."""
    heading = "## Reading the numbers"
    end = old.index(heading) if heading in old else len(old)
    rows = [i for i, line in enumerate(old[:end]) if line.startswith("| ")]
    text = "\n".join(old[rows[-1] + 1 : end]) if rows else ""
    paragraphs = [p.strip("\n") for p in text.split("\n\n") if p.strip()]
    if stable_nc is not None:
        lengths, avgs, slope = stable_nc
        line = (
            f"{_NONCONVEX} (Theorem 2: constant steps 0.5/sqrt(K), average of ||grad F(x_k)||^2 "
            "over the run): "
            + ", ".join(f"K = {k}: {a:.3g}" for k, a in zip(lengths, avgs, strict=True))
            + f"; slope in K {slope:+.3f} (theory -1/2)."
        )
        paragraphs = [line] + [p for p in paragraphs if not p.startswith(_NONCONVEX)]
    return [part for p in paragraphs for part in ("", p)]


def write_report(args, rows, stable_nc) -> None:
    lines = [
        "# Measured convergence rates vs theory",
        "",
        f"Generated by `python benchmarks/rates.py --seeds {args.seeds} --steps {args.steps} "
        f"--batch {args.batch}` on the closed-form quadratic (dx = 10, dy = 50, inner condition "
        "number 10; stochastic instance: 2000 samples per level, noisy gradients, Hessians and "
        "cross derivatives).",
        "",
        "The slope is fitted to log(mean over seeds of the squared measure) against log(k) over "
        f"k in [K/8, K] (K = {args.steps}). Theory slopes are upper bounds up to log factors: a "
        "more negative measured slope is consistent with the theory.",
        "",
        "| case | measure | measured slope | theory | consistent | points | status | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    table = _previous_rows(args.out) if args.only else {}  # --only keeps the other cases' rows
    for case, slope, points, status, secs in rows:
        measure = f"E {case.measure}^2" + (", running mean" if case.running else "")
        shown = "-" if slope is None else f"{slope:+.3f}"
        verdict = "-" if slope is None else ("yes" if slope <= case.theory + 0.05 else "NO")
        table[case.label] = (
            f"| {case.label} | {measure} | {shown} | {case.theory_text} | {verdict} | "
            f"{points} | {status} | {secs:.0f} |"
        )
    order = [case.label for case in cases(args.batch)]
    lines += sorted(table.values(), key=lambda row: order.index(row.split(" | ")[0][2:]))
    old = args.out.read_text().splitlines() if args.out.exists() else []
    lines += _notes(old if args.only else [], stable_nc)
    # keep the hand-written analysis of an earlier report (everything from its heading on)
    analysis = ["", "## Reading the numbers", "", "(to be written after looking at the run)"]
    if "## Reading the numbers" in old:
        analysis = [""] + old[old.index("## Reading the numbers") :]
    lines += analysis
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

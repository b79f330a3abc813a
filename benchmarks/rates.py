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
* IBCG (Abolfazli, Jiang, Mokhtari, Yazdandoost Hamedani, "An Inexact Conditional Gradient
  Method for Constrained Bilevel Optimization"), on the quadratic constrained to the simplex,
  deterministic, float64: its Frank-Wolfe step is set by the horizon K, so its rates are
  measured across K = 250, 1000, 4000, 16000 (``IBCG_HORIZONS``), as STABLE's nonconvex one:
  Theorem 4.1 / Corollary 4.2 (gamma = log K / K): F(x_K) - F* = O(log K / K), F* the minimum
  over the simplex; Theorem 4.3 / Corollary 4.4 (gamma = 1/sqrt(K)): the smallest exact FW gap
  min_{0 <= k <= K-1} G(x_k) = O(K^-1/2).

Writes ``docs/rates.md`` (``--out``) with the measured slope beside the theory's. Run:
``python benchmarks/rates.py [--seeds 10] [--steps 20000]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
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
        res = _quiet_solve(
            probs[case.noise],
            bl.solvers.make(case.solver, **case.hyper),
            K,
            seeds=list(range(args.seeds)),
            eval_every=max(1, K // 64),
        )
        slope, points = fit_slope(res.history, case.measure, case.squared, K // 8, case.running)
        status = "ok" if res.ok else f"diverged seeds {res.diverged}"
        rows.append((case, slope, points, status, time.perf_counter() - t0))
        print(
            f"{case.label:36s} slope {slope:+.3f}  theory {case.theory:+.3f}  ({status})",
            flush=True,
        )
    horizons = [nonconvex_stable(probs["both"], args), *ibcg_rates(args)]
    write_report(args, rows, [h for h in horizons if h is not None])


def _quiet_solve(problem, solver, steps: int, **kwargs):
    """``bl.solve`` without progress output or divergence warnings (a row reports its status)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bl.DivergenceWarning)
        return bl.solve(problem, solver, steps=steps, progress=False, **kwargs)


@dataclasses.dataclass
class Horizons:
    """A rate measured across horizons: one run per horizon K, its final measure, and the
    log-log slope in K. For methods whose steps are set by K (STABLE's nonconvex regime, IBCG),
    where the theorem bounds the end of a run of length K, not the iterates of one long run."""

    label: str  # the note below the table starts with it; a rerun replaces that note
    protocol: str  # the theorem, the steps and the measure, in words
    theory: float  # the theory's slope in K
    theory_text: str
    lengths: list[int] = dataclasses.field(default_factory=list)
    values: list[float] = dataclasses.field(default_factory=list)

    @property
    def slope(self) -> float:
        return float(np.polyfit(np.log(self.lengths), np.log(self.values), 1)[0])

    def note(self) -> str:
        values = ", ".join(
            f"K = {k}: {v:.3g}" for k, v in zip(self.lengths, self.values, strict=True)
        )
        return (
            f"{self.label} ({self.protocol}): {values}; slope in K {self.slope:+.3f} "
            f"(theory {self.theory_text})."
        )


def across_horizons(spec: Horizons, lengths, final: Callable[[int], float]) -> Horizons:
    """``spec`` with ``final(K)``, the measure at the end of a run of horizon K, for each K."""
    result = dataclasses.replace(spec, lengths=list(lengths), values=[final(K) for K in lengths])
    print(f"{spec.label:36s} slope {result.slope:+.3f}  theory {spec.theory:+.3f}", flush=True)
    return result


STABLE_NONCONVEX = Horizons(
    "STABLE, nonconvex protocol",
    "Theorem 2: constant steps 0.5/sqrt(K), average of ||grad F(x_k)||^2 over the run",
    -0.5,
    "-1/2",
)


def nonconvex_stable(problem, args) -> Horizons | None:
    """STABLE (Chen, Sun, Xiao, Yin, AISTATS 2022), Theorem 2: constant steps c0/sqrt(K); the
    average of ||grad F(x_k)||^2 over the run is O(K^-1/2)."""
    if "stable" not in bl.solvers.names() or (args.only and "stable" not in args.only):
        return None

    def average(K: int) -> float:
        step = 0.5 / np.sqrt(K)
        res = _quiet_solve(
            problem,
            bl.solvers.make("stable", lr_outer=step, lr_inner=step, batch_size=args.batch),
            K,
            seeds=list(range(args.seeds)),
            eval_every=max(1, K // 50),
        )
        h = res.history[res.history.step > 0]
        return float(np.mean(h.grad_norm.to_numpy() ** 2))

    lengths = [max(250, args.steps // 64 * m) for m in (1, 4, 16)]
    return across_horizons(STABLE_NONCONVEX, lengths, average)


#: IBCG's horizons K: the last one's run takes about a minute (an exact FW gap every step)
IBCG_HORIZONS = (250, 1000, 4000, 16000)
#: the slope of log K / K against K over ``IBCG_HORIZONS`` (Corollary 4.2's rate, log included)
_LOG_SLOPE = float(np.polyfit(np.log(IBCG_HORIZONS), np.log(np.log(IBCG_HORIZONS)), 1)[0]) - 1
IBCG_CONVEX = Horizons(
    "IBCG, convex rule",
    "Theorem 4.1 / Corollary 4.2: gamma = log K / K, F(x_K) - F* with F* the minimum over the "
    "simplex",
    -1.0,
    f"-1 up to the log factor: log K / K has slope {_LOG_SLOPE:+.3f} over these K",
)
IBCG_NONCONVEX = Horizons(
    "IBCG, nonconvex rule",
    "Theorem 4.3 / Corollary 4.4: gamma = 1/sqrt(K), min over 0 <= k <= K-1 of the exact FW "
    "gap G(x_k)",
    -0.5,
    "-1/2",
)


def simplex_minimum(problem) -> float:
    """F* = min of the exact F over the simplex, by 20000 projected-gradient steps 1/L_F (F is
    strongly convex here: converged to rounding), certified by the projected-gradient map's
    fixed-point residual (as tests/test_ibcg.py's ``x_star``)."""
    ref = problem.reference
    H, c = ref.hessian_F, ref.grad_F(np.zeros(ref.dx))
    L = float(np.linalg.eigvalsh(H)[-1])
    pg = jax.jit(lambda x: problem.x_set.project(x - (H @ x + c) / L))
    x = jax.lax.fori_loop(0, 20000, lambda _, x: pg(x), jnp.asarray(problem.x0))
    assert float(jnp.linalg.norm(x - pg(x))) < 1e-12, "projected gradient did not converge"
    return float(ref.F(np.asarray(x)))


def ibcg_rates(args) -> list[Horizons]:
    """IBCG (Abolfazli, Jiang, Mokhtari, Yazdandoost Hamedani, Algorithm 1) with the paper's
    default steps for the horizon K (``bl.solve`` fills it), deterministic, float64, on the
    quadratic constrained to the simplex from its barycentre (tests/test_ibcg.py's problem):

    * Theorem 4.1 / Corollary 4.2 (l convex, gamma = log K / K): l(x_K) - l* = O(log K / K),
      the last iterate, l* the minimum over the simplex;
    * Theorem 4.3 / Corollary 4.4 (gamma = 1/sqrt(K)): min_{0 <= k <= K-1} G(x_k) = O(K^-1/2),
      G the exact FW gap (history column ``fw_gap``, evaluated at every step).
    """
    if "ibcg" not in bl.solvers.names() or (args.only and "ibcg" not in args.only):
        return []
    with jax.enable_x64(True):
        q = bl.problems.quadratic(dx=10, dy=50)
        problem = q.replace(x_set=bl.sets.Simplex(), x0=jnp.full(10, 0.1))
        F_star = simplex_minimum(problem)

        def last_F_gap(K: int) -> float:
            ibcg = bl.solvers.make("ibcg", gamma_rule="convex")
            res = _quiet_solve(problem, ibcg, K, eval_every=None)
            return float(problem.reference.F(np.asarray(res.x)) - F_star)

        def best_fw_gap(K: int) -> float:
            ibcg = bl.solvers.make("ibcg", gamma_rule="nonconvex")
            h = _quiet_solve(problem, ibcg, K, eval_every=1).history
            return float(h.fw_gap[h.step < K].min())

        return [
            across_horizons(IBCG_CONVEX, IBCG_HORIZONS, last_F_gap),
            across_horizons(IBCG_NONCONVEX, IBCG_HORIZONS, best_fw_gap),
        ]


def _previous_rows(path: Path) -> dict[str, str]:
    """The result rows of an earlier report, by case label (for ``--only``)."""
    if not path.exists():
        return {}
    labels = {case.label for case in cases(32)}
    rows = [line for line in path.read_text().splitlines() if line.startswith("| ")]
    return {row.split(" | ")[0][2:]: row for row in rows if row.split(" | ")[0][2:] in labels}


#: the notes of the rates measured across horizons, in the order they are written
HORIZON_LABELS = tuple(h.label for h in (STABLE_NONCONVEX, IBCG_CONVEX, IBCG_NONCONVEX))


def _horizon_label(paragraph: str) -> str | None:
    """The label of a note written by ``Horizons.note``, else None."""
    return next((lab for lab in HORIZON_LABELS if paragraph.startswith(lab + " (")), None)


def _notes(old: list[str], horizons: list[Horizons]) -> list[str]:
    """The paragraphs between the table and the analysis: an ``--only`` run keeps the earlier
    report's (``old``; a full run starts afresh), with the notes of the rates measured across
    horizons that were rerun replaced. Those notes come first, in ``HORIZON_LABELS`` order."""
    heading = "## Reading the numbers"
    end = old.index(heading) if heading in old else len(old)
    rows = [i for i, line in enumerate(old[:end]) if line.startswith("| ")]
    text = "\n".join(old[rows[-1] + 1 : end]) if rows else ""
    paragraphs = [p.strip("\n") for p in text.split("\n\n") if p.strip()]
    measured = {_horizon_label(p): p for p in paragraphs if _horizon_label(p)}
    measured.update({h.label: h.note() for h in horizons})
    paragraphs = [measured[lab] for lab in HORIZON_LABELS if lab in measured] + [
        p for p in paragraphs if not _horizon_label(p)
    ]
    return [part for p in paragraphs for part in ("", p)]


def write_report(args, rows, horizons: list[Horizons]) -> None:
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
    lines += _notes(old if args.only else [], horizons)
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

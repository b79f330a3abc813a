"""PZOBO paper (Sow, Ji, Liang, NeurIPS 2022) experiments E1, E2, E3 and E5.

* ``pzobo-hyperrep-linear`` (E1, Fig. 2 a-c): linear hyper-representation on synthetic data,
  d = 128 and d = 256, PZOBO vs AID-FP, AID-CG, ITD-R and HOZOG, outer loss vs time, and the
  PZOBO N-sweep. The authors' notebook values are quoted beside ours.
* ``pzobo-hyperrep-2layer`` (E2, Fig. 2 d-f): the two-layer sigmoid representation.
* ``pzobo-deep-hyperrep`` (E3, Fig. 3): LeNet-5 features on (Fashion-)MNIST, PZOBO-S vs
  stochastic AID-FP, AID-CG and stocBiO.
* ``pzobo-l2-hpo`` (E5, Fig. 5): per-feature L2 HPO of a linear classifier on 20 Newsgroups when
  scikit-learn's cache has it, else on the image stand-in (Fashion-MNIST, 784 x 10, or
  scikit-learn digits, 64 x 10, where that is absent too).

Settings follow spec ``pzobo.md`` section 4 (paper App. B.2 and the authors' notebooks): inner
GD with step 0.001 and no warm start (fixed y0 = p0) in E1/E2, Adam as the outer optimiser.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import jax
import numpy as np
import pandas as pd

from bilevel import data
from bilevel.experiments import register
from bilevel.experiments.common import (
    Claim,
    Method,
    final_mean,
    grid_search,
    run_methods,
    time_to_reach,
    write_outputs,
)
from bilevel.problems.hyper_representation import (
    deep_hyper_representation,
    hyper_representation,
    synthetic_hyperrep_data,
)
from bilevel.problems.l2_hpo import l2_hpo_linear

# ---- E1 ----------------------------------------------------------------------------------------
#: notebook values, loss at the last iteration (spec pzobo.md E1 table)
E1_NOTEBOOK = {
    128: {"PZOBO": 0.0185, "AID-FP": 0.0773, "AID-CG": 0.0665, "HOZOG": 16.91},
    256: {"PZOBO": 0.0096, "AID-FP": 0.0451, "AID-CG": 0.1218, "HOZOG": 7.544},
}
E1_SWEEP_NOTEBOOK = {10: 0.0092, 20: 0.0143, 40: 0.0058}
E1_CASES = {128: dict(m=64, d=128, n=500, steps=100), 256: dict(m=128, d=256, n=1000, steps=150)}


def with_unrolled_loss(problem, inner_steps: int, lr_inner: float, *, grad_norm: bool = False):
    """Add ``outer_loss_N`` = f(x, w^N(x)), w^N = N GD steps from y0 (the notebooks' metric).

    The solvers' own ``y`` is the inner iterate of the previous x; the paper plots the loss at
    the current x with a fresh N-step inner solve, which is what this metric computes. With
    ``grad_norm``, also ``grad_norm_N`` = ||d/dx f(x, w^N(x))||: the exact gradient of that
    unrolled objective (autodiff through the N steps), the hypergradient every method of the
    notebook estimates (E2 panel (e)).
    """
    from bilevel.core import oracles
    from bilevel.core.tree import tree_axpy, tree_norm

    base, f, g, y0 = problem.metrics, problem.outer, problem.inner, problem.y0

    def unrolled_loss(x):
        def body(w, _):
            return tree_axpy(-lr_inner, oracles.grad_y(g, x, w, problem.inner_data), w), None

        w_N, _ = jax.lax.scan(body, y0, None, length=inner_steps)
        return f(x, w_N, problem.outer_data)

    def metrics(x, y):
        out = dict(base(x, y)) if base is not None else {}
        if grad_norm:
            out["outer_loss_N"], grad = jax.value_and_grad(unrolled_loss)(x)
            out["grad_norm_N"] = tree_norm(grad)
        else:
            out["outer_loss_N"] = unrolled_loss(x)
        return out

    return problem.replace(metrics=metrics)


#: the authors' code normalises each direction tensor to unit norm (spec 3.4, deviation 1)
CODE_DIRECTIONS = "sphere_unscaled_per_tensor"


def e1_methods(d: int, steps: int, *, N: int = 20, lr_inner: float = 0.001) -> list[Method]:
    common = dict(lr_inner=lr_inner, inner_steps=N, outer_optimizer="adam", warm_start=False)
    zo = dict(smoothing=0.01, directions=CODE_DIRECTIONS)
    aid_cg_lr = 0.01 if d == 256 else 0.05  # notebook: "diverges with 0.05" at d = 256
    every = 5
    return [
        Method("PZOBO", "pzobo", dict(common, **zo, lr_outer=0.05), steps, every),
        Method("AID-FP", "aid-fp", dict(common, lr_outer=0.05, linsolve_steps=N), steps, every),
        Method(
            "AID-CG", "aid-cg", dict(common, lr_outer=aid_cg_lr, linsolve_steps=N), steps, every
        ),
        Method("ITD-R", "itd", dict(common, lr_outer=0.05), steps, every),
        Method("HOZOG", "hozog", dict(common, **zo, lr_outer=0.1), steps, every),
    ]


@register(
    "pzobo-hyperrep-linear",
    "PZOBO (Sow, Ji, Liang, NeurIPS 2022), E1 / Fig. 2a-c",
    "linear hyper-representation, d = 128 and 256: PZOBO vs AID-FP/CG, ITD-R, HOZOG",
    default_seeds=1,
)
def run_e1(out_dir: Path, *, quick: bool, seeds: int, log) -> object:
    t0 = time.perf_counter()
    histories, figures, claims = {}, {}, []
    cases = {128: dict(E1_CASES[128], steps=20)} if quick else E1_CASES
    for d, case in cases.items():
        Xi, Yi, Xo, Yo = synthetic_hyperrep_data("linear", m=case["m"], d=d, n=case["n"], seed=0)
        # starts from seed 1: the data used seed 0, and the same seed would start at H* itself
        problem = hyper_representation(Xi, Yi, Xo, Yo, kind="linear", d=d, gamma=0.1, seed=1)
        base_problem = problem
        problem = with_unrolled_loss(problem, 20, 0.001)
        hists = run_methods(problem, e1_methods(d, case["steps"]), seeds=seeds, log=log)
        for label, h in hists.items():
            histories[f"d={d} {label}"] = h
        figures[f"outer_loss_d{d}"] = hists
        finals = {label: final_mean(h, "outer_loss_N") for label, h in hists.items()}
        claims += judge_e1(d, finals, quick)
        if d == 128:
            sweep_ns = (10,) if quick else (10, 20, 40)  # quick: one N exercises the path
            sweep = [
                Method(
                    f"PZOBO N={n}",
                    "pzobo",
                    dict(
                        lr_inner=0.001,
                        inner_steps=n,
                        outer_optimizer="adam",
                        warm_start=False,
                        lr_outer=0.05,
                        smoothing=0.01,
                        directions=CODE_DIRECTIONS,
                    ),
                    case["steps"],
                    5,
                )
                for n in sweep_ns
            ]
            # each N is judged by its own unrolled loss f(x, w^N(x)), as the notebook plots it
            sweep_hists = {}
            for method in sweep:
                own = with_unrolled_loss(base_problem, method.hyper["inner_steps"], 0.001)
                sweep_hists.update(run_methods(own, [method], seeds=seeds, log=log))
            figures["n_sweep_d128"] = sweep_hists
            for label, h in sweep_hists.items():
                histories[f"d=128 sweep {label}"] = h
            got = {n: final_mean(sweep_hists[f"PZOBO N={n}"], "outer_loss_N") for n in sweep_ns}
            spread = max(got.values()) / min(got.values())
            claims.append(
                Claim(
                    "(c) convergence is not very sensitive to N",
                    "notebook, loss at it. 99: N=10 0.0092, N=20 0.0143, N=40 0.0058",
                    ", ".join(f"N={n} {v:.4g}" for n, v in got.items())
                    + f" (max/min {spread:.2f}; each at its own N)",
                    _verdict(quick, spread < 10),
                )
            )
    notes = [
        "Synthetic data exactly as the authors' notebook (Grazzi et al. 2020's process); "
        "no substitute needed.",
        "outer_loss_N is f(x_k, w^N(x_k)) with w^N = 20 GD steps (step 0.001) from the fixed "
        "p0, the notebook's plotted quantity; the notebook ran on a GPU machine, our "
        "times are CPU.",
    ]
    return write_outputs(
        "pzobo-hyperrep-linear",
        Path(out_dir),
        title="PZOBO E1: linear hyper-representation",
        histories=histories,
        claims=claims,
        notes=notes,
        quick=quick,
        seconds=time.perf_counter() - t0,
        metric="outer_loss_N",
        figures=figures,
        setting={
            "N": 20,
            "inner step": 0.001,
            "mu": 0.01,
            "outer": "Adam 0.05 (HOZOG 0.1)",
            "gamma": 0.1,
            "seeds": seeds,
        },
    )


def _verdict(quick: bool, ok: bool) -> str:
    return "n/a (quick run)" if quick else ("reproduced" if ok else "not reproduced")


def judge_e1(d: int, finals: dict[str, float], quick: bool) -> list[Claim]:
    note = E1_NOTEBOOK[d]
    out = []
    order_ok = (
        finals["PZOBO"] < finals["AID-FP"]
        and finals["PZOBO"] < finals["AID-CG"]
        and finals["HOZOG"] > 10 * max(finals["PZOBO"], finals["AID-FP"], finals["AID-CG"])
    )
    out.append(
        Claim(
            f"d={d}: ordering PZOBO < AID-FP, AID-CG; HOZOG far above",
            ", ".join(f"{k} {v}" for k, v in note.items()),
            ", ".join(f"{k} {v:.4g}" for k, v in finals.items()),
            _verdict(quick, order_ok),
        )
    )
    for method, ref in note.items():
        ratio = finals[method] / ref
        out.append(
            Claim(
                f"d={d}: {method} final loss within 3x of the notebook",
                f"{ref}",
                f"{finals[method]:.4g} (ratio {ratio:.2f})",
                _verdict(quick, 1 / 3 <= ratio <= 3),
            )
        )
    return out


# ---- E2 ----------------------------------------------------------------------------------------
E2_NOTEBOOK = {"PZOBO": 2.5e-4, "AID-FP": 1.5e-4, "AID-CG": 0.029, "HOZOG": 26.6}
#: notebook N-sweep (inner step 0.0003), final loss
E2_SWEEP_NOTEBOOK = {5: 8.9e-4, 10: 2.0e-4, 20: 1.8e-4, 50: 3.7e-3}


def e2_problem(quick: bool):
    """E2's problem (the notebook's synthetic two-layer data), its size, and the problem with
    the notebook's metric (the loss after N = 10 GD steps of 0.001 from p0, and its gradient).
    """
    size = (
        dict(m=32, hidden=64, d=32, n=500, steps=20)
        if quick
        else dict(m=256, hidden=512, d=256, n=5000, steps=100)
    )
    Xi, Yi, Xo, Yo = synthetic_hyperrep_data(
        "2layer", m=size["m"], d=size["d"], n=size["n"], hidden=size["hidden"], seed=0
    )
    # starts from seed 1: the data used seed 0, and the same seed would start at the data's
    # own (H1*, H2*, w*), where the loss is the noise level
    base = hyper_representation(
        Xi, Yi, Xo, Yo, kind="2layer", d=size["d"], hidden=size["hidden"], gamma=0.001, seed=1
    )
    return with_unrolled_loss(base, 10, 0.001, grad_norm=True), base, size


@register(
    "pzobo-hyperrep-2layer",
    "PZOBO (Sow, Ji, Liang, NeurIPS 2022), E2 / Fig. 2d-f",
    "two-layer sigmoid hyper-representation: PZOBO vs AID-FP/CG, ITD-R, HOZOG",
    default_seeds=1,
)
def run_e2(out_dir: Path, *, quick: bool, seeds: int, log) -> object:
    t0 = time.perf_counter()
    problem, base_problem, size = e2_problem(quick)
    common = dict(lr_inner=0.001, inner_steps=10, outer_optimizer="adam", warm_start=False)
    steps = size["steps"]
    methods = [
        Method(
            "PZOBO",
            "pzobo",
            dict(common, lr_outer=0.01, smoothing=0.1, directions=CODE_DIRECTIONS),
            steps,
            5,
        ),
        Method("AID-FP", "aid-fp", dict(common, lr_outer=0.01, linsolve_steps=10), steps, 5),
        Method(
            "AID-CG",
            "aid-cg",
            dict(common, lr_outer=0.01, inner_steps=30, linsolve_steps=30),
            steps,
            5,
        ),
        Method("ITD-R", "itd", dict(common, lr_outer=0.01), steps, 5),
        Method(
            "HOZOG",
            "hozog",
            dict(common, lr_outer=0.2, smoothing=0.1, directions=CODE_DIRECTIONS),
            steps,
            5,
        ),
    ]
    hists = run_methods(problem, methods, seeds=seeds, log=log)
    finals = {label: final_mean(h, "outer_loss_N") for label, h in hists.items()}
    claims = [
        Claim(
            "HOZOG does not converge; PZOBO and AID-FP reach ~1e-4",
            ", ".join(f"{k} {v}" for k, v in E2_NOTEBOOK.items()),
            ", ".join(f"{k} {v:.3g}" for k, v in finals.items()),
            _verdict(quick, finals["HOZOG"] > 100 * finals["PZOBO"]),
        )
    ]
    # panel (e): the norm of each method's own hypergradient estimate (what the notebook plots),
    # beside the exact gradient norm of the notebook's objective f(x, w^N(x)) at the same x_k.
    # Criterion fixed before the run: HOZOG's estimate norms (median over the evaluations after
    # step 0) within the notebook's range 1e-4 to 2e-2, widened 3x either side.
    est = {
        k: float(h.loc[h["step"] > 0, "hypergrad_estimate_norm"].median()) for k, h in hists.items()
    }
    exact = {k: final_mean(h, "grad_norm_N") for k, h in hists.items()}
    claims.append(
        Claim(
            "(e) HOZOG's hypergradient estimate is flat and near zero: no descent direction",
            "HOZOG's estimate norm stays around 1e-4 to 2e-2 (notebook)",
            "median estimate norm: "
            + ", ".join(f"{k} {v:.3g}" for k, v in est.items())
            + "; exact ||grad f(x_K, w^N(x_K))|| at the end: "
            + ", ".join(f"{k} {v:.3g}" for k, v in exact.items()),
            _verdict(quick, 1e-4 / 3 <= est["HOZOG"] <= 2e-2 * 3),
        )
    )
    # panel (f): PZOBO-N with the notebook's inner step 0.0003, each N judged by its own
    # unrolled loss f(x, w^N(x)) as the notebook plots it
    sweep_ns = (5,) if quick else tuple(E2_SWEEP_NOTEBOOK)
    sweep_hists = {}
    for n in sweep_ns:
        method = Method(
            f"PZOBO N={n}",
            "pzobo",
            dict(
                common,
                lr_inner=0.0003,
                inner_steps=n,
                lr_outer=0.01,
                smoothing=0.1,
                directions=CODE_DIRECTIONS,
            ),
            steps,
            5,
        )
        own = with_unrolled_loss(base_problem, n, 0.0003)
        sweep_hists.update(run_methods(own, [method], seeds=seeds, log=log))
    sweep_final = {n: final_mean(sweep_hists[f"PZOBO N={n}"], "outer_loss_N") for n in sweep_ns}
    first = sweep_hists[f"PZOBO N={sweep_ns[0]}"]
    start = float(first.loc[first["step"] == 0, "outer_loss_N"].mean())
    claims.append(
        Claim(
            f"(f) PZOBO is insensitive to N: every N ends below 1e-2 (start {start:.3g})",
            ", ".join(f"N={n}: {v}" for n, v in E2_SWEEP_NOTEBOOK.items()),
            ", ".join(f"N={n}: {v:.3g}" for n, v in sweep_final.items()),
            _verdict(quick, all(v < 1e-2 for v in sweep_final.values())),
        )
    )
    figures = {
        "pzobo-hyperrep-2layer": dict(hists),
        # no estimate exists at step 0 (recorded as 0: off a log axis)
        "hypergrad_norm": {k: h[h["step"] > 0] for k, h in hists.items()},
        "hypergrad_norm_exact": dict(hists),
        "n_sweep": sweep_hists,
    }
    for label, h in sweep_hists.items():
        hists[f"sweep {label}"] = h
    notes = [
        "Synthetic data as the authors' notebook."
        + (" QUICK: a much smaller network (32-64-32, n=500)." if quick else "")
    ]
    return write_outputs(
        "pzobo-hyperrep-2layer",
        Path(out_dir),
        title="PZOBO E2: two-layer hyper-representation",
        histories=hists,
        claims=claims,
        notes=notes,
        quick=quick,
        seconds=time.perf_counter() - t0,
        metric="outer_loss_N",
        figures=figures,
        figure_metrics={
            "hypergrad_norm": "hypergrad_estimate_norm",
            "hypergrad_norm_exact": "grad_norm_N",
        },
        setting=dict(
            size,
            N=10,
            mu=0.1,
            outer="Adam 0.01 (HOZOG 0.2)",
            sweep=f"PZOBO N in {sweep_ns}, inner step 0.0003",
        ),
    )


# ---- E3 ----------------------------------------------------------------------------------------
def e3_problem(quick: bool, log=print):
    """E3's problem (LeNet-5 features on (Fashion-)MNIST) and the data note."""
    from bilevel.data.standins import mnist_or_substitute

    loaded = mnist_or_substitute(log)
    img_tr, lab_tr, img_te, lab_te = loaded.arrays()
    # the paper's sizes are MNIST's whole splits; a smaller stand-in gives what it has
    n_in, n_out = (256, 256) if quick else (10000, 60000)
    n_in, n_out = min(n_in, len(lab_te)), min(n_out, len(lab_tr))
    note = loaded.note
    mean, std = img_tr.mean(), img_tr.std()
    problem = deep_hyper_representation(
        (img_te[:n_in] - mean) / std,
        lab_te[:n_in],
        (img_tr[:n_out] - mean) / std,
        lab_tr[:n_out],
        eval_size=100 if quick else 2000,
    )
    return problem, note, n_in, n_out


def e3_methods(quick: bool) -> tuple[list[Method], list[Method], int]:
    """E3's four methods, the PZOBO-S N-sweep runs (panel (c)), and the main N."""
    import optax

    steps, every = (4, 2) if quick else (1000, 50)
    n_steps = 3 if quick else 10  # quick: also shorter inner loops (N = K = 3)
    # the code's outer Adam: lr 0.001, 5e-4 from step 80, 1e-4 from step 180 (spec E3)
    lr_outer = optax.piecewise_constant_schedule(1e-3, {80: 0.5, 180: 0.2})
    common = dict(batch_size=32 if quick else 256, outer_optimizer="adam", lr_outer=lr_outer)

    def pzobo_s(n: int) -> dict:
        return dict(
            common,
            inner_steps=n,
            lr_inner=0.001,
            inner_optimizer="adam",
            warm_start=True,
            smoothing=0.01,
            directions="sphere_unscaled_per_tensor",
        )

    linsolve = dict(common, inner_steps=n_steps, linsolve_steps=n_steps, lr_inner=0.1)
    methods = [
        Method("PZOBO-S", "pzobo-s", pzobo_s(n_steps), steps, every),
        Method("AID-FP", "aid-fp", linsolve, steps, every),
        Method("AID-CG", "aid-cg", linsolve, steps, every),
        Method(
            "stocBiO",
            "stocbio",
            dict(common, inner_steps=n_steps, neumann_steps=min(5, n_steps), lr_inner=0.1),
            steps,
            every,
        ),
    ]
    # panel (c): PZOBO-S with other N (the N = n_steps curve is the main run's)
    sweep_ns = (2,) if quick else (5, 20)
    sweep = [Method(f"PZOBO-S N={n}", "pzobo-s", pzobo_s(n), steps, every) for n in sweep_ns]
    return methods, sweep, n_steps


@register(
    "pzobo-deep-hyperrep",
    "PZOBO (Sow, Ji, Liang, NeurIPS 2022), E3 / Fig. 3",
    "LeNet-5 features on (Fashion-)MNIST: PZOBO-S vs stochastic AID-FP/CG, stocBiO",
    default_seeds=1,
)
def run_e3(out_dir: Path, *, quick: bool, seeds: int, log) -> object:
    t0 = time.perf_counter()
    problem, note, n_in, n_out = e3_problem(quick, log)
    methods, sweep, n_steps = e3_methods(quick)
    setting = {
        "inner data": f"test split, {n_in}",
        "outer data": f"train split, {n_out}",
        "steps": methods[0].steps,
        "inner steps N (and K)": n_steps,
        "outer optimiser": "Adam, lr 1e-3, 5e-4 from step 80, 1e-4 from step 180",
        "N-sweep (PZOBO-S)": ", ".join(
            str(n) for n in sorted([m.hyper["inner_steps"] for m in sweep] + [n_steps])
        ),
        "seeds": seeds,
    }
    run = _E3Outputs(Path(out_dir), methods, sweep, n_steps, note, quick, setting, t0)
    hists: dict = {}
    result = None
    for done, method in enumerate(methods + sweep, start=1):
        hists.update(run_methods(problem, [method], seeds=seeds, log=log))
        # written after every method: a long run stopped part-way keeps what it finished
        result = run.write(hists, done)
    return result


@dataclasses.dataclass(frozen=True)
class _E3Outputs:
    """What E3 writes, rewritten after every finished run (claims need every run they use)."""

    out_dir: Path
    methods: list[Method]
    sweep: list[Method]
    n_steps: int
    note: str
    quick: bool
    setting: dict
    t0: float

    def write(self, hists: dict, done: int):
        """Claims, figures and curves of the ``done`` runs finished so far."""
        methods, sweep, n_steps, quick = self.methods, self.sweep, self.n_steps, self.quick
        total = len(methods) + len(sweep)
        main = {m.label: hists[m.label] for m in methods if m.label in hists}
        acc = {label: final_mean(h, "eval_acc") for label, h in main.items()}
        # a run that diverged keeps its history up to its last finite evaluation: say so
        last = {m.label: int(hists[m.label]["step"].max()) for m in methods if m.label in hists}
        claims = []
        if len(main) == len(methods):
            claims.append(
                Claim(
                    "PZOBO-S reaches the best outer accuracy (MNIST: ~0.98 vs ~0.93 for others)",
                    "PZOBO-S 0.98+, others ~0.93 (MNIST)",
                    ", ".join(
                        f"{m.label} {acc[m.label]:.3f}"
                        + (
                            f" (diverged after step {last[m.label]})"
                            if last[m.label] < m.steps
                            else ""
                        )
                        for m in methods
                    ),
                    _verdict(quick, acc["PZOBO-S"] >= max(acc.values()) - 1e-9),
                )
            )
        n_curves = {m.label: hists[m.label] for m in sweep if m.label in hists}
        if len(n_curves) == len(sweep) and "PZOBO-S" in main:
            n_curves[f"PZOBO-S N={n_steps}"] = main["PZOBO-S"]
            n_acc = {label: final_mean(h, "eval_acc") for label, h in n_curves.items()}
            spread = max(n_acc.values()) - min(n_acc.values())
            claims.append(
                Claim(
                    "(c) PZOBO-S is insensitive to N (final accuracy within 0.02 across N)",
                    "qualitative (Fig. 3c)",
                    ", ".join(f"{k} {v:.3f}" for k, v in n_acc.items()),
                    _verdict(quick, spread <= 0.02),
                )
            )
        notes = [self.note]
        if done < total:
            notes.insert(
                0,
                f"PARTIAL: {done} of {total} runs finished ({', '.join(hists)}); the command is "
                "still going or was stopped.",
            )
        # panels (b) and (a) of Fig. 3: outer loss and accuracy against time (and samples)
        figures = {"pzobo-deep-hyperrep": main, "accuracy": main}
        if n_curves:
            figures["n_sweep"] = n_curves
        return write_outputs(
            "pzobo-deep-hyperrep",
            self.out_dir,
            title="PZOBO E3: deep hyper-representation (LeNet-5)",
            histories=hists,
            claims=claims,
            notes=notes,
            quick=quick,
            seconds=time.perf_counter() - self.t0,
            metric="eval_loss",
            figures=figures,
            figure_metrics={"accuracy": "eval_acc"},
            linear_figures=("accuracy",),
            setting=self.setting,
        )


# ---- E5 ----------------------------------------------------------------------------------------
def e5_data(quick: bool, log=print) -> tuple[np.ndarray, np.ndarray, int, str]:
    """E5's features, labels, class count and data note: 20 Newsgroups, else an image stand-in.

    The stand-in is the training split of :func:`mnist_or_substitute`'s images, named in the
    note by what was really loaded (Fashion-MNIST here, scikit-learn digits where that is
    absent too). Digits come back from it upsampled to 32x32 for LeNet; a linear model gains
    nothing from 16 copies of each pixel, so E5 pools them back to the 64 original ones.
    """
    words = 2000 if quick else 10000
    try:
        X, y = data.load_20newsgroups(subset="train", n_features=words)
        note = (
            f"20 Newsgroups (scikit-learn cache; the paper's dataset): {len(y)} training "
            f"documents, the {words} most frequent words"
        )
        return np.asarray(X.todense(), np.float64), y, 20, note
    except data.DatasetNotFoundError as err:
        log(f"20 Newsgroups not available; using an image stand-in. {err}")
    from bilevel.data.standins import mnist_or_substitute

    loaded = mnist_or_substitute(log)
    images, labels = loaded.train_images, loaded.train_labels
    if loaded.name == "scikit-learn digits":
        images = data.downsample_images(images, 4)
    X = images.reshape(len(images), -1).astype(np.float64)
    why = (
        f"scikit-learn's cache is ignored (${data.IGNORE_SYSTEM_ENV_VAR}=1)"
        if data.system_data_ignored()
        else "it is not in scikit-learn's cache and cannot be downloaded here"
    )
    note = (
        f"SUBSTITUTE: {loaded.name} ({len(labels)} training images, {X.shape[1]} pixel "
        f"features x 10 classes), a linear classifier with per-feature L2, stands in for 20 "
        f"Newsgroups because {why}."
    )
    return X, labels, 10, note


def e5_problem(quick: bool, log=print):
    """E5's problem, data note and per-split size.

    The paper's 10000 train / validation / test samples fit the stand-ins only when they are
    large: each split gets ``min(requested, len(y) // 3)`` (1257 digits: 419), said in the note.
    """
    X, y, C, note = e5_data(quick, log)
    requested = 1000 if quick else 10000
    n = min(requested, len(y) // 3)
    if n < 1:
        raise ValueError(f"pzobo-l2-hpo: {len(y)} samples cannot make three splits.")
    if n < requested:
        note += (
            f" Splits cut to fit: {n} train / {n} validation / {n} test samples "
            f"(requested {requested} each)."
        )
    order = np.random.default_rng(0).permutation(len(y))
    tr, va, te = order[:n], order[n : 2 * n], order[2 * n : 3 * n]
    X_tr, X_va, X_te = data.standardize(X[tr], X[va], X[te])
    problem = l2_hpo_linear(X_tr, y[tr], X_va, y[va], num_classes=C, X_test=X_te, y_test=y[te])
    return problem, note, n


@register(
    "pzobo-l2-hpo",
    "PZOBO (Sow, Ji, Liang, NeurIPS 2022), E5 / Fig. 5",
    "per-feature L2 HPO of a linear classifier: PZOBO vs HOZOG, AID-FP/CG, ITD-R",
    default_seeds=1,
)
def run_e5(out_dir: Path, *, quick: bool, seeds: int, log) -> object:
    t0 = time.perf_counter()
    problem, note, n = e5_problem(quick, log)
    steps, N = (20, 5) if quick else (300, 10)
    # quick: a one-point grid (grid_search then runs nothing: compiles dominate a short run)
    grid = {"lr_outer": [0.1] if quick else [0.005, 0.02, 0.1, 0.5]}
    labels = {
        "PZOBO": ("pzobo", {"smoothing": 0.01, "inner_optimizer": "momentum"}),
        "HOZOG": ("hozog", {"smoothing": 0.01}),
        "AID-FP": ("aid-fp", {}),
        "AID-CG": ("aid-cg", {}),
        "ITD-R": ("itd", {}),
    }
    methods, grids = [], []
    for label, (solver, extra) in labels.items():
        # every method warm-starts its inner model (hypertorch does for AID/ITD; the authors'
        # PZOBO code does in E3): from w = 0 each step, PZOBO and HOZOG reported a 10-step
        # model whose loss hardly depends on x (docs/reproduction.md, E5)
        base = dict(extra, inner_steps=N, warm_start=True, outer_optimizer="adam")
        if solver.startswith("aid"):
            base["linsolve_steps"] = 10
        hyper, table = grid_search(
            problem, solver, base, grid, steps=max(10, steps // 5), metric="val_loss"
        )
        grids.append(table)
        methods.append(Method(label, solver, hyper, steps, max(1, steps // 30)))
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    pd.concat(grids).to_csv(Path(out_dir) / "grid.csv", index=False)
    hists = run_methods(problem, methods, seeds=seeds, log=log)
    claims = judge_e5(hists, quick)
    return write_outputs(
        "pzobo-l2-hpo",
        Path(out_dir),
        title="PZOBO E5: L2 HPO",
        histories=hists,
        claims=claims,
        notes=[note],
        quick=quick,
        seconds=time.perf_counter() - t0,
        metric="val_loss",
        setting={
            "n_train = n_val = n_test": n,
            "N": N,
            "grid lr_outer (grid.csv)": grid["lr_outer"],
            "grid run length": max(10, steps // 5),
        },
    )


def judge_e5(hists: dict, quick: bool) -> list[Claim]:
    """Fig. 5's two statements: PZOBO >= HOZOG, and PZOBO reaches a good loss before AID/ITD.

    "Faster" is measured as the solver time to first reach within 10 % of the lowest seed-mean
    validation loss any method reached in the run.
    """
    acc = {label: final_mean(h, "test_acc") for label, h in hists.items()}
    best = min(float(h.groupby("step").val_loss.mean().min()) for h in hists.values())
    level = 1.1 * best
    reach = {label: time_to_reach(h, "val_loss", level) for label, h in hists.items()}
    others = [label for label in ("AID-FP", "AID-CG", "ITD-R") if label in reach]
    return [
        Claim(
            "PZOBO slightly outperforms HOZOG (test accuracy)",
            "qualitative (Fig. 5)",
            ", ".join(f"{k} {v:.4f}" for k, v in acc.items()),
            _verdict(quick, acc["PZOBO"] >= acc["HOZOG"] - 0.005),
        ),
        Claim(
            "PZOBO converges faster than AID-FP, AID-CG and ITD-R",
            "qualitative (Fig. 5)",
            f"seconds to reach val loss <= {level:.4f} (1.1 x the best in this run): "
            + ", ".join(f"{k} {v:.3g}" for k, v in reach.items()),
            _verdict(quick, all(reach["PZOBO"] < reach[k] for k in others)),
        ),
    ]

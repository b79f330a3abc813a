"""F2OBO paper, Experiment 2 (Sec. 6.2, Table 3): online hyperparameter optimisation,
SOBBO vs SOGD vs SF2OBO on a stream with label noise switched on part-way.

Jia & Chen, "Fully First-Order Algorithms for Online Non-Convex Bilevel Optimization",
arXiv:2602.11665, Sec. 6.2 and Appendix A. The stream
(``bl.problems.online_hpo.online_l2_hpo``): per-feature L2 weights lam in [0, 0.1]^d of a
multinomial linear classifier theta (d x C); round t's inner loss is the cross-entropy of a
training batch of 256 plus 1/2 sum_i lam_i ||theta_i||^2, its outer loss the cross-entropy of
a validation batch of 256; 5%, 10% and 15% of the incoming training labels are flipped from
25%, 50% and 75% of the rounds on. The paper's hyperparameters: batch 256, inner lr 0.1, outer
lr 0.001; SOBBO window 50 and K = 5; SOGD momentum 0.9 and linear-system lr 0.1; SF2OBO K = 5,
lam_1 = 5, tau = 1. Every run is a separate ``bl.solve_online`` per seed, so its running time
(the driver's solver seconds: no compilation, no evaluation) is its own; the stream (batches
and label flips) is drawn per seed, so the methods of one seed see the same data.

Data: 20 Newsgroups when a local copy exists (``bl.data.load_newsgroups``: scikit-learn's
cache or LIBSVM's news20), else Fashion-MNIST, else scikit-learn digits; the outputs say which.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from bilevel import data
from bilevel import solvers as _solvers
from bilevel.data.standins import why_no_system_data
from bilevel.drivers.online import solve_online
from bilevel.experiments import register
from bilevel.experiments.common import Claim, write_outputs
from bilevel.experiments.f2obo_online_hpo_paper import (
    PAPER_PROTOCOL,
    PAPER_SLOWDOWN_VS_SOGD,
    PAPER_SPEEDUP_VS_SOBBO,
    PAPER_TABLE3,
)
from bilevel.problems import models as M
from bilevel.problems.online_hpo import PAPER_NOISE, OnlineHPOStream

NAME = "f2obo-online-hpo"
_P = PAPER_PROTOCOL
#: the paper's rounds (10,000) with its batch (256 per level and round). Fashion-MNIST, the
#: offline stand-in, is pooled to 14x14 = 196 features (``fashion_pool=1`` keeps all 784, about
#: 4x the cost): measured on the shared 2-core CPU with the three merged solvers, 1,000 rounds
#: of one seed took 0.9 s (SOBBO), 0.35 s (SOGD), 1.1 s (SF2OBO) of solver time and ~2 s of
#: wall time each with the evaluations, so the full run (3 x 5 x 10,000 rounds) takes ~5 min;
#: 20 Newsgroups keeps its 2,000 most frequent words (d x C = 40,000: ~20x Fashion-MNIST's)
FULL = dict(
    horizon=PAPER_PROTOCOL["rounds T"],
    batch=PAPER_PROTOCOL["batch per round (each level)"],
    words=2000,
    fashion_pool=2,
    checkpoints=100,
)
QUICK = dict(horizon=150, batch=256, words=500, fashion_pool=2, checkpoints=10)
#: settings every method shares (Appendix A): inner lr alpha 0.1, outer lr gamma 0.001
COMMON = dict(lr_inner=_P["lr_inner alpha (all)"], lr_outer=_P["lr_outer gamma (all)"])
#: the methods, in Table 3's order: (solver name, its hyperparameters beyond COMMON). SF2OBO's
#: beta (the y step) is not reported; beta_t = 0.1 / lam_t (lr_lagrangian = alpha) makes the
#: Lagrangian solver y take the same step on g as the g-solver z (with the solver's default
#: alpha / (2 lam_t), y lags z and the penalty gradient lam_t (g(y) - g(z)) pushes every lam_i
#: to the box's top: measured, lam_mean 0.01 -> 0.06 in 1,000 rounds).
METHODS = {
    "SOBBO": ("sobbo", dict(window=_P["SOBBO window w"], inner_steps=_P["SOBBO K"])),
    "SOGD": (
        "sogd",
        dict(momentum=_P["SOGD momentum eta"], lr_linear=_P["SOGD linear-system lr beta"]),
    ),
    "SF2OBO": (
        "sf2obo",
        dict(
            inner_steps=_P["SF2OBO K"],
            lam1=_P["SF2OBO lam_1"],
            tau=_P["SF2OBO tau"],
            lr_lagrangian=_P["lr_inner alpha (all)"],
            # Experiment 2's constant K and batch (the solver's defaults are Corollary 5.2's)
            inner_schedule="constant",
            batch_schedule="constant",
            b=None,
        ),
    ),
}
#: the training loss of Table 3 is read as the mean per-round training loss over this final
#: fraction of the rounds (the paper does not say how it is measured)
LAST_FRACTION = 0.1


@dataclasses.dataclass(frozen=True)
class StreamData:
    """Pools of the stream (train: noisy inner batches; val: clean outer batches), the test
    set, the class count and the data note."""

    X_train: np.ndarray
    y_train: np.ndarray
    X_val: np.ndarray
    y_val: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    name: str
    note: str


def _unit_scale(*arrays):
    """Standardised with the first array's statistics, then divided by sqrt(d): rows of mean
    squared norm 1, like 20 Newsgroups' unit-norm rows, so the paper's inner lr 0.1 is stable
    (the cross-entropy's smoothness is at most 1/2 of the largest eigenvalue of the feature
    covariance, here at most 1)."""
    scaled = data.standardize(*arrays)
    d = arrays[0].shape[1]
    return [np.asarray(a, np.float64) / np.sqrt(d) for a in scaled]


def _stream(X, y, X_test, y_test, *, val_fraction, num_classes, name, describe, scale):
    """The pools: a seeded ``val_fraction`` of (X, y) is the validation pool, the rest the
    training pool; ``scale``: :func:`_unit_scale` with the training pool's statistics;
    ``describe(sizes)`` writes the note from "training pool N, validation pool M, test K"."""
    order = np.random.default_rng(0).permutation(len(y))
    cut = len(y) - int(round(val_fraction * len(y)))
    tr, va = order[:cut], order[cut:]
    arrays = [X[tr], X[va], X_test]
    Xtr, Xva, Xt = _unit_scale(*arrays) if scale else arrays
    sizes = f"training pool {len(tr)}, validation pool {len(va)}, test {len(y_test)}"
    return StreamData(Xtr, y[tr], Xva, y[va], Xt, y_test, num_classes, name, describe(sizes))


def load_stream_data(cfg: dict, log=print) -> StreamData:
    """20 Newsgroups if a local copy exists; else Fashion-MNIST; else scikit-learn digits."""
    try:
        return _newsgroups_stream(cfg)
    except data.DatasetNotFoundError as err:
        log(f"20 Newsgroups not found; using a stand-in. {err}")
    why_news = (
        f"scikit-learn's cache is ignored (${data.IGNORE_SYSTEM_ENV_VAR}=1) and no LIBSVM "
        "news20 files are in $BILEVEL_DATA/libsvm"
        if data.system_data_ignored()
        else "no local copy exists (scikit-learn's cache or LIBSVM's news20 files in "
        "$BILEVEL_DATA/libsvm; see bl.data.load_newsgroups) and it cannot be downloaded here"
    )
    try:
        return _fashion_stream(cfg, why_news)
    except data.DatasetNotFoundError as err:
        log(f"Fashion-MNIST not found either; using scikit-learn digits. {err}")
    return _digits_stream(why_news)


def _newsgroups_stream(cfg: dict) -> StreamData:
    """The paper's data: the ``cfg["words"]`` most frequent training words, unit-norm rows."""
    news = data.load_newsgroups(n_features=cfg["words"])
    return _stream(
        news.X_train.toarray(),
        news.y_train,
        news.X_test.toarray(),
        news.y_test,
        val_fraction=0.2,
        num_classes=20,
        name="20 Newsgroups",
        describe=lambda sizes: (
            f"{news.description}; the paper's dataset. Kept: the {cfg['words']} most "
            f"frequent training words (unit-norm rows); {sizes} (validation: 20% of the "
            "training split)."
        ),
        scale=False,
    )


def _fashion_stream(cfg: dict, why_news: str) -> StreamData:
    """Fashion-MNIST pooled ``cfg["fashion_pool"]`` x itself, standardised and scaled."""
    images, labels = data.load_fashion_mnist("train")
    test_images, test_labels = data.load_fashion_mnist("test")
    pool = cfg["fashion_pool"]
    side = 28 // pool
    return _stream(
        data.downsample_images(images, pool).reshape(len(labels), -1),
        labels,
        data.downsample_images(test_images, pool).reshape(len(test_labels), -1),
        test_labels,
        val_fraction=1 / 6,
        num_classes=10,
        name="Fashion-MNIST",
        describe=lambda sizes: (
            f"SUBSTITUTE: Fashion-MNIST ({side}x{side} = {side * side} pixel features by "
            f"{pool}x{pool} average pooling, standardised and scaled to mean squared row "
            f"norm 1; 10 classes; {sizes}) stands in for 20 Newsgroups because {why_news}."
        ),
        scale=True,
    )


def _digits_stream(why_news: str) -> StreamData:
    """scikit-learn digits: a seeded fifth for testing, the rest for the pools."""
    X, y = data.load_sklearn("digits")
    order = np.random.default_rng(0).permutation(len(y))
    te, rest = order[: len(y) // 5], order[len(y) // 5 :]
    return _stream(
        X[rest],
        y[rest],
        X[te],
        y[te],
        val_fraction=0.25,
        num_classes=10,
        name="scikit-learn digits",
        describe=lambda sizes: (
            f"SUBSTITUTE: scikit-learn digits (64 pixel features, standardised and scaled to "
            f"mean squared row norm 1; 10 classes; {sizes}) stands in for 20 Newsgroups "
            f"because {why_news}, and Fashion-MNIST is not used because "
            f"{why_no_system_data()}."
        ),
        scale=True,
    )


def build_stream(stream: StreamData, cfg: dict) -> OnlineHPOStream:
    return OnlineHPOStream.build(
        stream.X_train,
        stream.y_train,
        stream.X_val,
        stream.y_val,
        num_classes=stream.num_classes,
        horizon=cfg["horizon"],
        batch_size=cfg["batch"],
        val_batch_size=min(cfg["batch"], len(stream.y_val)),
        X_test=stream.X_test,
        y_test=stream.y_test,
        test_batch_size=min(cfg["batch"], len(stream.y_test)),
        name=f"online L2 HPO on {stream.name}",
    )


def make_solvers() -> dict:
    """The methods of Table 3: label -> solver."""
    return {
        label: _solvers.make(name, **COMMON, **hyper) for label, (name, hyper) in METHODS.items()
    }


def _test_accuracy(stream: StreamData):
    X = jnp.asarray(stream.X_test)
    y = jnp.asarray(stream.y_test, jnp.int32)
    return jax.jit(jax.vmap(lambda theta: M.accuracy(X @ theta.astype(X.dtype), y)))


@jax.jit
def _round_losses(X, thetas, batches):
    """The cross-entropy of each round's batch (indices into ``X``, labels) at its theta_t."""

    def one(args):
        theta, batch = args
        return jnp.mean(M.softmax_cross_entropy(X[batch["idx"]] @ theta, batch["y"]))

    return jax.lax.map(one, (thetas.astype(X.dtype), batches), batch_size=100)


def run_one(stream: OnlineHPOStream, solver, seed: int, cfg: dict, test_accuracy):
    """One run on the stream drawn with ``seed``: its history at ``cfg["checkpoints"]`` rounds
    (window means of the per-round metrics, whole-test-set accuracy of the committed theta_t)
    and its Table 3 row."""
    problem = stream.problem(seed)
    T = problem.horizon
    res = solve_online(
        problem, solver, seed=seed, eval_every=min(T, 500), progress=False, regret=None
    )
    h = res.history.reset_index(drop=True)
    done = int(h["round"].max())
    ys = np.asarray(res.ys)[:done]
    # training loss of round t: the cross-entropy of the batch it received, at theta_t
    h["train_loss"] = np.asarray(_round_losses(stream.X, ys, problem.inner_data))[: len(h)]
    stride = T // cfg["checkpoints"]
    ends = np.unique(np.linspace(0, T, cfg["checkpoints"] + 1).astype(int)[1:])
    ends = ends[ends <= done]
    acc = np.asarray(test_accuracy(ys[ends - 1]))
    windows = [h.iloc[max(0, e - stride) : e] for e in ends]
    rows = pd.DataFrame(
        {
            "seed": seed,
            "step": ends,
            "round": ends,
            "samples": h["samples"].to_numpy()[ends - 1],
            "seconds": h["seconds"].to_numpy()[ends - 1],
            "train_loss": [float(w.train_loss.mean()) for w in windows],
            "val_loss": [float(w.outer_loss.mean()) for w in windows],
            "test_acc_batch": [float(w.test_acc_batch.mean()) for w in windows],
            "test_acc": acc,
            "noise": h["noise"].to_numpy()[ends - 1],
            "lam_mean": h["lam_mean"].to_numpy()[ends - 1],
        }
    )
    last = h[h["round"] > T - max(1, int(LAST_FRACTION * T))]
    summary = {
        "seed": seed,
        "rounds": done,
        "training_loss": float(last.train_loss.mean()),
        "test_accuracy": float(acc[-1]) if len(acc) else float("nan"),
        "running_time": float(h["seconds"].iloc[-1]),
        "diverged": bool(res.diverged),
        **per_round_costs(h, done),
    }
    return rows, summary


#: the oracle counts per round reported beside the seconds (issue #35: Table 2 of the F2OBO
#: paper charges SOBBO O(wT) samples, the SOBBO paper none beyond the round's; counts say what
#: each implementation here does, whatever the machine)
COSTS = {
    "grad_per_round": ("grad_f", "grad_g"),
    "hvp_per_round": ("hvp", "cross"),
    "samples_per_round": ("samples",),
}


def per_round_costs(history: pd.DataFrame, rounds: int) -> dict[str, float]:
    """Gradient evaluations (f and g), Hessian / cross products and samples per round, from
    the driver's cumulative counts at the last round played."""
    last = history.iloc[rounds - 1]
    return {
        name: float(sum(last[c] for c in columns)) / max(rounds, 1)
        for name, columns in COSTS.items()
    }


@register(
    NAME,
    "F2OBO (Jia & Chen, arXiv:2602.11665), Sec. 6.2, Table 3",
    "online per-feature L2 HPO under label-noise shifts: SOBBO vs SOGD vs SF2OBO",
    default_seeds=PAPER_PROTOCOL["runs (seeds)"],
)
def run(out_dir: Path, *, quick: bool, seeds: int, log) -> object:
    t_start = time.perf_counter()
    cfg = QUICK if quick else FULL
    stream = load_stream_data(cfg, log)
    hpo = build_stream(stream, cfg)
    log(
        f"{stream.name}: d = {stream.X_train.shape[1]}, C = {stream.num_classes}, "
        f"T = {cfg['horizon']}, {seeds} seeds"
    )
    methods = make_solvers()
    accuracy = _test_accuracy(stream)
    histories, summaries = {}, []
    for label, solver in methods.items():
        t0 = time.perf_counter()
        parts = []
        for seed in range(seeds):
            rows, summary = run_one(hpo, solver, seed, cfg, accuracy)
            rows.insert(0, "method", label)
            parts.append(rows)
            summaries.append({"method": label, **summary})
        histories[label] = pd.concat(parts, ignore_index=True)
        log(
            f"  {label}: {cfg['horizon']} rounds x {seeds} seeds in "
            f"{time.perf_counter() - t0:.1f} s"
        )
    table = table3(pd.DataFrame(summaries), list(histories))
    return _write(
        Path(out_dir),
        cfg,
        quick,
        seeds,
        stream,
        histories,
        summaries,
        table,
        time.perf_counter() - t_start,
    )


def _mean_std(values) -> str:
    values = np.asarray(values, float)
    return f"{values.mean():.4f} ± {values.std(ddof=1) if len(values) > 1 else 0.0:.4f}"


def table3(runs: pd.DataFrame, labels: list[str]) -> pd.DataFrame:
    """Table 3's layout (mean ± std over runs) beside the paper's numbers."""
    rows = []
    for label in METHODS:
        paper = PAPER_TABLE3[label]
        if label in labels:
            r = runs[runs.method == label]
            ours = [_mean_std(r[c]) for c in ("training_loss", "test_accuracy", "running_time")]
            ours += [f"{r[c].mean():.4g}" if c in r else "not recorded" for c in COSTS]
        else:
            ours = ["not run"] * (3 + len(COSTS))
        rows.append(
            {
                "algorithm": label,
                "training loss": ours[0],
                "test accuracy": ours[1],
                "running time (s)": ours[2],
                "gradients / round": ours[3],
                "HVP + cross / round": ours[4],
                "samples / round": ours[5],
                "paper training loss": paper[0],
                "paper test accuracy": paper[1],
                "paper running time": paper[2],
            }
        )
    return pd.DataFrame(rows)


def judge(runs: pd.DataFrame, quick: bool) -> list[Claim]:
    means = runs.groupby("method")[["training_loss", "test_accuracy", "running_time"]].mean()
    verdict = _Verdict(quick, set(means.index))
    claims = _best_claims(means, verdict)
    for other, paper_ratio, what in (
        ("SOBBO", PAPER_SPEEDUP_VS_SOBBO, "faster than SOBBO"),
        ("SOGD", PAPER_SLOWDOWN_VS_SOGD, "slower than SOGD"),
    ):
        claims.append(_time_claim(means, verdict, other, paper_ratio, what))
    if set(COSTS) <= set(runs.columns):  # runs written before the counts were recorded lack them
        claims.append(_cost_claim(runs))
    claims.append(
        Claim(
            "Table 3 absolute numbers",
            "see the table (20 Newsgroups, the authors' hardware)",
            "see the table",
            "recorded (different data/hardware where substituted)",
        )
    )
    return claims


@dataclasses.dataclass(frozen=True)
class _Verdict:
    """A claim's verdict: not judged in a quick run, nor without the methods it needs."""

    quick: bool
    have: set  # the methods that ran

    def __call__(self, ok: bool, needed: set) -> str:
        if self.quick:
            return "n/a (quick run)"
        if not needed <= self.have:
            return f"n/a ({', '.join(sorted(needed - self.have))} not run)"
        return "reproduced" if ok else "not reproduced"


def _best_claims(means: pd.DataFrame, verdict: _Verdict) -> list[Claim]:
    """Table 3: SF2OBO has the lowest training loss and the highest test accuracy."""

    def shown(column: str, fmt: str) -> str:
        return ", ".join(f"{m} {format(means.loc[m, column], fmt)}" for m in means.index)

    everyone = set(METHODS)
    if "SF2OBO" in verdict.have:
        best_loss = means.training_loss.idxmin() == "SF2OBO"
        best_acc = means.test_accuracy.idxmax() == "SF2OBO"
    else:
        best_loss = best_acc = False
    return [
        Claim(
            "SF2OBO has the lowest training loss (Table 3)",
            "SF2OBO 1.2914 < SOBBO 1.3884 < SOGD 2.0910",
            shown("training_loss", ".4f"),
            verdict(best_loss, everyone),
        ),
        Claim(
            "SF2OBO has the highest test accuracy (Table 3)",
            "SF2OBO 0.8003 > SOBBO 0.7979 > SOGD 0.7607",
            shown("test_accuracy", ".4f"),
            verdict(best_acc, everyone),
        ),
    ]


def _cost_claim(runs: pd.DataFrame) -> Claim:
    """The oracle work per round of every method: what the running-time ratios rest on."""
    means = runs.groupby("method")[list(COSTS)].mean()
    shown = "; ".join(
        f"{m}: {row.grad_per_round:.3g} gradients, {row.hvp_per_round:.3g} HVP/cross, "
        f"{row.samples_per_round:.4g} samples"
        for m, row in means.iterrows()
    )
    return Claim(
        "Per-round cost (F2OBO Table 2 charges SOBBO O(wT) samples; the SOBBO paper none "
        "beyond the round's)",
        "SF2OBO first-order only; SOBBO / SOGD use Hessian-vector products",
        shown + " (per round, mean over runs)",
        "recorded (counts, machine-independent)",
    )


def _time_claim(means, verdict: _Verdict, other: str, paper_ratio: float, what: str) -> Claim:
    """Table 3's running-time ratio of SF2OBO to ``other``, in the direction the paper has."""
    needed = {"SF2OBO", other}
    ratio = float("nan")
    if needed <= verdict.have:
        t_f, t_o = means.running_time["SF2OBO"], means.running_time[other]
        ratio = t_o / t_f if other == "SOBBO" else t_f / t_o
    ok = ratio > 1 and paper_ratio / 1.5 <= ratio <= paper_ratio * 1.5
    v = verdict(ok, needed)
    if v == "not reproduced" and ratio > 1:
        v = "partly (same direction, ratio off by more than 1.5x)"
    return Claim(
        f"SF2OBO is about {paper_ratio:.2f}x {what} (running time)",
        f"{paper_ratio:.2f}x (Table 3)",
        f"{ratio:.2f}x (solver seconds, mean over runs; judged: the same direction and "
        "within a factor 1.5 of the paper's ratio)"
        if np.isfinite(ratio)
        else "not measured (needs both methods)",
        v,
    )


def _write(out_dir, cfg, quick, seeds, stream, histories, summaries, table, seconds):
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = pd.DataFrame(summaries)
    runs.to_csv(out_dir / "runs.csv", index=False)
    table.to_csv(out_dir / "table3.csv", index=False)
    setting = {
        "data": stream.name,
        "features d": stream.X_train.shape[1],
        "classes": stream.num_classes,
        "rounds": cfg["horizon"],
        "seeds (runs)": seeds,
        "batch": cfg["batch"],
        "solver options (besides lr_inner, lr_outer)": {k: h for k, (_, h) in METHODS.items()},
    }
    out = write_outputs(
        NAME,
        out_dir,
        title="F2OBO Exp. 2: online L2 HPO (Jia & Chen, Table 3)",
        histories=histories,
        claims=judge(runs, quick) if len(runs) else [],
        notes=make_notes(cfg, quick, stream),
        quick=quick,
        seconds=seconds,
        metric="train_loss",
        figures={"training_loss": histories, "test_accuracy": histories},
        figure_metrics={"training_loss": "train_loss", "test_accuracy": "test_acc"},
        setting=setting,
        logy=False,
        xs=("round",),
        protocols=[PAPER_PROTOCOL],
    )
    _insert_table(out_dir / "claims.md", table)
    return out


def make_notes(cfg: dict, quick: bool, stream: StreamData) -> list[str]:
    T = cfg["horizon"]
    switches = ", ".join(f"{p:.0%} after round {int(f * T)}" for f, p in PAPER_NOISE)
    notes = [stream.note]
    if not quick and T < 10_000:
        notes.append(f"DEVIATION: {T} rounds instead of the paper's 10,000.")
    return notes + [
        f"Stream: {T} rounds; per round a training batch of {cfg['batch']} (labels flipped to "
        f"a random other class with probability 0, then {switches}: the level is replaced at "
        "each switch, not added, our reading of Sec. 6.2's 'injected at iterations "
        "2,500, 5,000 and 7,500') and a clean validation batch of "
        f"{min(cfg['batch'], len(stream.y_val))}, drawn once per seed (run) and the same "
        "for every method; every draw a method makes in round t is that round's whole batch "
        "(batch_size=None: SF2OBO's K inner steps and its hypergradient all use it).",
        "Model: theta (d x C), no bias, theta_1 = 0; lam in Box[0, 0.1]^d from lam_1 = 0.01 "
        "(not given by the paper); g_t also has ridge 1e-4/2 ||theta||^2 (not in the paper) "
        "so that it is strongly convex where lam_i = 0.",
        f"Training loss (Table 3) = mean per-round training cross-entropy (round t's batch, "
        f"noisy labels as received, no regulariser) over the last {LAST_FRACTION:.0%} of the "
        "rounds; test accuracy = the committed theta_T on the whole test set; running time = "
        "the driver's solver seconds of the whole run (no compilation, no evaluation), each "
        "seed run on its own; mean ± std over runs (seeds).",
        "Regret: not computed (regret=None). theta has d x C entries, above the dense inner "
        "solve's 500, and the reference solve (2000 GD steps + 200 CG per round) would cost "
        "about a hundred times the methods' own rounds over the horizon.",
        "Figures: training loss (window means over the rounds between checkpoints) and "
        "whole-test-set accuracy of the committed theta_t at the checkpoints, against the round.",
    ]


def _insert_table(claims_md: Path, table: pd.DataFrame) -> None:
    """Table 3 (this run beside the paper's) as markdown, just before the claims."""
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in table.to_numpy()]
    text = claims_md.read_text()
    table_md = "## Table 3 (this run beside the paper's)\n\n" + "\n".join(lines) + "\n\n"
    claims_md.write_text(text.replace("## Claims\n", table_md + "## Claims\n", 1))

"""Map a solver's step sizes: a grid of (lr_outer, lr_inner) x seeds in one compiled `bl.sweep`.

Task: before comparing methods, a researcher checks how sensitive one is to its two step sizes.
Here SOBA (stochastic, single loop) tunes the per-feature L2 penalties exp(x_j) of a logistic
regression on scikit-learn's breast-cancer data (STABLE's eq. (32) in its unconstrained "exp"
form, `bl.problems.l2_hpo_logistic_dataset`), with minibatches of 32. Every point of a
lr_outer x lr_inner grid runs for several seeds; the whole grid x seeds is one vmapped program,
compiled once, instead of one `bl.solve` per point. The result is a DataFrame (one row per point,
seed and evaluation); the figure is the heat map of the final exact objective F(x) = f(x, y*(x))
(the problem's `F` metric: y*(x) by Newton on the full training data), averaged over the seeds,
with the diverged points marked.

Method: SOBA (Dagréou, Ablin, Vaiter, Moreau, "A framework for bilevel optimization that enables
stochastic and global variance reduction algorithms", NeurIPS 2022); `bl.sweep` (any solver's
numeric hyperparameters can be gridded: step sizes, penalty constants, ...).

Run it: `python examples/sweep_step_sizes.py` (writes `sweep_step_sizes.png` to
`$BILEVEL_EXAMPLES_OUT`, default the current directory). `BILEVEL_EXAMPLES_QUICK=1` runs a
4 x 3 grid with 2 seeds for 100 steps instead of a 7 x 5 grid with 5 seeds for 2000 steps.
"""

import os
import pathlib

import matplotlib
import numpy as np

import bilevel as bl

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

QUICK = os.environ.get("BILEVEL_EXAMPLES_QUICK") == "1"
OUT = pathlib.Path(os.environ.get("BILEVEL_EXAMPLES_OUT", "."))
if QUICK:
    LR_OUTER, LR_INNER, SEEDS, STEPS = [0.1, 1.0, 10.0, 100.0], [0.03, 0.3, 3.0], range(2), 100
    print(
        "quick mode: a 4 x 3 grid with 2 seeds for 100 steps instead of 7 x 5 with 5 seeds "
        "for 2000 steps"
    )
else:
    LR_OUTER = [0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0]
    LR_INNER, SEEDS, STEPS = [0.01, 0.03, 0.1, 0.3, 1.0], range(5), 2000

problem = bl.problems.l2_hpo_logistic_dataset("breast_cancer", form="exp")
df = bl.sweep(
    problem,
    "soba",
    grid={"lr_outer": LR_OUTER, "lr_inner": LR_INNER},
    seeds=SEEDS,
    steps=STEPS,
    eval_every=STEPS // 4,
    batch_size=32,
    progress=False,
)
start = df[df.step == 0]["F"].mean()
final = df[df.step == df.step.max()]
# a diverged point-seed keeps its rows up to its last finite evaluation only
diverged = {(d["lr_outer"], d["lr_inner"]) for d in df.attrs["diverged"]}
final = final[
    [(lo, li) not in diverged for lo, li in zip(final.lr_outer, final.lr_inner, strict=True)]
]
table = final.groupby(["lr_outer", "lr_inner"])["F"].mean().unstack("lr_inner")
table = table.reindex(index=LR_OUTER, columns=LR_INNER)  # NaN where a seed diverged
print(
    f"{len(LR_OUTER) * len(LR_INNER)} points x {len(SEEDS)} seeds x {STEPS} steps in one "
    f"program; {len(df)} rows, {len(df.attrs['diverged'])} point-seeds diverged"
)
best = table.stack().idxmin()
print(f"best point: lr_outer = {best[0]:g}, lr_inner = {best[1]:g}")
print(f"exact objective F (mean over seeds): {start:.4f} -> {table.stack().min():.4f}")
acc = final.groupby(["lr_outer", "lr_inner"])["val_acc"].mean()[best]
print(f"validation accuracy at the best point: {acc:.3f}")
print("final F by lr_outer (rows) and lr_inner (columns), NaN = a seed diverged:")
print(table.to_string(float_format=lambda v: f"{v:.4f}"))

# ---- figure -------------------------------------------------------------------------------------
fig, ax = plt.subplots(figsize=(5.5, 4))
ax.set_facecolor("lightgray")  # the diverged points (NaN)
values = table.to_numpy()
middle = np.nanmean([np.nanmin(values), np.nanmax(values)])
im = ax.imshow(values, cmap="viridis_r", origin="lower")
ax.set_xticks(range(len(LR_INNER)), [f"{v:g}" for v in table.columns])
ax.set_yticks(range(len(LR_OUTER)), [f"{v:g}" for v in table.index])
ax.set_xlabel("lr_inner")
ax.set_ylabel("lr_outer")
for i, lo in enumerate(table.index):
    for j, li in enumerate(table.columns):
        text = "div." if (lo, li) in diverged else f"{values[i, j]:.3f}"  # any seed diverged
        dark = np.isnan(values[i, j]) or values[i, j] < middle  # yellow or gray: black text
        ax.text(j, i, text, ha="center", va="center", fontsize=7, color="k" if dark else "w")
fig.colorbar(im, ax=ax, label=f"F(x) after {STEPS} steps (mean of {len(SEEDS)} seeds)")
ax.set_title("SOBA on breast cancer: step-size map", fontsize=10)
fig.tight_layout()
fig.savefig(OUT / "sweep_step_sizes.png", dpi=90)
print(f"figure: {OUT / 'sweep_step_sizes.png'}")

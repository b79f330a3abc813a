"""Tune one ridge penalty per feature on the diabetes data.

Task: a linear regression on scikit-learn's diabetes data (10 clinical features) padded with 20
pure-noise features, trained on 100 patients. One ridge penalty per feature, exp(x_j), is tuned
so that the weights fitted on the training set predict a validation set well:

    min_x  F(x) = mean_val (a^T w*(x) - b)^2
    s.t.   w*(x) = argmin_w  mean_train (a^T w - b)^2 + sum_j exp(x_j) w_j^2

x = log penalties (unconstrained, 30 numbers), w = the regression weights. The inner problem is
strongly convex for every x, so the implicit hypergradient exists and `bl.metrics.hypergradient`
gives it exactly: the script prints its norm at the start and at the end.

Method: AID-CG (approximate implicit differentiation with conjugate gradient; Pedregosa,
"Hyperparameter optimization with approximate gradient", ICML 2016; Ji, Yang, Liang, "Bilevel
optimization: convergence analysis and enhanced design", ICML 2021), full batch, outer step 20
(what `lr_outer="auto"` finds here, given as a number to skip the tuning run). Its inner step
is `lr_inner="auto"`: 1 / L_g at the start, rescaled along the run as the penalties, and with
them L_g, grow.

Run it: `python examples/ridge_penalty_diabetes.py` (writes `ridge_penalty_diabetes.png` to
`$BILEVEL_EXAMPLES_OUT`, default the current directory). `BILEVEL_EXAMPLES_QUICK=1` runs 60
outer steps instead of 1500 (the CI smoke run).
"""

import os
import pathlib

import jax.numpy as jnp
import matplotlib
import numpy as np
from sklearn.datasets import load_diabetes

import bilevel as bl

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

QUICK = os.environ.get("BILEVEL_EXAMPLES_QUICK") == "1"
OUT = pathlib.Path(os.environ.get("BILEVEL_EXAMPLES_OUT", "."))
STEPS = 60 if QUICK else 1500
if QUICK:
    print(f"quick mode: {STEPS} outer steps instead of 1500")

# ---- data: 10 real features + 20 noise features, standardised on the training rows -------------
A, b = load_diabetes(return_X_y=True)
rng = np.random.default_rng(0)
A = np.hstack([A, rng.standard_normal((A.shape[0], 20))])
order = rng.permutation(A.shape[0])
train, val, test = order[:100], order[100:250], order[250:]
mean, std = A[train].mean(0), A[train].std(0)
A = (A - mean) / std
b = (b - b[train].mean()) / b[train].std()
split = {
    name: {"A": jnp.asarray(A[rows], jnp.float32), "b": jnp.asarray(b[rows], jnp.float32)}
    for name, rows in (("train", train), ("val", val), ("test", test))
}
d = A.shape[1]


def mse(w, data):
    return jnp.mean((data["A"] @ w - data["b"]) ** 2)


def inner(x, w, batch):  # g: training loss + one penalty per feature
    return mse(w, batch) + jnp.sum(jnp.exp(x) * w**2)


def outer(x, w, batch):  # f: validation loss
    return mse(w, batch)


problem = bl.BilevelProblem(
    outer=outer,
    inner=inner,
    x0=jnp.full(d, -2.0),  # every penalty exp(-2) = 0.135 at the start
    y0=jnp.zeros(d),
    outer_data=split["val"],
    inner_data=split["train"],
    metrics=lambda x, w: {"test_mse": mse(w, split["test"])},
    name="diabetes-ridge",
)
solver = bl.solvers.make("aid-cg", lr_outer=20.0)  # lr_inner="auto": 1 / L_g, followed
res = bl.solve(problem, solver, steps=STEPS, eval_every=max(STEPS // 30, 1), progress=False)


def ridge_solution(x):  # w*(x) in closed form: (A^T A / n + diag(exp x)) w = A^T b / n
    A_tr, b_tr, n = A[train], b[train], len(train)
    return np.linalg.solve(A_tr.T @ A_tr / n + np.diag(np.exp(x)), A_tr.T @ b_tr / n)


def np_mse(w, rows):
    return np.mean((A[rows] @ w - b[rows]) ** 2)


x0, x = np.asarray(problem.x0), np.asarray(res.x)
g0 = np.linalg.norm(bl.metrics.hypergradient(problem, problem.x0))  # implicit function theorem,
g1 = np.linalg.norm(bl.metrics.hypergradient(problem, res.x, res.y))  # dense: exact to rounding
w0, w1 = ridge_solution(x0), ridge_solution(x)
print(f"exact hypergradient norm: {g0:.4g} -> {g1:.4g}")
print(f"validation MSE of w*(x): {np_mse(w0, val):.4f} -> {np_mse(w1, val):.4f}")
print(f"test MSE of w*(x):       {np_mse(w0, test):.4f} -> {np_mse(w1, test):.4f}")
penalty = np.exp(x)
print(f"median penalty, real features:  {np.median(penalty[:10]):.3g}")
print(f"median penalty, noise features: {np.median(penalty[10:]):.3g}")

# ---- figure -------------------------------------------------------------------------------------
h = res.history
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
ax1.plot(h["step"], h["outer_loss"], label="validation MSE (at the iterate w)")
ax1.plot(h["step"], h["test_mse"], label="test MSE")
ax1.set_xlabel("outer step")
ax1.set_ylabel("mean squared error (standardised)")
ax1.legend()
ax1.set_title("AID-CG on the diabetes data")
colors = ["tab:blue"] * 10 + ["tab:gray"] * 20
ax2.bar(np.arange(d), penalty, color=colors)
ax2.set_yscale("log")
ax2.set_xlabel("feature (blue: diabetes, gray: noise)")
ax2.set_ylabel("learned penalty exp(x_j)")
fig.tight_layout()
fig.savefig(OUT / "ridge_penalty_diabetes.png", dpi=90)
print(f"figure: {OUT / 'ridge_penalty_diabetes.png'}")

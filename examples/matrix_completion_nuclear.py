"""Complete a noisy low-rank matrix on the nuclear-norm ball with IBCG.

Task: recover a rank-5 matrix X_hat from a noisy copy M of which only half the entries are
observed (IBCG paper, eq. (2), Sec. 5.2). The upper level keeps X in the nuclear-norm ball
{||X||_* <= alpha} (the convex surrogate of "low rank"); the lower level denoises the observed
entries with a pseudo-Huber penalty, and X is fitted to the denoised Y:

    min_{||X||_* <= alpha}  sum_{(i,j) observed} (X_ij - Y*_ij(X))^2
    s.t.  Y*(X) = argmin_V  sum_{observed} (V_ij - M_ij)^2 + lam1 R_delta(V) + lam2 ||X - V||_F^2

The problem comes ready-made from `bl.problems.matrix_completion` (its metrics: the paper's
normalized error on the observed entries, and over all entries, which is what completion is
about).

Method: IBCG (Abolfazli, Jiang, Mokhtari, Yazdandoost Hamedani, "An Inexact Conditional Gradient
Method for Constrained Bilevel Optimization", arXiv:2306.02429). It never projects onto the ball
(an SVD per step); its linear minimization oracle needs only the top singular pair of the
hypergradient estimate (`bl.sets.NuclearBall.lmo`, by Lanczos), so every step adds one rank-one
matrix and the iterates stay low-rank combinations.

Run it: `python examples/matrix_completion_nuclear.py` (writes
`matrix_completion_nuclear.png` to `$BILEVEL_EXAMPLES_OUT`, default the current directory).
`BILEVEL_EXAMPLES_QUICK=1` completes a 40 x 40 matrix of rank 3 instead of 150 x 150 of rank 5,
with 100 outer steps instead of 2000.
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
N, RANK, STEPS = (40, 3, 100) if QUICK else (150, 5, 2000)
if QUICK:
    print(
        f"quick mode: a {N} x {N} matrix of rank {RANK} instead of 150 x 150 of rank 5, "
        f"{STEPS} outer steps instead of 2000"
    )

problem = bl.problems.matrix_completion(n=N, rank=RANK, p_observed=0.5, noise=0.5, seed=0)
ref = problem.reference  # the clean X_hat, the observed M and the mask
# g's Hessian in Y is diagonal and does not depend on X: its largest entry L_g is known, so the
# inner step 1 / L_g is given (lr_inner="auto" would estimate it, and follow it along the run)
solver = bl.solvers.make("ibcg", lr_inner=1 / ref.L_g)
res = bl.solve(problem, solver, steps=STEPS, eval_every=STEPS // 20, progress=False)
h = res.history
first, last = h.iloc[0], h.iloc[-1]
sv = np.linalg.svd(np.asarray(res.x), compute_uv=False)
print(
    f"normalized error on the observed entries: {first.normalized_error:.4f} -> "
    f"{last.normalized_error:.4f}"
)
print(
    f"normalized error on all entries: {first.normalized_error_all:.4f} -> "
    f"{last.normalized_error_all:.4f}"
)
print(
    f"nuclear norm of X: {sv.sum():.2f} (radius {ref.radius:.2f}); its top {RANK} singular "
    f"values (the true rank) hold {sv[:RANK].sum() / sv.sum():.1%} of it"
)
X_hat, mask, M = (np.asarray(a) for a in (ref.X_hat, ref.mask, ref.M))
noisy = mask * M
floor = np.sum(mask * (M - X_hat) ** 2) / np.sum(mask * X_hat**2)
print(f"for scale, the observed noisy entries themselves have normalized error {floor:.4f}")

# ---- figure -------------------------------------------------------------------------------------
fig, axes = plt.subplots(1, 4, figsize=(12, 3))
axes[0].semilogy(h["step"], h["normalized_error"], label="observed entries")
axes[0].semilogy(h["step"], h["normalized_error_all"], label="all entries")
axes[0].set_xlabel("outer step")
axes[0].set_title("normalized error", fontsize=10)
axes[0].legend(fontsize=8)
corner = slice(0, min(N, 40))  # the top-left 40 x 40 block, large enough to see the entries
scale = np.abs(X_hat[corner, corner]).max()
for ax, img, title in zip(
    axes[1:],
    (X_hat, noisy, res.x),
    ("clean X_hat", "observed noisy M (0 = missing)", "IBCG's X, completed"),
    strict=True,
):
    ax.imshow(np.asarray(img)[corner, corner], cmap="RdBu", vmin=-scale, vmax=scale)
    ax.set_title(f"{title}\n(top-left {corner.stop} x {corner.stop} block)", fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
fig.tight_layout()
fig.savefig(OUT / "matrix_completion_nuclear.png", dpi=80)
print(f"figure: {OUT / 'matrix_completion_nuclear.png'}")

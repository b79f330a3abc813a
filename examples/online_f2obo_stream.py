"""Tune ridge penalties online, on a stream whose relevant features drift, with F2OBO.

Task: a regression model is refitted on every new batch of a data stream, and one ridge penalty
per feature, exp(x_j), must be chosen before each batch arrives. Which features matter drifts
along the stream (a concept drift: 3 of 12 features carry the signal, and the active ones change
twice), so no fixed penalty is right for the whole stream. Round t (t = 1..T) brings a training
and a validation batch:

    g_t(x, w) = mean_{train_t} (a^T w - b)^2 + sum_j exp(x_j) w_j^2        (inner: fit)
    f_t(x, w) = mean_{val_t} (a^T w - b)^2                                 (outer: validate)

The learner commits x_t (and w_t) before round t is seen, and is judged by the bilevel local
regret sum_t ||G_X(x_t)||^2 (Jia & Chen, eq. (2)), where G_X is the gradient mapping of
F_t(x) = f_t(x, w*_t(x)) on the set X of x (grad F_t itself where x is unconstrained), computed
exactly by `bl.solve_online` (here by a dense inner solve per round).

Method: F2OBO (Jia & Chen, "Fully First-Order Algorithms for Online Non-Convex Bilevel
Optimization", arXiv:2602.11665, Algorithm 1): first-order only, K warm-started inner steps per
round (K from its Theorem 3.1 for the horizon), no second derivatives. The penalties are kept
in [e^-6, e^2] (`bl.sets.Box` on x, so F2OBO takes projected steps). The inner step is left
"auto": 1/L_g of round 1, rescaled by `bl.solve_online` as L_g grows with the penalties (the
round-1 step kept fixed diverges near round 536). The outer step is given (0.5); the
default `lr_outer="auto"` tunes it on the first rounds and reports how in `res.tuning`. The
figure shows each round's regret term: it jumps at each drift and decays as the penalties
follow.

Run it: `python examples/online_f2obo_stream.py` (writes `online_f2obo_stream.png` to
`$BILEVEL_EXAMPLES_OUT`, default the current directory). `BILEVEL_EXAMPLES_QUICK=1` plays 60
rounds instead of 600.
"""

import os
import pathlib

import jax.numpy as jnp
import matplotlib
import numpy as np

import bilevel as bl

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

QUICK = os.environ.get("BILEVEL_EXAMPLES_QUICK") == "1"
OUT = pathlib.Path(os.environ.get("BILEVEL_EXAMPLES_OUT", "."))
T = 60 if QUICK else 600
if QUICK:
    print(f"quick mode: {T} rounds instead of 600")

# ---- the stream: (rounds, samples, ...) arrays, features 0-2 active, then 4-6, then 8-10 ---------
rng = np.random.default_rng(0)
d, batch = 12, 32
phase = np.minimum(np.arange(T) * 3 // T, 2)  # 0, 1, 2 over the three thirds of the stream
w_true = np.zeros((T, d))
for t in range(T):
    w_true[t, 4 * phase[t] : 4 * phase[t] + 3] = 2.0


def draw():
    A = rng.standard_normal((T, batch, d))
    b = np.einsum("tsd,td->ts", A, w_true) + 1.0 * rng.standard_normal((T, batch))
    return {"A": jnp.asarray(A, jnp.float32), "b": jnp.asarray(b, jnp.float32)}


train, val = draw(), draw()


def inner(t, x, w, b):
    return jnp.mean((b["A"] @ w - b["b"]) ** 2) + jnp.sum(jnp.exp(x) * w**2)


def outer(t, x, w, b):
    return jnp.mean((b["A"] @ w - b["b"]) ** 2)


problem = bl.OnlineProblem(
    outer=outer,
    inner=inner,
    horizon=T,
    x0=jnp.zeros(d),  # every penalty 1 at round 1
    y0=jnp.zeros(d),
    x_set=bl.sets.Box(-6.0, 2.0),  # penalties in [e^-6, e^2]: L_g stays below 2 / lr_inner
    outer_data=val,
    inner_data=train,
    name="drifting-ridge-stream",
)
# lr_outer="auto" (the default) tunes the outer step on the first rounds (res.tuning); a number
# skips that tuning run, and is checked against the method's stable bound. lr_inner="auto" (the
# default) is 1 / L_g of round 1, scaled down every 25 rounds as the penalties raise L_g
solver = bl.solvers.make("f2obo", lr_outer=0.5)
res = bl.solve_online(problem, solver, eval_every=T, progress=False)
print(f"F2OBO: {res.solver.inner_steps} inner steps per round (Theorem 3.1's K for T = {T})")
print(f"inner step at the end: {res.solver.lr_inner:.3g} (followed L_g from round 1's)")
print(f"cumulative regret over {T} rounds: {res.regret[-1]:.4g} (oracle: {res.regret_oracle})")
terms = res.regret_terms
tenth = max(T // 10, 1)
print(
    f"regret per round, first tenth -> last tenth: {terms[:tenth].mean():.4g} -> "
    f"{terms[-tenth:].mean():.4g}"
)
loss = res.history["outer_loss"].to_numpy()
print(
    f"validation loss per round, first tenth -> last tenth: {loss[:tenth].mean():.4f} -> "
    f"{loss[-tenth:].mean():.4f}"
)
penalty = np.exp(np.asarray(res.xs))  # (rounds, d): the penalties committed at each round
active = w_true[-1] != 0
print(
    f"mean penalty at the last round: active features {penalty[-1][active].mean():.3g}, "
    f"inactive {penalty[-1][~active].mean():.3g}"
)

# ---- figure -------------------------------------------------------------------------------------
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
ax1.semilogy(np.arange(1, T + 1), terms)
ax1.set_xlabel("round t")
ax1.set_ylabel("||G_X(x_t)||^2 (regret term)")
ax1.set_title("F2OBO: the regret of each round; drifts dotted", fontsize=9)
for cut in (T // 3, 2 * T // 3):
    ax1.axvline(cut, color="gray", ls=":")
im = ax2.imshow(
    np.log10(penalty.T), aspect="auto", cmap="viridis", extent=(0.5, T + 0.5, d - 0.5, -0.5)
)
ax2.set_xlabel("round t")
ax2.set_ylabel("feature j")
ax2.set_title("F2OBO's log10 exp(x_j) (active: 0-2, then 4-6, then 8-10)", fontsize=9)
fig.colorbar(im, ax=ax2)
fig.tight_layout()
fig.savefig(OUT / "online_f2obo_stream.png", dpi=90)
print(f"figure: {OUT / 'online_f2obo_stream.png'}")

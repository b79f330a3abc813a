"""Equinox models as the variables: learn an MLP's features for a ridge-regression head.

Task: bilevel representation learning (the "hyper-representation" of Franceschi et al., ICML
2018, and PZOBO's experiments). An `eqx.nn.MLP` phi (the outer variable) maps a scalar input to
32 features; an `eqx.nn.Linear` head w (the inner variable) is fitted on 40 noisy training
points by ridge regression on those features, which is strongly convex in w for any phi; phi
is trained so that the fitted head predicts 200 validation points well:

    min_phi  mean_val (w*(phi)(phi(a)) - b)^2
    s.t.     w*(phi) = argmin_w  mean_train (w(phi(a)) - b)^2 + 0.01 ||w||^2

Both variables are equinox modules with non-array leaves (the activation functions): only their
float arrays are optimised, `outer` and `inner` receive the whole models (so `phi(a)` works in
them), `bl.solve` returns models, and `bl.metrics.hypergradient` accepts them (its result has
`None` at the constants).

Method: AID-CG (approximate implicit differentiation: inner gradient steps, a conjugate-gradient
solve of the adjoint system; Ji, Yang, Liang, ICML 2021), full batch, with Adam as the outer
optimiser (`outer_optimizer="adam"`, every solver accepts it).

Run it: `python examples/equinox_models.py` (writes `equinox_models.png` to
`$BILEVEL_EXAMPLES_OUT`, default the current directory). `BILEVEL_EXAMPLES_QUICK=1` runs 100
outer steps instead of 1500.
"""

import os
import pathlib

import equinox as eqx
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

import bilevel as bl

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

QUICK = os.environ.get("BILEVEL_EXAMPLES_QUICK") == "1"
OUT = pathlib.Path(os.environ.get("BILEVEL_EXAMPLES_OUT", "."))
STEPS = 100 if QUICK else 1500
if QUICK:
    print(f"quick mode: {STEPS} outer steps instead of 1500")

# ---- data: b = sin(3a) + a^2 / 2 + noise ---------------------------------------------------------
rng = np.random.default_rng(0)


def sample(n):
    a = rng.uniform(-2, 2, (n, 1)).astype(np.float32)
    b = np.sin(3 * a[:, 0]) + 0.5 * a[:, 0] ** 2 + 0.1 * rng.standard_normal(n)
    return {"a": jnp.asarray(a), "b": jnp.asarray(b, jnp.float32)}


train, val = sample(40), sample(200)

k1, k2 = jax.random.split(jax.random.PRNGKey(0))
features = eqx.nn.MLP(in_size=1, out_size=32, width_size=32, depth=2, activation=jnp.tanh, key=k1)
head = eqx.nn.Linear(32, "scalar", key=k2)


def predict(phi, w, a):
    return jax.vmap(lambda row: w(phi(row)))(a)


def inner(phi, w, batch):  # ridge regression of the head on the features
    ridge = sum(jnp.sum(p**2) for p in jax.tree.leaves(eqx.filter(w, eqx.is_array)))
    return jnp.mean((predict(phi, w, batch["a"]) - batch["b"]) ** 2) + 0.01 * ridge


def outer(phi, w, batch):
    return jnp.mean((predict(phi, w, batch["a"]) - batch["b"]) ** 2)


problem = bl.BilevelProblem(
    outer=outer,
    inner=inner,
    x0=features,
    y0=head,
    outer_data=val,
    inner_data=train,
    name="mlp-features",
)
# lr_inner is given: Adam grows the features fast, and with them L_g, which the "auto" inner step
# (1 / L_g, re-estimated every 25 steps) does not follow quickly enough here
solver = bl.solvers.make(
    "aid-cg", outer_optimizer="adam", lr_outer=0.003, lr_inner=0.05, inner_steps=20
)
res = bl.solve(problem, solver, steps=STEPS, eval_every=STEPS // 20, progress=False)
print(f"res.x is a {type(res.x).__name__}, res.y a {type(res.y).__name__}")


grid = jnp.linspace(-2, 2, 200)[:, None]


@eqx.filter_jit  # one compiled program for both points (eqx.filter_jit: the models hold functions)
def report(phi, w):
    """Exact ||grad F(phi)||, and the exact ridge head w*(phi) refitted: its losses, its curve."""
    grad = bl.metrics.hypergradient(problem, phi, w)  # None at the MLP's activation functions
    norm = jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree.leaves(grad)))
    w_star = eqx.combine(bl.metrics.inner_solution(problem, phi, w), w)  # parameters -> a Linear
    return norm, outer(phi, w_star, val), outer(phi, w_star, train), predict(phi, w_star, grid)


start, end = report(features, head), report(res.x, res.y)
print(f"exact hypergradient norm: {start[0]:.4g} -> {end[0]:.4g}")
print(f"validation MSE of the refitted head: {start[1]:.4f} -> {end[1]:.4f}")
print(f"training MSE of the refitted head:   {start[2]:.4f} -> {end[2]:.4f}")

# ---- figure -------------------------------------------------------------------------------------
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
ax1.plot(train["a"][:, 0], train["b"], "k.", label="training points")
ax1.plot(grid[:, 0], start[3], label="random features + ridge")
ax1.plot(grid[:, 0], end[3], label="learned features + ridge")
ax1.legend(fontsize=8)
ax1.set_xlabel("a")
ax2.semilogy(res.history["step"], res.history["outer_loss"])
ax2.set_xlabel("outer step")
ax2.set_ylabel("validation MSE at the iterate")
ax2.set_title("AID-CG + Adam on equinox models", fontsize=10)
fig.tight_layout()
fig.savefig(OUT / "equinox_models.png", dpi=90)
print(f"figure: {OUT / 'equinox_models.png'}")

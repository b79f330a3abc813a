"""Differentiate a whole solver run with `bl.iterate`: learn a solver's step sizes by gradient.

Task: a researcher has a budget of K = 40 outer steps of a bilevel solver and wants the step
sizes that leave the lowest objective F(x_K) = f(x_K, y*(x_K)) after them. `bl.iterate(solver,
problem, state, K)` is the solver's loop as a pure function of pytrees (a `lax.scan` of
`solver.step`, the program `bl.solve` compiles), and a solver is a pytree whose step sizes are
leaves, so `jax.grad` differentiates F(x_K) with respect to (log lr_outer, log lr_inner) through
all K steps and every inner step in them: reverse-mode iterative differentiation (Franceschi,
Donini, Frasconi, Pontil, "Forward and reverse gradient-based hyperparameter optimization",
ICML 2017). The script checks that gradient against a central finite difference, runs Adam on
the log step sizes, and maps the whole landscape with `jax.vmap` over a grid of solvers.

Method: F2SA (Kwon, Kwon, Wright, Nowak, ICML 2023), deterministic, differentiated end to end
by `jax.grad` through `bl.iterate`, on the closed-form quadratic family `bl.problems.quadratic`
(dx = 5, dy = 10, inner condition number 10); y*(x_K) by `bl.metrics.inner_solution`, which is
differentiable too.

Run it: `python examples/unrolled_step_sizes.py` (writes `unrolled_step_sizes.png` to
`$BILEVEL_EXAMPLES_OUT`, default the current directory). `BILEVEL_EXAMPLES_QUICK=1` takes 5
Adam steps instead of 60 and maps the landscape on a 6 x 6 grid instead of 24 x 24.
"""

import dataclasses
import os
import pathlib

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import optax

import bilevel as bl

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

QUICK = os.environ.get("BILEVEL_EXAMPLES_QUICK") == "1"
OUT = pathlib.Path(os.environ.get("BILEVEL_EXAMPLES_OUT", "."))
ADAM_STEPS, GRID = (5, 6) if QUICK else (60, 24)
if QUICK:
    print(
        f"quick mode: {ADAM_STEPS} Adam steps instead of 60, a {GRID} x {GRID} landscape "
        "instead of 24 x 24"
    )
K = 40

problem = bl.problems.quadratic(dx=5, dy=10, cond=10.0)
# bl.iterate takes a resolved solver (every "auto" filled in): bl.solve does this, here we do
solver = bl.solvers.make("f2sa", lr_outer=0.05, lr_inner=0.05).resolve(problem)
state0 = solver.init(problem, jax.random.PRNGKey(0))


def final_objective(log_lrs):
    """F(x_K) after K steps of F2SA with step sizes exp(log_lrs), from the same start."""
    run = dataclasses.replace(solver, lr_outer=jnp.exp(log_lrs[0]), lr_inner=jnp.exp(log_lrs[1]))
    x, _ = run.output(bl.iterate(run, problem, state0, K))
    y_star = bl.metrics.inner_solution(problem, x)  # Newton on g(x, .), differentiable in x
    return problem.outer(x, y_star, problem.outer_data)


value_and_grad = jax.jit(jax.value_and_grad(final_objective))
objective = jax.jit(final_objective)

log_lrs = jnp.log(jnp.array([0.05, 0.05]))
F0, grad = value_and_grad(log_lrs)
h = 1e-2
fd = [(objective(log_lrs + h * e) - objective(log_lrs - h * e)) / (2 * h) for e in jnp.eye(2)]
print(
    f"dF(x_K)/dlog(lr_outer, lr_inner) through {K} unrolled steps: "
    f"{np.asarray(grad).round(5)}; central difference {np.asarray(fd).round(5)}"
)

optimizer = optax.adam(0.1)
opt_state = optimizer.init(log_lrs)
path = [np.asarray(log_lrs)]
for _ in range(ADAM_STEPS):
    value, grad = value_and_grad(log_lrs)
    updates, opt_state = optimizer.update(grad, opt_state)
    log_lrs = optax.apply_updates(log_lrs, updates)
    path.append(np.asarray(log_lrs))
F1 = float(objective(log_lrs))
F_star = float(
    problem.outer(
        problem.reference.x_star, problem.reference.y_star(problem.reference.x_star), None
    )
)
print(f"F(x_K) - F*: {float(F0) - F_star:.4g} -> {F1 - F_star:.4g} after {ADAM_STEPS} Adam steps")
lr_outer, lr_inner = np.exp(np.asarray(log_lrs))
print(f"learned step sizes: lr_outer {lr_outer:.3g}, lr_inner {lr_inner:.3g} (from 0.05, 0.05)")

# ---- the landscape: one vmapped program over a grid of solvers ----------------------------------
outer_grid = np.geomspace(0.01, 1.0, GRID)
inner_grid = np.geomspace(0.01, 0.3, GRID)
lo, li = np.meshgrid(np.log(outer_grid), np.log(inner_grid), indexing="ij")
points = jnp.stack([jnp.asarray(lo.ravel()), jnp.asarray(li.ravel())], axis=1)
landscape = np.asarray(jax.jit(jax.vmap(final_objective))(points)).reshape(GRID, GRID)
gap = np.where(np.isfinite(landscape), landscape - F_star, np.nan)
print(
    f"landscape: {np.isfinite(landscape).sum()} of {GRID * GRID} step-size pairs stay finite; "
    f"best F - F* on the grid {np.nanmin(gap):.4g}"
)

fig, ax = plt.subplots(figsize=(5.5, 4))
im = ax.pcolormesh(
    inner_grid, outer_grid, np.log10(np.clip(gap, 1e-12, 1e3)), cmap="viridis", shading="auto"
)
ax.set_xscale("log")
ax.set_yscale("log")
path = np.exp(np.array(path))
ax.plot(path[:, 1], path[:, 0], "w.-", label="Adam on the unrolled gradient")
ax.plot(path[0, 1], path[0, 0], "wo")
ax.set_xlabel("lr_inner")
ax.set_ylabel("lr_outer")
ax.legend(fontsize=8, loc="lower left")
ax.set_title(f"log10 (F(x_K) - F*) after K = {K} F2SA steps (gray: diverged)", fontsize=9)
ax.set_facecolor("lightgray")
fig.colorbar(im, ax=ax)
fig.tight_layout()
fig.savefig(OUT / "unrolled_step_sizes.png", dpi=90)
print(f"figure: {OUT / 'unrolled_step_sizes.png'}")

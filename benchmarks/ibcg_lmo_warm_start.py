"""IBCG's nuclear-ball LMO, warm-started across steps or cold, on matrix completion 250x250.

IBCG (Abolfazli, Jiang, Mokhtari, Yazdandoost Hamedani; Algorithm 1, line 6) calls the LMO
once per step on F_k. Does the previous step's top singular vector make a Lanczos start good
enough to run fewer ``lanczos_steps`` (``IBCG(lmo_warm_start=True)``, ``NuclearBall.lmo_warm``)?
For each
setting this prints the median time of a jitted step (compilation excluded),
how far each step's vertex is from the exact LMO in value (relative to ``radius sigma_1(F_k)``,
with ``sigma_1`` from a full SVD; step 0 is cold in both modes, so the maximum over
steps >= 1 is printed too), and the final normalized error. It asserts nothing.

Run: ``python benchmarks/ibcg_lmo_warm_start.py [--size 250] [--steps 200] [--lanczos 8 16 48]``.

Measured (summed scaling, 150 steps, 2 shared cores at load ~5.5, so times are rough): the
worst vertex over steps >= 1 is 4.6e-2 / 1.4e-5 / 1.6e-15 / 1.6e-15 relative cold and
1.8e-2 / 1.5e-3 / 1.5e-15 / 1.4e-15 warm at 8 / 12 / 16 / 48 Lanczos steps (step 0, cold in
both modes, is 1.3e-5 at 16). Timed with warm and cold steps interleaved (100 each, median):
1.02 ms cold vs 1.02 ms warm at 16 Lanczos steps, 2.21 vs 2.23 ms at 48; this script's own
sequential timings drift with the load and are not a comparison. No step count is saved: successive
top singular vectors have |cos| ~ 0.01, because the FW step along ``-r u v^T`` removes that
direction from the next F_k.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)

import bilevel as bl  # noqa: E402


def run(problem, solver, steps):
    """``(solver, states 0..K, median seconds per step)``: jitted steps after a warm-up call."""
    solver = solver.with_horizon(steps).resolve(problem)
    step = jax.jit(solver.step)
    states = [solver.init(problem, jax.random.key(0))]
    jax.block_until_ready(step(problem, states[0]))  # compile
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        states.append(jax.block_until_ready(step(problem, states[-1])))
        times.append(time.perf_counter() - t0)
    return solver, states, float(np.median(times))  # the median resists a loaded machine


@jax.jit
def direction(problem, x, y, w_next):
    """F_k = grad_x f(x_k, y_k) - d2g/dxdy(x_k, y_k) w_{k+1} (Algorithm 1, line 5)."""
    grad_x_f = jax.grad(problem.outer)(x, y, None)
    grad_y_g = lambda xx: jax.grad(problem.inner, argnums=1)(xx, y, None)  # noqa: E731
    return grad_x_f - jax.grad(lambda xx: jnp.vdot(grad_y_g(xx), w_next))(x)


def lmo_suboptimality(problem, solver, states) -> np.ndarray:
    """Per step, ``(<F_k, s_k> + radius sigma_1(F_k)) / (radius sigma_1(F_k)) >= 0``: how far
    the vertex the run used, ``s_k = x_k + (x_{k+1} - x_k) / gamma``, is from the exact LMO's
    value ``-radius sigma_1`` (the quantity Frank-Wolfe's analysis needs; the vertex itself is
    ill-defined when sigma_1 ~ sigma_2)."""
    gamma, radius = float(solver.lr_outer), float(problem.x_set.radius)
    out = []
    for now, nxt in zip(states[:-1], states[1:], strict=True):
        F = np.asarray(direction(problem, now.x, now.y, nxt.w))
        vertex = np.asarray(now.x) + (np.asarray(nxt.x) - np.asarray(now.x)) / gamma
        best = radius * np.linalg.svd(F, compute_uv=False)[0]
        out.append((np.vdot(F, vertex) + best) / best)
    return np.asarray(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=250)
    parser.add_argument("--rank", type=int, default=10)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lanczos", type=int, nargs="+", default=[4, 8, 16, 32, 48])
    args = parser.parse_args()
    base = bl.problems.matrix_completion(n=args.size, rank=args.rank)
    ibcg = bl.solvers.make("ibcg", gamma_rule="nonconvex")  # constant gamma: vertices read back
    for warm in (False, True):
        for lanczos in args.lanczos:
            problem = base.replace(x_set=dataclasses.replace(base.x_set, lanczos_steps=lanczos))
            solver, states, seconds = run(problem, replace(ibcg, warm), args.steps)
            gap = lmo_suboptimality(problem, solver, states)
            err = float(problem.reference.normalized_error(states[-1].x))
            print(
                f"{'warm' if warm else 'cold'} lanczos_steps={lanczos:2d}: {1e3 * seconds:6.2f} "
                f"ms/step; LMO rel. suboptimality max {gap.max():.1e} (steps >= 1: "
                f"{gap[1:].max():.1e}), median {np.median(gap):.1e}; normalized error {err:.4f}",
                flush=True,
            )


def replace(solver, warm: bool):
    return dataclasses.replace(solver, lmo_warm_start=warm)


if __name__ == "__main__":
    main()

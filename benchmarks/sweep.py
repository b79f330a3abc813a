"""``bl.sweep`` against the loop it replaces: a 4 x 4 grid x 5 seeds of F2SA.

On a small stochastic quadratic (dx=5, dy=10, 500 samples, batch 32, 2000 steps, eval_every
100): one ``bl.sweep`` (one vmapped program for 16 points x 5 seeds) against the loop of 80
single-seed ``bl.solve`` calls, each wall time from a cold compile cache (compilation included,
as a user would see it). Prints both times and their ratio; nothing passes or fails on time.
Run: ``python benchmarks/sweep.py [--steps 2000]``.

Measured 2026-11-24 (XLA:CPU, 2 shared cores, a test run beside it): sweep 4.75 s, loop 7.48 s,
1.6x, short of the issue's 5x. The sweep is compute-bound (3.3 s of its 4.75 s inside the
compiled chunks, ~20 us per point-step against ~30 us for one unbatched seed): on this CPU the
80-wide batch of tiny (5 x 10) problems does not amortise much; compilation is ~1.5 s.
"""

from __future__ import annotations

import argparse
import itertools
import time

import bilevel as bl
from bilevel import run

GRID = {"lr_outer": [0.002, 0.005, 0.01, 0.02], "lr_inner": [0.02, 0.05, 0.1, 0.2]}
SEEDS = range(5)


def time_sweep(problem, steps: int, every: int) -> float:
    run._COMPILED.clear()
    t0 = time.perf_counter()
    bl.sweep(
        problem,
        "f2sa",
        grid=GRID,
        seeds=SEEDS,
        steps=steps,
        eval_every=every,
        batch_size=32,
        progress=False,
    )
    return time.perf_counter() - t0


def time_loop(problem, steps: int, every: int) -> float:
    run._COMPILED.clear()
    t0 = time.perf_counter()
    for lr_outer, lr_inner in itertools.product(*GRID.values()):
        solver = bl.solvers.make("f2sa", lr_outer=lr_outer, lr_inner=lr_inner, batch_size=32)
        for seed in SEEDS:
            bl.solve(problem, solver, steps=steps, seed=seed, eval_every=every, progress=False)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--eval-every", type=int, default=100)
    args = parser.parse_args()
    problem = bl.problems.quadratic(dx=5, dy=10, stochastic=True, n_samples=500)
    bl.diagnose(problem, warn=False, **run.CONVEXITY_PROBE)  # cached probe: not in either time
    swept = time_sweep(problem, args.steps, args.eval_every)
    looped = time_loop(problem, args.steps, args.eval_every)
    print(f"sweep, 16 points x 5 seeds, one program: {swept:8.2f} s")
    print(f"loop of 80 single-seed bl.solve calls:   {looped:8.2f} s")
    print(f"ratio loop / sweep: {looped / swept:.1f}x")


if __name__ == "__main__":
    main()

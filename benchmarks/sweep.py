"""``bl.sweep`` against the loop it replaces: a 4 x 4 grid x 5 seeds of F2SA.

On a small stochastic quadratic (dx=5, dy=10, 500 samples, batch 32, eval_every 100): one
``bl.sweep`` (one vmapped program for 16 points x 5 seeds) against the loop of 80 single-seed
``bl.solve`` calls, each from a cold compile cache (compilation included, as a user would see
it), at two horizons. Also the sweep again with its programs compiled, so that compile time
and compute can be told apart. Prints times and ratios; nothing passes or fails on time.
Run: ``python benchmarks/sweep.py [--steps 2000 10000]``.

Measured 2026-11-24 (XLA:CPU, 2 cores, single-threaded Eigen as in the tests, quiet machine):

    steps   sweep    (compiled)   loop     loop / sweep
    2000    2.17 s   0.76 s       7.41 s   3.4x
    10000   4.97 s   3.87 s       31.2 s   6.3x

The issue's 5x holds once compilation is amortised, not at 2000 steps: the sweep then spends
~1.3 s of its 2.1 s compiling its three programs (init, chunk, evaluation; the loop compiles
its own once too) and ~0.7 s computing 160,000 point-steps at ~4.2 us each, against ~20 us per
step for a lone seed plus ~40 ms of Python per ``solve`` call. Before the grid points shared
each seed's PRNG key (``grid.grid_axes``: one minibatch gather per seed, the points' oracles on
one shared batch) the sweep took 4.75 s at 2000 steps (1.6x).
"""

from __future__ import annotations

import argparse
import itertools
import time

import bilevel as bl
from bilevel.drivers import programs
from bilevel.drivers.checks import CONVEXITY_PROBE

GRID = {"lr_outer": [0.002, 0.005, 0.01, 0.02], "lr_inner": [0.02, 0.05, 0.1, 0.2]}
SEEDS = range(5)


def time_sweep(problem, steps: int, every: int, cold: bool = True, devices=None) -> float:
    if cold:
        programs.clear_cache()
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
        devices=devices,
    )
    return time.perf_counter() - t0


def time_loop(problem, steps: int, every: int) -> float:
    programs.clear_cache()
    t0 = time.perf_counter()
    for lr_outer, lr_inner in itertools.product(*GRID.values()):
        solver = bl.solvers.make("f2sa", lr_outer=lr_outer, lr_inner=lr_inner, batch_size=32)
        for seed in SEEDS:
            bl.solve(problem, solver, steps=steps, seed=seed, eval_every=every, progress=False)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[2000, 10000])
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument(
        "--devices",
        type=int,
        default=None,
        help="also time the compiled sweep split over this many devices (on CPU run with "
        "XLA_FLAGS=--xla_force_host_platform_device_count=K)",
    )
    args = parser.parse_args()
    problem = bl.problems.quadratic(dx=5, dy=10, stochastic=True, n_samples=500)
    bl.diagnose(problem, warn=False, **CONVEXITY_PROBE)  # cached probe: not in either time
    print("16 points x 5 seeds of F2SA; times in seconds, compilation included")
    print(f"{'steps':>7} {'sweep':>8} {'(compiled)':>11} {'loop of 80':>11} {'loop/sweep':>11}")
    for steps in args.steps:
        swept = time_sweep(problem, steps, args.eval_every)
        warm = time_sweep(problem, steps, args.eval_every, cold=False)
        looped = time_loop(problem, steps, args.eval_every)
        print(f"{steps:>7} {swept:>8.2f} {warm:>11.2f} {looped:>11.2f} {looped / swept:>10.1f}x")
        if args.devices:
            time_sweep(problem, steps, args.eval_every, devices=args.devices)  # compile
            spread = time_sweep(problem, steps, args.eval_every, cold=False, devices=args.devices)
            print(
                f"{'':>7} compiled sweep over {args.devices} devices: {spread:.2f} s, "
                f"one device / {args.devices} devices = {warm / spread:.2f}"
            )


if __name__ == "__main__":
    main()

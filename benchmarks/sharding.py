"""Data parallelism: time per step of ``bl.solve(devices=k)`` against one device.

For each problem and solver, the compiled chunk ``bl.solve`` runs (``eval_every`` steps of a
``lax.scan``) without a mesh, and the same chunk with every minibatch split over ``k`` devices
(``bilevel.core.sharding``); the two are timed alternately and the median per-pair ratio printed
(``timing.paired_times``). On a CPU the devices are forced host devices
(``--xla_force_host_platform_device_count``, set below before jax is imported): they share the
machine's cores, so this measures the cost of the partitioned program and its all-reduces, not
a speed-up; on a machine with several accelerators the same command measures the real thing.

Problems: the stochastic quadratic of ``overhead.py`` (dx 10, dy 50, 2000 samples) and data
hyper-cleaning at Fashion-MNIST's size on random data (20,000 x 784 training rows, 10 classes,
multinomial logistic: dim y 7840, dim x 20,000), at batch 64 and 1024.

Nothing passes or fails on time. Run: ``python benchmarks/sharding.py [--devices 4]``.
"""

from __future__ import annotations

import argparse
import os
import sys

# as many host devices as asked for, before jax is imported (a CPU has one otherwise)
_K = int(sys.argv[sys.argv.index("--devices") + 1]) if "--devices" in sys.argv else 4
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={_K}"
).strip()

import jax  # noqa: E402
from memory import cleaning  # noqa: E402
from timing import paired_times, solver_chunk  # noqa: E402

import bilevel as bl  # noqa: E402
from bilevel.core import sharding as parallel  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=_K)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--solvers", nargs="+", default=["f2sa", "stocbio"])
    args = parser.parse_args()
    mesh = parallel.make_mesh(args.devices, None)
    problems = {
        "quadratic": bl.problems.quadratic(dx=10, dy=50, stochastic=True, n_samples=2000),
        "cleaning": cleaning(20_000, 784, n_val=5_000),
    }
    print(f"{jax.devices()[0].platform}: {args.devices} devices, {os.cpu_count()} cores")
    print(
        f"{'problem':10} {'solver':8} {'batch':>5} {'1 dev us/step':>14} "
        f"{f'{args.devices} dev us/step':>14} {'k/1':>6}"
    )
    for pname, problem in problems.items():
        for batch in (64, 1024):
            for name in args.solvers:
                solver = bl.solvers.make(name, batch_size=batch, lr_outer=0.01, lr_inner=0.01)
                solver = solver.with_horizon(args.steps).resolve(problem)
                one, _ = solver_chunk(problem, solver, args.steps, 1)
                many, _ = solver_chunk(problem, solver, args.steps, 1, mesh)
                t1, tk, ratio = paired_times(one, many, args.repeats)
                us = 1e6 / args.steps
                print(
                    f"{pname:10} {name:8} {batch:5d} {t1 * us:14.0f} {tk * us:14.0f} "
                    f"{1 / ratio:6.2f}"
                )


if __name__ == "__main__":
    main()

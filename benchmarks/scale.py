"""Scaling of time per step with batch size, dimension and number of samples.

For F2SA and stocBiO (the compiled chunk ``bl.solve`` runs, ``overhead.solver_chunk``), on

* the stochastic quadratic (``bl.problems.quadratic(stochastic=True)``, dx 10): dimension is
  dim y, samples are the per-level sample count;
* data hyper-cleaning with the multinomial logistic model (``bl.problems.hyper_cleaning``, 10
  classes, synthetic Gaussian features so that every size exists offline; the values do not
  change the cost): dimension is the feature count d (dim y = 10 (d + 1)), samples are the
  training-set size n (dim x = n, one weight per sample).

Each axis moves one size from the base point (batch 64; quadratic dim y 100, 2000 samples;
hyper-cleaning d 784, n 4000) and prints us/step, the ratio to the axis's first point, and the
least-squares log-log slope of time against size (1.0: linear; 0: flat). The points of one
axis are timed round-robin in one run (best of ``--repeats`` each), so the machine's drift
cancels out of the ratios; nothing passes or fails on time. Sweep throughput against a loop is
``benchmarks/sweep.py``; per-step overhead against the oracle floor is ``benchmarks/overhead.py``.
Run: ``python benchmarks/scale.py [--steps 40] [--repeats 5] [--quick]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import numpy as np
from memory import cleaning
from timing import solver_chunk

import bilevel as bl

SOLVERS = ("f2sa", "stocbio")
#: fixed steps (speed, not accuracy): "auto" would run bl.diagnose for every size
HYPER = {"lr_outer": 0.01, "lr_inner": 0.05}


@dataclass(frozen=True)
class Axis:
    """One scaling axis: ``make(size)`` builds the problem, ``batch(size)`` the batch size."""

    problem: str
    name: str  # what grows
    sizes: Sequence[int]
    make: Callable[[int], bl.BilevelProblem]
    batch: Callable[[int], int]


def quadratic(dy: int = 100, n: int = 2000) -> bl.BilevelProblem:
    return bl.problems.quadratic(10, dy, stochastic=True, n_samples=n)


def axes(quick: bool) -> list[Axis]:
    def pick(full, small):
        return small if quick else full

    def base(_):
        return 64

    def same(size):
        return size

    return [
        Axis(
            "quadratic", "batch", pick((16, 64, 256, 1024), (16, 256)), lambda b: quadratic(), same
        ),
        Axis("quadratic", "dim y", pick((50, 200, 800), (50, 400)), quadratic, base),
        Axis(
            "quadratic",
            "samples",
            pick((1000, 8000, 64000), (1000, 16000)),
            lambda n: quadratic(n=n),
            base,
        ),
        Axis(
            "cleaning",
            "batch",
            pick((16, 64, 256, 1024), (16, 256)),
            lambda b: cleaning(4000, 784),
            same,
        ),
        Axis(
            "cleaning", "d", pick((196, 784, 3136), (196, 1568)), lambda d: cleaning(4000, d), base
        ),
        Axis(
            "cleaning",
            "n",
            pick((1000, 8000, 64000), (1000, 16000)),
            lambda n: cleaning(n, 784),
            base,
        ),
    ]


def round_robin_best(thunks: Sequence[Callable[[], object]], repeats: int) -> list[float]:
    """Best wall time of each thunk, timed in turn ``repeats`` times (drift hits all alike)."""
    for thunk in thunks:
        jax.block_until_ready(thunk())  # compiled already; first touch of buffers
    best = [float("inf")] * len(thunks)
    for _ in range(repeats):
        for i, thunk in enumerate(thunks):
            t0 = time.perf_counter()
            jax.block_until_ready(thunk())
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def loglog_slope(sizes: Sequence[int], times: Sequence[float]) -> float:
    """Least-squares slope of log(time) against log(size)."""
    return float(np.polyfit(np.log(sizes), np.log(times), 1)[0])


def time_axis(axis: Axis, solver_name: str, steps: int, repeats: int) -> list[float]:
    """us/step of ``solver_name`` at every size of ``axis``."""
    thunks = []
    for size in axis.sizes:
        problem = axis.make(size)
        solver = bl.solvers.make(solver_name, batch_size=axis.batch(size), **HYPER)
        thunks.append(solver_chunk(problem, solver.resolve(problem), steps, 1)[0])
    return [t / steps * 1e6 for t in round_robin_best(thunks, repeats)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="steps per timed chunk")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="two sizes per axis")
    parser.add_argument("--solvers", nargs="*", default=list(SOLVERS))
    args = parser.parse_args()
    print(
        f"time per step (us, best of {args.repeats} round-robin timings of {args.steps}-step "
        f"chunks); slope = d log(time) / d log(size); devices: {jax.devices()}"
    )
    header = f"{'problem':10s} {'grows':8s} {'solver':8s} {'sizes -> us/step (x first)':58s} slope"
    print(header)
    print("-" * len(header))
    for axis in axes(args.quick):
        for name in args.solvers:
            us = time_axis(axis, name, args.steps, args.repeats)
            cells = "  ".join(
                f"{s}: {t:,.0f} ({t / us[0]:.2f})" for s, t in zip(axis.sizes, us, strict=True)
            )
            slope = loglog_slope(axis.sizes, us)
            print(f"{axis.problem:10s} {axis.name:8s} {name:8s} {cells:58s} {slope:5.2f}")


if __name__ == "__main__":
    main()

"""Peak memory of an F2SA step on data hyper-cleaning against the problem size.

For each size (training samples n = dim x, features d; dim y = 10 (d + 1), multinomial logistic
model, synthetic Gaussian features: the values do not change the memory), a fresh subprocess
builds the problem, compiles one solver step (``jax.jit(solver.step)``, batch 64) and runs it
10 times, and reports

* XLA's own estimate of the compiled step (``compiled.memory_analysis()``): argument bytes
  (the data, x, y, z and the state), output bytes (the new state) and temp bytes (scratch the
  step needs on top: minibatches, activations, gradients);
* the process's resident memory after importing JAX and bilevel, after building the problem,
  and its peak (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) at the end,

printed beside the size of the data itself. Temp bytes stay flat in n: the x-gradient is one
dense n-vector (4 bytes per sample in float32), never an n x dim_y Jacobian (see
``tests/test_memory.py`` and ``docs/performance_scale.md``). Nothing passes or fails.
Run: ``python benchmarks/memory.py [--solver f2sa] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from typing import NamedTuple

import jax
import numpy as np

import bilevel as bl

MB = 2.0**20


class StepMemory(NamedTuple):
    """XLA's memory estimate of one compiled solver step, in bytes."""

    argument: int
    output: int
    temp: int


def step_memory(problem: bl.BilevelProblem, solver) -> tuple[StepMemory, object, object]:
    """XLA's estimate of ``solver.step``, the compiled step and the initial state."""
    state = solver.init(problem, jax.random.PRNGKey(0))
    compiled = jax.jit(solver.step).lower(problem, state).compile()
    stats = compiled.memory_analysis()
    mem = StepMemory(
        stats.argument_size_in_bytes, stats.output_size_in_bytes, stats.temp_size_in_bytes
    )
    return mem, compiled, state


def data_bytes(problem: bl.BilevelProblem) -> int:
    return sum(a.nbytes for a in jax.tree.leaves((problem.inner_data, problem.outer_data)))


def dim(tree) -> int:
    return sum(a.size for a in jax.tree.leaves(tree))


def rss_bytes() -> int:
    """Current resident set size (Linux /proc; ru_maxrss only gives the peak)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return -1


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kB on Linux


def device_peak_bytes() -> int | None:
    """Peak bytes the default accelerator's allocator has held, or ``None`` on CPU (whose
    arrays live in host memory: the process's peak RSS counts them)."""
    device = jax.devices()[0]
    if device.platform == "cpu":
        return None
    stats = device.memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def cleaning(n: int, d: int, classes: int = 10, n_val: int = 500, **options) -> bl.BilevelProblem:
    """Hyper-cleaning on synthetic Gaussian features, n noisy + ``n_val`` clean samples."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n + n_val, d), dtype=np.float32)
    y = rng.integers(0, classes, n + n_val)
    return bl.problems.hyper_cleaning(X[:n], y[:n], X[n:], y[n:], num_classes=classes, **options)


def child(n: int, d: int, solver_name: str, batch: int, steps: int) -> dict:
    """Measure one size in this (fresh) process; returns the row as a dict."""
    rss_import = rss_bytes()
    problem = cleaning(n, d)
    rss_data = rss_bytes()
    solver = bl.solvers.make(solver_name, lr_outer=0.01, lr_inner=0.05, batch_size=batch)
    mem, step, state = step_memory(problem, solver.resolve(problem))
    for _ in range(steps):
        state = step(problem, state)
    jax.block_until_ready(state)
    return {
        "n": n,
        "d": d,
        "dim_x": dim(problem.x0),
        "dim_y": dim(problem.y0),
        "data": data_bytes(problem),
        **mem._asdict(),
        "rss_import": rss_import,
        "rss_data": rss_data,
        "peak_rss": peak_rss_bytes(),
    }


def measure(n: int, d: int, solver_name: str, batch: int, steps: int) -> dict:
    """:func:`child` in a fresh Python process (so its peak RSS is this size's alone)."""
    cmd = [sys.executable, __file__, "--child", str(n), str(d), "--solver", solver_name]
    cmd += ["--batch", str(batch), "--steps", str(steps)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=os.environ.copy())
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--solver", default="f2sa")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="three sizes")
    parser.add_argument("--child", nargs=2, type=int, metavar=("N", "D"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.solver, args.batch, args.steps)))
        return
    sizes = [(1000, 784), (16000, 784), (4000, 3136)]
    if not args.quick:
        sizes = [(1000, 784), (4000, 784), (16000, 784), (60000, 784), (4000, 196), (4000, 3136)]
    print(
        f"{args.solver}, batch {args.batch}, one compiled step (XLA estimate) and {args.steps} "
        "steps run in a fresh process per size; MB = 2^20 bytes"
    )
    header = (
        f"{'n':>6s} {'d':>5s} {'dim y':>6s} {'data':>7s} | {'XLA arg':>8s} {'out':>6s} "
        f"{'temp':>6s} | {'RSS import':>10s} {'+problem':>9s} {'peak':>7s}"
    )
    print(header)
    print("-" * len(header))
    for n, d in sizes:
        r = measure(n, d, args.solver, args.batch, args.steps)
        print(
            f"{r['n']:6d} {r['d']:5d} {r['dim_y']:6d} {r['data'] / MB:7.1f} | "
            f"{r['argument'] / MB:8.1f} {r['output'] / MB:6.2f} {r['temp'] / MB:6.2f} | "
            f"{r['rss_import'] / MB:10.0f} {r['rss_data'] / MB:9.0f} {r['peak_rss'] / MB:7.0f}"
        )


if __name__ == "__main__":
    main()

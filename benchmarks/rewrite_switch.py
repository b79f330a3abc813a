"""One switch of the CPU rewrite (``bilevel.drivers._xla_cpu.wide_dots``' pass) off / on: time per step.

``--switch`` names the environment variable: ``BILEVEL_SMALL_DOTS`` (small products as
multiply-reduce, ``bilevel.drivers._xla_cpu.small_dots``; the default) or ``BILEVEL_UNROLLED_KEYS`` (key splits and
random bits written out, ``bilevel.drivers._xla_cpu.unrolled_keys``), or another of the switches the
``wide_dots`` docstring lists. For each problem, number of seeds and solver: the compiled chunk
``bl.solve`` runs, built with the switch at 0 and at 1, timed alternately in this one process
(the median per-pair ratio, ``timing.paired_times``); nothing passes or fails on time. The
problems are the quadratic test problem at small sizes (where vmapped seeds make products small
enough to rewrite), a size where small products change nothing, and its stochastic form.

Run: ``python benchmarks/rewrite_switch.py [--switch BILEVEL_UNROLLED_KEYS] [--solvers f2sa
stocbio] [--seeds 1 10]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import bilevel as bl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import paired_times, solver_chunk  # noqa: E402

#: (label, problem, solver settings)
PROBLEMS = {
    "quadratic(2, 5)": (lambda: bl.problems.quadratic(2, 5), {}),
    "quadratic(5, 10)": (lambda: bl.problems.quadratic(5, 10), {}),
    "quadratic(2, 5) stochastic, batch 16": (
        lambda: bl.problems.quadratic(2, 5, stochastic=True, n_samples=500),
        {"batch_size": 16},
    ),
    "quadratic(10, 50)": (lambda: bl.problems.quadratic(10, 50), {}),
}


def chunk(problem, solver, steps, seeds, variable, switch):
    """The compiled chunk with the rewrite ``variable`` set to ``switch`` ("0" off, "1" on)."""
    os.environ[variable] = switch
    bl.run._COMPILED.clear()
    return solver_chunk(problem, solver, steps, seeds)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--switch", default="BILEVEL_SMALL_DOTS", help="environment variable")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--seeds", type=int, nargs="*", default=[10, 1])
    parser.add_argument("--solvers", nargs="*", default=["f2sa", "stocbio", "soba", "pzobo"])
    args = parser.parse_args()
    print(
        f"{args.switch} off / on: us per step, best of {args.repeats}; off/on: median of "
        f"{args.repeats} alternated pairs; {args.steps} steps per timing"
    )
    print(f"{'problem':38s} {'seeds':>5s} {'solver':8s} {'off':>8s} {'on':>8s} {'off/on':>7s}")
    for label, (make, settings) in PROBLEMS.items():
        problem = make()
        for seeds in args.seeds:
            for name in args.solvers:
                solver = bl.solvers.make(name, lr_outer=0.01, lr_inner=0.05, **settings)
                solver = solver.resolve(problem)
                off = chunk(problem, solver, args.steps, seeds, args.switch, "0")
                on = chunk(problem, solver, args.steps, seeds, args.switch, "1")
                t_off, t_on, ratio = paired_times(off, on, args.repeats)
                per_step = 1e6 / args.steps
                print(
                    f"{label:38s} {seeds:5d} {name:8s} {t_off * per_step:8.1f} "
                    f"{t_on * per_step:8.1f} {ratio:7.2f}"
                )
    os.environ.pop(args.switch, None)


if __name__ == "__main__":
    main()

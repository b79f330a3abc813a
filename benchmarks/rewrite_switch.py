"""One of the CPU rewrites (``bl.CpuRewrites``) off / on: time per step.

``--rewrite`` names the option: ``small_dots`` (small products as multiply-reduce; the default),
``unrolled_keys`` (key splits and random bits written out), or another field of
``bl.CpuRewrites`` (``wide_dots``, ``merge_dots``, ``carry_layout``). For each problem, number of
seeds and solver: the compiled chunk ``bl.solve`` runs, compiled with that rewrite off and on
(the others on), timed alternately in this one process (the median per-pair ratio,
``timing.paired_times``); nothing passes or fails on time. The problems are the quadratic test
problem at small sizes (where vmapped seeds make products small enough to rewrite), a size where
small products change nothing, and its stochastic form.

Run: ``python benchmarks/rewrite_switch.py [--rewrite unrolled_keys] [--solvers f2sa
stocbio] [--seeds 1 10]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import bilevel as bl
from bilevel.drivers import programs
from bilevel.drivers.cpu_rewrites import CpuRewrites

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import paired_times  # noqa: E402

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


def chunk(problem, solver, steps, seeds, options: CpuRewrites):
    """The compiled chunk of ``steps`` steps of ``seeds`` seeds under ``options``, as a
    zero-argument thunk running it once (the options are part of the compile cache's key)."""
    state = programs.init_states(solver, problem, list(range(seeds)))
    run = programs.compile_chunk(solver, problem, state, steps, cpu_rewrites=options)
    return lambda: run(problem, state)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [field.name for field in dataclasses.fields(CpuRewrites)]
    parser.add_argument("--rewrite", default="small_dots", choices=names, help="the option")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--seeds", type=int, nargs="*", default=[10, 1])
    parser.add_argument("--solvers", nargs="*", default=["f2sa", "stocbio", "soba", "pzobo"])
    args = parser.parse_args()
    on = CpuRewrites()
    off = on.without(args.rewrite)
    print(
        f"{args.rewrite} off / on: us per step, best of {args.repeats}; off/on: median of "
        f"{args.repeats} alternated pairs; {args.steps} steps per timing"
    )
    print(f"{'problem':38s} {'seeds':>5s} {'solver':8s} {'off':>8s} {'on':>8s} {'off/on':>7s}")
    for label, (make, settings) in PROBLEMS.items():
        problem = make()
        for seeds in args.seeds:
            for name in args.solvers:
                solver = bl.solvers.make(name, lr_outer=0.01, lr_inner=0.05, **settings)
                solver = solver.resolve(problem)
                t_off, t_on, ratio = paired_times(
                    chunk(problem, solver, args.steps, seeds, off),
                    chunk(problem, solver, args.steps, seeds, on),
                    args.repeats,
                )
                per_step = 1e6 / args.steps
                print(
                    f"{label:38s} {seeds:5d} {name:8s} {t_off * per_step:8.1f} "
                    f"{t_on * per_step:8.1f} {ratio:7.2f}"
                )


if __name__ == "__main__":
    main()

"""Per-step speed of this checkout against another revision of the package, in one run.

A restructure must not cost speed. This benchmark checks out ``--base`` (a git revision) into a
temporary worktree and times the same runs with both versions of the package, alternately, each
in a fresh Python process that imports one of them (two versions of one package cannot share a
process). Each process times a solver's per-step cost as ``bl.solve`` reports it (the history's
``seconds``: the compiled chunks alone, compilation and metrics excluded), after one warm-up
solve that compiles. Only the public API of both revisions is used.

Cases (the per-step benchmarks of ``docs/performance.md``): data hyper-cleaning (synthetic,
10,000 x 784, batch 64), the stochastic quadratic (dx=10, dy=50, batch 64), 10 vmapped seeds of
the small quadratic (dx=2, dy=5, batch 16) and a 3-point ``bl.sweep`` of it. Printed: us/step for
each revision and their ratio (this checkout over base; median over ``--repeats`` alternated
pairs). Nothing passes or fails on time.

Run: ``python benchmarks/vs_revision.py --base 4508f4b [--repeats 5] [--solvers f2sa stocbio]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the child: imports whichever package PYTHONPATH points at and prints one JSON number
CHILD = r"""
import json, sys, warnings
import numpy as np
import bilevel as bl

case, name, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
warnings.simplefilter("ignore")

def cleaning():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((10_500, 784), dtype=np.float32)
    y = rng.integers(0, 10, 10_500)
    return bl.problems.hyper_cleaning(X[:10_000], y[:10_000], X[10_000:], y[10_000:],
                                      num_classes=10)

if case == "cleaning":
    problem, batch, seeds = cleaning(), 64, None
    hyper = dict(lr_outer=0.01, lr_inner=0.05)
elif case == "quadratic":
    problem, batch, seeds = bl.problems.quadratic(10, 50, stochastic=True), 64, None
    hyper = dict(lr_outer=0.01, lr_inner=0.05)
else:  # "seeds10" and "sweep": the small quadratic
    problem, batch, seeds = bl.problems.quadratic(2, 5, stochastic=True), 16, list(range(10))
    hyper = dict(lr_outer=0.01, lr_inner=0.05)

def per_step():
    if case == "sweep":
        grid = {"lr_outer": [0.005, 0.01, 0.02]}
        table = bl.sweep(problem, name, grid=grid, seeds=range(3), steps=steps,
                         eval_every=steps, progress=False, batch_size=batch, lr_inner=0.05)
        return float(np.max(table["seconds"])) / steps
    solver = bl.solvers.make(name, batch_size=batch, **hyper)
    kw = dict(seeds=seeds) if seeds is not None else {}
    res = bl.solve(problem, solver, steps=steps, eval_every=steps, progress=False, **kw)
    return float(res.history["seconds"].max()) / steps

per_step()  # compiles
print(json.dumps(min(per_step() for _ in range(2)) * 1e6))
"""


def worktree(base: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix="bilevel-base-"))
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(path), base],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return path


def time_once(src: Path, case: str, name: str, steps: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(src))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, case, name, str(steps)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision to compare against")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--solvers", nargs="*", default=["f2sa", "stocbio", "soba"])
    parser.add_argument("--cases", nargs="*", default=["cleaning", "quadratic", "seeds10", "sweep"])
    args = parser.parse_args()
    base = worktree(args.base)
    try:
        print(
            f"this checkout vs {args.base}: us/step (best of 2 solves per process), ratio = "
            f"median over {args.repeats} alternated pairs of this/base"
        )
        print(f"{'case':10} {'solver':8} {'base':>9} {'this':>9} {'this/base':>10}")
        for case in args.cases:
            for name in args.solvers:
                pairs = [
                    (
                        time_once(base / "src", case, name, args.steps),
                        time_once(ROOT / "src", case, name, args.steps),
                    )
                    for _ in range(args.repeats)
                ]
                ratio = statistics.median(t / b for b, t in pairs)
                b = statistics.median(p[0] for p in pairs)
                t = statistics.median(p[1] for p in pairs)
                print(f"{case:10} {name:8} {b:9.1f} {t:9.1f} {ratio:10.3f}", flush=True)
    finally:
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True
        )


if __name__ == "__main__":
    main()

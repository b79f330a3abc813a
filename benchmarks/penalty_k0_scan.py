"""F2SA / F3SA with their defaults on the problems of ``benchmarks/defaults.py``, over the
offset ``k0`` of their power-law schedules (eq. (7) of Kwon et al. 2023; (9c) for F3SA).

One line per (problem, batch, solver, k0): the exact ``||grad F(x_K)|| / ||grad F(x_0)||``
after ``bl.solve(..., steps=3000)`` with ``lr_outer="auto"`` (tuned), whether it diverged, the
chosen ``lr_outer``. Run: ``python benchmarks/penalty_k0_scan.py PROBLEM BATCH SOLVER K0``
(``BATCH``: ``full`` or a size), or with no arguments for every combination in one process.
"""

from __future__ import annotations

import sys
import warnings

from defaults import DEFAULT_PROBLEMS, PROBLEMS, STEPS, measure

import bilevel as bl

K0S = (100.0, 300.0, 1000.0, 3000.0)


def one(which: str, batch: str, name: str, k0: float) -> str:
    problem = PROBLEMS[which][0]()
    size = None if batch == "full" else int(batch)
    solver = bl.solvers.make(name, batch_size=size, k0=k0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = bl.solve(problem, solver, steps=STEPS, progress=False)
    ratio = measure(problem, res.x) / measure(problem, problem.x0)
    lr = res.tuning.value if res.tuning else float("nan")
    run = "ok" if res.ok else "DIV"
    return f"{which:9s} {batch:>5} {name:5s} {k0:7.0f} {ratio:8.3f} {run:>4} {lr:8.2g}"


if __name__ == "__main__":
    if len(sys.argv) == 5:
        print(one(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])), flush=True)
    else:
        for which in DEFAULT_PROBLEMS:
            b = PROBLEMS[which][1]
            for batch in ("full", str(b)):
                for name in ("f2sa", "f3sa"):
                    for k0 in K0S:
                        print(one(which, batch, name, k0), flush=True)

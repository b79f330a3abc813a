"""What the sampling scheme does to convergence, beside what it does to speed.

On the stochastic quadratic (exact ||grad F||), each solver runs ``--steps`` steps from the same
start under both schemes of ``bilevel.core.sampling`` (``"iid"`` rows, ``"window"`` of consecutive
rows at a random start), over ``--seeds`` seeds in one vmapped program; prints the final
||grad F|| (mean and range over seeds) and the time per step of each scheme (compiled chunk,
alternated pairs). Nothing passes or fails. Run: ``python benchmarks/sampling_effect.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import bilevel as bl
from bilevel.core import sampling

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import paired_times, solver_chunk  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--solvers", nargs="*", default=["stocbio", "f2sa", "soba"])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--n-samples", type=int, default=1024)
    args = parser.parse_args()
    base = bl.problems.quadratic(dx=10, dy=50, stochastic=True, n_samples=args.n_samples)
    start = float(base.metrics(base.x0, base.y0)["grad_norm"])
    print(
        f"{base.name}, {args.n_samples} samples, batch {args.batch}, {args.steps} steps, "
        f"{args.seeds} seeds; ||grad F(x0)|| = {start:.3f}"
    )
    header = f"{'solver':8s} {'scheme':7s} {'final ||grad F|| mean [min, max]':>34s}"
    header += f" {'us/step':>9s}"
    print(header + "\n" + "-" * len(header))
    for name in args.solvers:
        finals, chunks = {}, {}
        for scheme in sampling.SCHEMES:
            problem = base.replace(sampling=scheme)
            solver = bl.solvers.make(name, batch_size=args.batch, lr_outer=0.05)
            res = bl.solve(
                problem, solver, steps=args.steps, seeds=range(args.seeds), progress=False
            )
            finals[scheme] = res.history.groupby("seed")["grad_norm"].last().to_numpy()
            chunks[scheme] = solver_chunk(problem, solver.resolve(problem), 200, 1)[0]
        t_iid, t_win, _ = paired_times(chunks["iid"], chunks["window"], 7)
        for scheme, t in (("iid", t_iid), ("window", t_win)):
            v = finals[scheme]
            print(
                f"{name:8s} {scheme:7s} {np.mean(v):14.4f} [{np.min(v):.4f}, {np.max(v):.4f}]"
                f"{t / 200 * 1e6:11.1f}"
            )


if __name__ == "__main__":
    main()

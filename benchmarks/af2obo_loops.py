"""How long AF2OBO's adaptive loops run on ``f2obo-imbalanced``'s full problem (F2OBO paper,
Sec. 6.1: delta_y = 0.5, delta_z = 0.1, lam_t = 5t, no cap on the loops).

The paper gives no cap; the library's solvers stop each loop at ``max_inner_steps`` (1000, a
safety cap). This runs the first rounds of the full stream (FULL sizes: 64 + 64 images of
16x16 a round, 8-channel 4-block CNN, one seed) with a given cap and prints, per round, the
steps each loop took and the solver seconds, so that the cost of the uncapped protocol can be
estimated before committing a machine to it. Run:
``python benchmarks/af2obo_loops.py ROUNDS_PER_PHASE CAP [LABEL]`` (4 phases, so 4 x ROUNDS
rounds; LABEL another method of the experiment, ``AOBO`` say, default ``AF2OBO``).
"""

from __future__ import annotations

import sys
import time

import bilevel as bl
from bilevel.experiments import f2obo_imbalanced as exp


def main(rounds_per_phase: int, cap: int, label: str = "AF2OBO") -> None:
    cfg = dict(exp.FULL, rounds_per_phase=rounds_per_phase)
    loaded, problem, _ = exp.build(cfg, lambda _: None)
    print(loaded.note.splitlines()[0])
    name, hyper = next((n, h) for lab, n, h in exp.PAPER_METHODS if lab == label)
    solver = bl.solvers.make(name, **exp.with_cap(hyper, cap))
    t0 = time.perf_counter()
    res = exp._solve_seeds(problem, solver, 1)
    wall = time.perf_counter() - t0
    h = res.history
    loops = [c for c in ("inner_iterations", "inner_iterations_y", "inner_iterations_z") if c in h]
    print(h[["round", *loops, "seconds", "outer_loss"]].to_string(index=False))
    steps = h[loops].sum(axis=1).sum()
    longest = h[loops].max(axis=1)
    print(
        f"cap {cap}: {len(h)} rounds, {steps:.0f} loop steps, {wall:.0f} s wall with the "
        f"compilation, {h.seconds.iloc[-1]:.0f} s solver time; a loop at the cap in "
        f"{int((longest >= cap).sum())} rounds"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:4])

"""How long AF2OBO's adaptive loops run on ``f2obo-imbalanced``'s full problem (F2OBO paper,
Sec. 6.1: delta_y = 0.5, delta_z = 0.1, lam_t = 5t, no cap on the loops).

The paper gives no cap; the library's solvers stop each loop at ``max_inner_steps`` (1000, a
safety cap). This runs the first rounds of the full stream (FULL sizes: 64 + 64 images of
16x16 a round, 8-channel 4-block CNN, one seed) with a given cap and prints, per round, the
steps each loop took and the solver seconds, so that the cost of the uncapped protocol can be
estimated before committing a machine to it. Run:
``python benchmarks/af2obo_loops.py ROUNDS_PER_PHASE CAP`` (4 phases, so 4 x ROUNDS rounds).
"""

from __future__ import annotations

import sys
import time

import bilevel as bl
from bilevel.data.standins import mnist_or_substitute
from bilevel.experiments import f2obo_imbalanced as exp
from bilevel.problems import imbalanced_stream


def main(rounds_per_phase: int, cap: int) -> None:
    cfg = exp.FULL
    loaded = mnist_or_substitute(lambda _: None)
    print(loaded.note.splitlines()[0])
    problem = imbalanced_stream(
        exp.to_side(loaded.train_images, cfg["side"]),
        loaded.train_labels,
        rhos=exp.PAPER_RHOS,
        rounds_per_phase=rounds_per_phase,
        n_train=cfg["n_train"],
        n_val=cfg["n_val"],
        channels=cfg["channels"],
        blocks=cfg["blocks"],
        weight_decay=exp.WEIGHT_DECAY,
        seed=0,
    )
    hyper = next(h for label, _, h in exp.PAPER_METHODS if label == "AF2OBO")
    solver = bl.solvers.make("af2obo", **exp.with_cap(hyper, cap))
    t0 = time.perf_counter()
    res = exp._solve_seeds(problem, solver, 1)
    wall = time.perf_counter() - t0
    h = res.history
    cols = ["round", "inner_iterations_y", "inner_iterations_z", "seconds", "outer_loss"]
    print(h[cols].to_string(index=False))
    steps = (h.inner_iterations_y + h.inner_iterations_z).sum()
    print(
        f"cap {cap}: {len(h)} rounds, {steps:.0f} loop steps, {wall:.0f} s wall with the "
        f"compilation, {h.seconds.iloc[-1]:.0f} s solver time; y loop at the cap in "
        f"{int((h.inner_iterations_y >= cap).sum())} rounds"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))

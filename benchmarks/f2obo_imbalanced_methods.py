"""Play some methods of ``f2obo-imbalanced``'s paper protocol, each kept as it finishes.

``bilevel reproduce f2obo-imbalanced`` plays its seven methods one after another and keeps
each finished one in ``OUT/methods`` (``bilevel.experiments.method_store``); a rerun into the
same ``OUT`` loads them. This plays a chosen subset in a chosen order into the same store, so
that the long ones (AF2OBO and AOBO run their adaptive loops to the 1,000-step cap of the paper
protocol) can be played on another machine, an accelerator say, and the rest here:

    python benchmarks/f2obo_imbalanced_methods.py OUT AF2OBO,AOBO        # on the accelerator
    cp ...methods/* OUT/methods/ && bilevel reproduce f2obo-imbalanced --out ROOT   # here

``--quick`` plays the quick mode's sizes (a smoke test of this script). The data must be the
same on both machines (the key holds its name): carry Fashion-MNIST and set $BILEVEL_DATA.
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path

import jax

from bilevel.experiments import f2obo_imbalanced as exp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the run's directory (methods/ is added)")
    parser.add_argument("labels", help="comma-separated method labels, in the order to play")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--progress", action="store_true", help="rounds on stderr")
    args = parser.parse_args()
    cfg = exp.QUICK if args.quick else exp.FULL
    methods = {label: (solver, hyper) for label, solver, hyper in exp.PAPER_METHODS}
    unknown = [label for label in args.labels.split(",") if label not in methods]
    if unknown:
        parser.error(f"unknown method(s) {unknown}; known: {', '.join(methods)}")
    log = functools.partial(print, flush=True)
    log(f"device: {jax.devices()[0].device_kind}; jax {jax.__version__}")
    loaded, problem, test = exp.build(cfg, log)
    store = exp.method_store(args.out, loaded, cfg, args.seeds)
    for label in args.labels.split(","):
        t0 = time.perf_counter()
        solver, hyper = methods[label]
        exp.play_stored(
            store, problem, label, solver, hyper, args.seeds, cfg, test, log, args.progress
        )
        log(f"{label}: {time.perf_counter() - t0:.0f} s with compilation")


if __name__ == "__main__":
    main()

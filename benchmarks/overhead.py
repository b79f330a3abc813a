"""Solver overhead: time per step against the raw oracle floor, and 10 vmapped seeds vs 1.

For every registered solver, on the stochastic quadratic (dx=10, dy=50, 2000 samples, batch 64;
``--problem small``: dx=2, dy=5, 500 samples, where per-kernel costs dominate; ``--problem
cleaning``: data hyper-cleaning):

* ``solver/floor``: the solver's compiled chunk (what ``bl.solve`` times) against a bare
  ``lax.scan`` that makes the same oracle calls on the same number of fresh minibatches (read
  off the solver's own call counts) and nothing else. Above 1 is the cost of the method's own
  arithmetic and control flow.
* ``10 seeds/1 seed``: time of the compiled chunk running 10 vmapped seeds over one seed
  (steady state), beside the same ratio for the raw oracle floor (``floor 10/1``: what the
  oracle calls alone cost for 10 seeds), then the wall time of whole ``bl.solve`` calls
  (compilation included).

Also the sampler choices of ``bilevel.core.sampling``: the hash index generator against
``jax.random.randint``, and a gather of a random batch against a contiguous ``dynamic_slice``.

All numbers are ratios measured in this one run; the two programs of a ratio are timed
alternately and the median per-pair ratio is printed (see ``paired_times``); nothing passes or
fails on time. Run: ``python benchmarks/overhead.py [--steps 400] [--solvers f2sa stocbio]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

import bilevel as bl
import bilevel.data  # noqa: F401  (bl.data)
from bilevel.core import sampling
from bilevel.drivers import programs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory import cleaning  # noqa: E402
from timing import (  # noqa: E402
    best_time,
    floor_seed_ratio,
    paired_times,
    solver_chunk,
    versus_floor,
)

#: step sizes that keep every solver finite on the benchmark problem (speed, not accuracy)
SETTINGS = {
    "default": {"lr_outer": 0.01, "lr_inner": 0.05},
}


def sampler_ratios(problem, repeats):
    data, n, bs, draws = problem.inner_data, problem.n_inner, 64, 400

    def timed(make_idx, take):
        def body(c, k):
            idx = make_idx(k)
            batch = take(idx)
            return c + jnp.sum(batch["w"][:, 0]), None

        run = jax.jit(lambda key: jax.lax.scan(body, 0.0, jax.random.split(key, draws))[0])
        return best_time(run, jax.random.PRNGKey(0), repeats=repeats) / draws

    def gather(idx):
        return jax.tree.map(lambda a: jnp.take(a, idx, axis=0, mode="clip"), data)

    def contiguous(start):
        return jax.tree.map(lambda a: jax.lax.dynamic_slice_in_dim(a, start, bs), data)

    t_hash = timed(lambda k: sampling.uniform_indices(k, (bs,), n), gather)
    t_randint = timed(lambda k: jax.random.randint(k, (bs,), 0, n), gather)
    t_slice = timed(lambda k: sampling.uniform_indices(k, (), n - bs), contiguous)
    return t_hash, t_randint, t_slice


def make_problem(which: str):
    """The stochastic quadratic, or data hyper-cleaning (F2SA's, on 20,000 Fashion-MNIST
    training images; random Gaussian images of the same shape without Fashion-MNIST)."""
    if which == "quadratic":
        return bl.problems.quadratic(stochastic=True)
    if which == "small":
        return bl.problems.quadratic(2, 5, stochastic=True, n_samples=500)
    try:
        return bl.problems.hyper_cleaning_dataset(n_train=20000, n_val=5000, n_test=1000)
    except bl.data.DatasetNotFoundError as err:
        print(f"Fashion-MNIST not found ({err}); STAND-IN: random Gaussian 784-pixel images.")
    return cleaning(20000, 784, n_val=5000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--e2e-repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--solvers", nargs="*", default=None)
    parser.add_argument(
        "--problem", choices=("quadratic", "small", "cleaning"), default="quadratic"
    )
    parser.add_argument("--sampling", choices=sampling.SCHEMES, default="iid")
    parser.add_argument(
        "--floor-only", action="store_true", help="only solver/floor (no seeds, no end to end)"
    )
    args = parser.parse_args()
    problem = make_problem(args.problem).replace(sampling=args.sampling)
    names = args.solvers or bl.solvers.names()
    print(
        f"problem: {problem.name}, sampling {problem.sampling!r}, batch {args.batch}, "
        f"{args.steps} steps per timing; "
        f"us/step: best of {args.repeats}; ratios: median of {args.repeats} alternated pairs; "
        f"devices: {jax.devices()}"
    )
    header = (
        f"{'solver':10s} {'us/step':>9s} {'floor':>9s} {'solver/floor':>13s} "
        f"{'10 seeds':>10s} {'10 seeds/1 seed':>16s} {'floor 10/1':>11s}"
    )
    print(header)
    print("-" * len(header))
    for name in names:
        hyper = dict(SETTINGS.get(name, SETTINGS["default"]), batch_size=args.batch)
        solver = bl.solvers.make(name, **hyper).resolve(problem)  # "auto" settings filled in
        run1, state = solver_chunk(problem, solver, args.steps, 1)
        t1, t_floor, r_floor, _ = versus_floor(
            problem, solver, run1, state, args.batch, args.steps, args.repeats
        )
        steps = args.steps
        if args.floor_only:
            print(
                f"{name:10s} {t1 / steps * 1e6:9.1f} {t_floor / steps * 1e6:9.1f} {r_floor:13.2f}"
            )
            continue
        run10, _ = solver_chunk(problem, solver, args.steps, 10)
        t10, _, r_seeds = paired_times(run10, run1, args.repeats)
        r_floor_seeds = floor_seed_ratio(
            problem, solver, state, args.batch, args.steps, 10, args.repeats
        )
        print(
            f"{name:10s} {t1 / steps * 1e6:9.1f} {t_floor / steps * 1e6:9.1f} {r_floor:13.2f} "
            f"{t10 / steps * 1e6:10.1f} {r_seeds:16.2f} {r_floor_seeds:11.2f}"
        )
    if args.floor_only:
        return
    print(
        "\nend to end, bl.solve(steps=2000, eval_every=100) from a cold cache (compile "
        "included), 10 seeds vs 1 seed vs 10 separate 1-seed solves:"
    )
    for name in names:
        hyper = dict(SETTINGS.get(name, SETTINGS["default"]), batch_size=args.batch)
        walls: dict[str, list[float]] = {"1 seed": [], "10 seeds": []}
        for _ in range(args.e2e_repeats):  # alternated, like paired_times
            for label, seeds in (("1 seed", None), ("10 seeds", list(range(10)))):
                programs.clear_cache()
                t0 = time.perf_counter()
                bl.solve(
                    problem,
                    bl.solvers.make(name, **hyper),
                    steps=2000,
                    seeds=seeds,
                    eval_every=100,
                    progress=False,
                )
                walls[label].append(time.perf_counter() - t0)
        one, ten = walls["1 seed"], walls["10 seeds"]
        ratio = statistics.median(b / a for a, b in zip(one, ten, strict=True))
        print(
            f"{name:10s} 1 seed {min(one):.2f} s, 10 seeds {min(ten):.2f} s: "
            f"10 seeds/1 seed = {ratio:.2f}, 10 seeds/(10 separate solves) = {ratio / 10:.2f}"
        )
    t_hash, t_randint, t_slice = sampler_ratios(problem, args.repeats)
    print(
        f"\nsampler, per batch of 64: hash+gather {t_hash * 1e6:.2f} us; "
        f"jax.random.randint+gather / hash+gather = {t_randint / t_hash:.2f}; "
        f"hash+gather / contiguous slice = {t_hash / t_slice:.2f}"
    )


if __name__ == "__main__":
    main()

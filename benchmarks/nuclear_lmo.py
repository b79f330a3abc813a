"""Nuclear-ball LMO (Lanczos top singular pair) against the projection (full SVD) on 250x250.

IBCG's point (Abolfazli, Jiang, Mokhtari, Yazdandoost Hamedani 2025, Sec. 5.2) is that a
linear minimization oracle is much cheaper than a projection on the nuclear ball: the LMO needs
one singular pair, the projection a full SVD. This prints the median time of each (jitted,
float64, after a warm-up call) and their ratio; it asserts nothing about time.

Run: ``python benchmarks/nuclear_lmo.py [--size 250] [--repeats 20]``.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

import bilevel as bl  # noqa: E402


def median_seconds(fn, arg, repeats: int) -> float:
    """The median wall time of ``fn(arg)`` over ``repeats`` calls, after one warm-up call."""
    jax.block_until_ready(fn(arg))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(arg))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=250)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    # a rank-10 signal plus noise, like a matrix-completion gradient (and so a point outside
    # the ball, where the projection does its full work)
    n = args.size
    signal = rng.normal(size=(n, 10)) @ rng.normal(size=(10, n))
    g = jax.numpy.asarray(signal + rng.normal(size=(n, n)))
    ball = bl.sets.NuclearBall(radius=1.0)
    lmo = median_seconds(jax.jit(ball.lmo), g, args.repeats)
    project = median_seconds(jax.jit(ball.project), g, args.repeats)
    print(f"{n}x{n}, float64, {jax.devices()[0].platform}, {ball.lanczos_steps} Lanczos steps")
    print(f"lmo      {lmo * 1e3:9.3f} ms")
    print(f"project  {project * 1e3:9.3f} ms")
    print(f"ratio project / lmo = {project / lmo:.1f}")


if __name__ == "__main__":
    main()

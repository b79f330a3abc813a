"""Forward + backward time of the few-shot backbones per 5-way 5-shot episode, on this machine.

An episode is 5 classes x (5 support + 15 query) images = 100 images, in one batch. For CNN4 at
84x84x3 (miniImageNet) and at 32x32x1 (the padded Fashion-MNIST stand-in), and ResNet-12 at
84x84x3, prints the seconds of one compiled ``value_and_grad`` of a cross-entropy through a fixed
linear head over the features (compiled ahead, compile time printed apart; best of ``--repeats``
runs, one for ResNet-12), the ratio ResNet-12 / CNN4 at 84, and, for CNN4 at 32, the time per
step of a plain gradient-descent loop on the backbone as a rolled ``lax.scan`` against the same
scan unrolled: XLA:CPU runs its convolutions several times slower inside a rolled loop (see
``bilevel.meta.backbones.Conv2d``).
Nothing passes or fails. Run: ``python benchmarks/meta_backbones.py`` (about a minute on an idle
2-core CPU, ResNet-12's run most of it; longer when the cores are shared).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from bilevel.meta.backbones import CNN4, ResNet12
from bilevel.problems.models import softmax_cross_entropy

WAYS, SHOTS, QUERIES = 5, 5, 15
EPISODE = WAYS * (SHOTS + QUERIES)  # 100 images


def episode(channels: int, side: int, feature_dim: int, seed: int = 0):
    """Random images of one episode, their labels, and a fixed random linear head."""
    rng = np.random.default_rng(seed)
    images = rng.normal(size=(EPISODE, channels, side, side)).astype(np.float32)
    labels = np.repeat(np.arange(WAYS), SHOTS + QUERIES)
    head = (rng.normal(size=(feature_dim, WAYS)) / np.sqrt(feature_dim)).astype(np.float32)
    return jnp.asarray(images), jnp.asarray(labels), jnp.asarray(head)


def loss(model, images, labels, head):
    """Mean cross-entropy of the head over the backbone's features."""
    return jnp.mean(softmax_cross_entropy(model(images) @ head, labels))


def timed(fn, args, runs: int) -> tuple[float, float]:
    """(seconds to compile ``jax.jit(fn)`` for ``args``, best seconds of ``runs`` runs)."""
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_seconds = time.perf_counter() - t0
    seconds = []
    for _ in range(runs):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        seconds.append(time.perf_counter() - t0)
    return compile_seconds, min(seconds)


def gd_loop(steps: int, unroll):
    """``steps`` gradient steps on the backbone in one ``lax.scan`` (rolled, or unrolled)."""

    def run(model, images, labels, head):
        def body(m, _):
            grads = jax.grad(loss)(m, images, labels, head)
            return jax.tree.map(lambda a, g: a - 1e-3 * g, m, grads), None

        return jax.lax.scan(body, model, None, length=steps, unroll=unroll)[0]

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed CNN4 runs (best kept)")
    parser.add_argument("--resnet-repeats", type=int, default=1, help="timed ResNet-12 runs")
    parser.add_argument("--scan-steps", type=int, default=3)
    parsed = parser.parse_args()
    key = jax.random.key(0)
    print(
        f"device: {jax.devices()[0].device_kind}; episode: {WAYS}-way {SHOTS}-shot, "
        f"{QUERIES} queries per class = {EPISODE} images in one batch; float32"
    )
    cases = [
        ("CNN4", CNN4(3, 84, key=key), 3, 84, parsed.repeats),
        ("CNN4", CNN4(1, 32, key=key), 1, 32, parsed.repeats),
        ("ResNet-12", ResNet12(key=key), 3, 84, parsed.resnet_repeats),
    ]
    print(
        f"{'backbone':<10} {'input':<9} {'params':>11} {'features':>8} {'compile s':>9} "
        f"{'fwd+bwd s':>10}"
    )
    best = {}
    for name, model, channels, side, runs in cases:
        params = sum(leaf.size for leaf in jax.tree.leaves(model))
        args = (model, *episode(channels, side, model.feature_dim))
        compile_seconds, best[name, side] = timed(jax.value_and_grad(loss), args, runs)
        print(
            f"{name:<10} {f'{side}x{side}x{channels}':<9} {params:>11,} {model.feature_dim:>8} "
            f"{compile_seconds:>9.2f} {best[name, side]:>10.3f}"
        )
    ratio = best["ResNet-12", 84] / best["CNN4", 84]
    print(f"ResNet-12 / CNN4 at 84x84: {ratio:.1f}x per episode")
    args = (cases[1][1], *episode(1, 32, cases[1][1].feature_dim))
    steps = parsed.scan_steps
    rolled = timed(gd_loop(steps, unroll=1), args, 1)[1] / steps
    unrolled = timed(gd_loop(steps, unroll=True), args, 1)[1] / steps
    print(
        f"CNN4 32x32x1, {steps} gradient steps in one lax.scan: rolled {rolled:.3f} s/step, "
        f"unrolled {unrolled:.3f} s/step ({rolled / unrolled:.1f}x)"
    )


if __name__ == "__main__":
    main()

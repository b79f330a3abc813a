"""Minibatch sampling: a pure function of ``(key, data)``, so it vmaps over seeds.

Every stochastic method in the papers assumes i.i.d. unbiased minibatches. A solver step first
declares how many minibatches of each level it will use; :func:`minibatches` then draws *all*
their indices with one PRNG call per level (uniform, with replacement: i.i.d. and unbiased), and
each ``.outer(i)`` / ``.inner(i)`` gathers the rows of draw i when the oracle needs them.

Why this shape: on XLA:CPU the PRNG, not the gather, dominated a step (measured: drawing 32
indices with ``jax.random.randint`` cost 15 us, 5x a minibatch gradient of the quadratic test
problem, and 100 us under a 10-seed vmap). So the indices come from a keyed counter-based hash
(two rounds of the "lowbias32" integer mixer, keyed by the step's threefry subkey): about 0.2 us
for the same draw, vmap-friendly, and uniform up to a modulo bias of at most n / 2^32 in
relative probability (2e-4 for a million samples). ``tests/test_sampling.py`` checks
uniformity (chi-square) and the independence of draws, seeds and steps. Gathering each draw
separately keeps memory at one batch, where a per-step gather of all draws would not.
Contiguous slices of a per-epoch permutation were not taken: they need an O(n) permutation per
seed in the state and a reshuffle each epoch, which moves as many bytes as the gathers saved.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from . import parallel

PyTree = Any

__all__ = ["num_samples", "batch_count", "Minibatches", "minibatches", "uniform_indices"]


def num_samples(data: PyTree) -> int | None:
    """The common leading-axis length of the data leaves, or ``None`` for no data."""
    if data is None:
        return None
    leaves = jax.tree.leaves(data)
    return int(leaves[0].shape[0]) if leaves else None


def batch_count(data: PyTree, batch_size: int | None) -> int:
    """Samples in one minibatch (0 for a deterministic level; all of them for full batches)."""
    if data is None:
        return 0
    return num_samples(data) if batch_size is None else int(batch_size)


def _gather(data: PyTree, idx: jax.Array | None, i) -> PyTree:
    if data is None or idx is None:  # deterministic level, or full-batch oracle
        return data
    rows = idx[i]
    batch = jax.tree.map(lambda a: jnp.take(a, rows, axis=0, mode="clip"), data)
    batch = parallel.shard_batch(batch)  # split over the devices of solve(devices=...), if any
    # Materialise the batch once: without the barrier XLA fused the (elementwise, ~1.4 ns per
    # entry on CPU) gather into each consumer and paid for it several times per oracle call
    # (measured: F2SA 360 -> 280 us per step on the stochastic quadratic, batch 64).
    return jax.lax.optimization_barrier(batch)


class Minibatches(NamedTuple):
    """The minibatches of one solver step: ``outer(i)`` and ``inner(i)`` for draw i.

    ``i`` may be traced (an inner-loop counter). Draws of one level are independent; calling
    ``inner(i)`` twice with the same i returns the *same* sample (that is how a method reuses a
    sample on purpose, e.g. STABLE's one inner sample for the Hessian and the y-gradient).
    """

    outer_data: PyTree
    inner_data: PyTree
    outer_idx: jax.Array | None  # (num_outer, batch_size) int32, or None
    inner_idx: jax.Array | None  # (num_inner, batch_size) int32, or None
    samples_outer: int  # samples drawn for the outer level in this step (static)
    samples_inner: int

    def outer(self, i) -> PyTree:
        return _gather(self.outer_data, self.outer_idx, i)

    def inner(self, i) -> PyTree:
        return _gather(self.inner_data, self.inner_idx, i)


def _mix32(h: jax.Array) -> jax.Array:
    """The "lowbias32" integer hash (C. Wellons, hash-prospector): a bijection of uint32."""
    h = (h ^ (h >> 16)) * jnp.uint32(0x7FEB352D)
    h = (h ^ (h >> 15)) * jnp.uint32(0x846CA68B)
    return h ^ (h >> 16)


def uniform_indices(key: jax.Array, shape: tuple[int, ...], n: int) -> jax.Array:
    """Indices uniform on {0, ..., n-1} (int32), i.i.d. across entries, from a PRNG key.

    Counter-based: entry c gets ``mix(mix(c * phi + k0) ^ k1) mod n`` with (k0, k1) the key's
    two words; see the module docstring for why not ``jax.random.randint``.
    """
    if not 0 < n < 2**31:
        raise ValueError(f"uniform_indices needs 0 < n < 2^31, got n={n}.")
    words = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    words = words.astype(jnp.uint32).reshape(-1)
    size = 1
    for d in shape:
        size *= d
    counter = jnp.arange(size, dtype=jnp.uint32) * jnp.uint32(0x9E3779B9)
    h = _mix32(_mix32(counter + words[0]) ^ words[-1])
    return (h % jnp.uint32(n)).astype(jnp.int32).reshape(shape)


def _indices(key, data, batch_size, num):
    if data is None or batch_size is None or num == 0:
        return None
    return uniform_indices(key, (num, batch_size), num_samples(data))


def minibatches(
    key: jax.Array,
    outer_data: PyTree,
    inner_data: PyTree,
    batch_size: int | None,
    *,
    outer: int,
    inner: int,
) -> Minibatches:
    """Draw the indices of ``outer`` outer and ``inner`` inner minibatches of ``batch_size``.

    ``batch_size=None`` means full-batch (deterministic) oracles: no indices, no gather.
    """
    k_out, k_in = jax.random.split(key)
    return Minibatches(
        outer_data=outer_data,
        inner_data=inner_data,
        outer_idx=_indices(k_out, outer_data, batch_size, outer),
        inner_idx=_indices(k_in, inner_data, batch_size, inner),
        samples_outer=outer * batch_count(outer_data, batch_size),
        samples_inner=inner * batch_count(inner_data, batch_size),
    )

"""PRNG key splits and random bits as fused kernels on XLA:CPU: vmapped seeds of small problems.

Every solver step splits its key (``jax.random.split(state.key)``), and some draw random
directions (``jax.random.normal``, which draws ``jax.random.bits``). JAX lowers the Threefry-2x32
hash behind both on CPU as a loop of five iterations (four rounds each) to keep programs small,
and the loop's carry rotates its key words, which XLA:CPU implements as about a dozen buffer
copies per iteration. For one seed a whole small loop runs as a single kernel, but ``vmap``
over seeds makes it a loop of separate kernels: on ``bl.problems.quadratic(2, 5)``, 80 of the
105 kernels of a 10-seed SOBA step were its one key split (measured 2026-11-25,
``docs/performance.md``, item 14). Written out, the 20 rounds are elementwise integer
arithmetic that XLA fuses into one kernel.

:func:`applies` says which equations to replace (``random_split`` and ``random_bits`` of
Threefry keys, with JAX's default ``jax_threefry_partitionable``), :func:`evaluate` computes one
(:func:`split`, :func:`random_bits`): the same words as ``jax.random``, bit for bit
(``tests/test_unrolled_keys.py``). The evaluator (``evaluate``) applies them on the same pass as
the other rewrites where the options say ``unrolled_keys``.

The hash: J. K. Salmon, M. A. Moraes, R. O. Dror and D. E. Shaw, "Parallel random numbers: as
easy as 1, 2, 3", SC 2011 (Threefry-2x32 with 20 rounds); the counters are JAX's
(``jax_threefry_partitionable``): word ``i`` of a split or draw of ``shape`` hashes the 64-bit
counter ``i`` (row-major over ``shape``) as two 32-bit words, high word first; a split keeps
both output words, a draw of 32 bits or fewer their exclusive or, of 64 bits their
concatenation.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["PRIMITIVES", "applies", "evaluate", "split", "random_bits", "threefry2x32"]

_IMPL = "threefry2x32"
#: the primitives :func:`applies` looks at
PRIMITIVES = ("random_split", "random_bits")
#: rotation distances of the rounds, alternating between the two groups of four (Salmon et al.)
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
#: the key schedule's parity constant (Threefry's C240 for 32-bit words)
_PARITY = np.uint32(0x1BD11BDA)


def applies(eqn, keys) -> bool:
    """Whether ``eqn`` is a split of Threefry keys, or a draw of random bits from them, that
    :func:`evaluate` reproduces (``keys``: the value of its key operand)."""
    if eqn.primitive.name not in PRIMITIVES or not jax.config.jax_threefry_partitionable:
        return False
    if math.prod(eqn.params["shape"]) >= 2**32:  # counters with a high word: left to JAX
        return False
    if not jax.dtypes.issubdtype(eqn.invars[0].aval.dtype, jax.dtypes.prng_key):
        return False
    return jax.random.key_impl(keys) == _IMPL  # a built-in implementation is named by a string


def evaluate(eqn, keys: jax.Array) -> jax.Array:
    """The value of an equation :func:`applies` accepts, for the key array ``keys``."""
    if eqn.primitive.name == "random_split":
        return split(keys, eqn.params["shape"])
    return random_bits(keys, eqn.params["bit_width"], eqn.params["shape"])


def _rotate_left(v: jax.Array, distance: int) -> jax.Array:
    return (v << np.uint32(distance)) | (v >> np.uint32(32 - distance))


def threefry2x32(k1, k2, x1, x2) -> tuple[jax.Array, jax.Array]:
    """Threefry-2x32 (20 rounds) of the counter words ``(x1, x2)`` under the key ``(k1, k2)``,
    all uint32 arrays of one shape; written out, so that XLA fuses it."""
    schedule = (k1, k2, k1 ^ k2 ^ _PARITY)
    x1, x2 = x1 + schedule[0], x2 + schedule[1]
    for block in range(5):  # four rounds, then a key injection
        for distance in _ROTATIONS[block % 2]:
            x1 = x1 + x2
            x2 = _rotate_left(x2, distance) ^ x1
        x1 = x1 + schedule[(block + 1) % 3]
        x2 = x2 + schedule[(block + 2) % 3] + np.uint32(block + 1)
    return x1, x2


def _hash_counters(keys: jax.Array, shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """Threefry of the counters ``0, ..., prod(shape) - 1`` (laid out in ``shape``; fewer than
    2^32, so their high words are 0) under each key of ``keys``: two uint32 arrays of shape
    ``keys.shape + shape``."""
    words = jax.random.key_data(keys)  # (..., 2) uint32
    out = keys.shape + tuple(shape)
    expand = (...,) + (None,) * len(shape)
    k1, k2 = (jnp.broadcast_to(words[..., w][expand], out) for w in (0, 1))
    low = jnp.arange(math.prod(shape), dtype=jnp.uint32).reshape(shape)  # an iota, no constant
    high = jnp.zeros(out, jnp.uint32)
    return threefry2x32(k1, k2, high, jnp.broadcast_to(low, out))


def split(keys: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """``jax.random.split`` of each Threefry key of ``keys`` (a typed key array) into ``shape``
    new keys: an array of keys of shape ``keys.shape + shape``."""
    x1, x2 = _hash_counters(keys, shape)
    return jax.random.wrap_key_data(jnp.stack([x1, x2], axis=-1), impl=_IMPL)


def random_bits(keys: jax.Array, bit_width: int, shape: tuple[int, ...]) -> jax.Array:
    """The ``bit_width``-bit random words of each Threefry key of ``keys`` that
    ``jax.random.bits`` (and so every sampler of ``jax.random``) draws, of shape
    ``keys.shape + shape``."""
    x1, x2 = _hash_counters(keys, shape)
    dtype = jnp.dtype(f"uint{bit_width}")
    if bit_width == 64:
        return (x1.astype(dtype) << np.uint64(32)) | x2.astype(dtype)
    return (x1 ^ x2).astype(dtype)

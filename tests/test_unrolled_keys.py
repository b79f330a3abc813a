"""``_xla_cpu.unrolled_keys``: Threefry key splits and random bits written out as fused kernels.

Exact answers: the hash against the Threefry-2x32 known-answer vector of Salmon et al.'s Random123
(20 rounds, key and counter 0), every split and draw of bits bit for bit against
``jax.random.split`` / ``jax.random.bits``; whole
solver runs with the rewrite on and off give bit-identical iterates (the keys are the same, and
nothing else in the program changes).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_wide_dots import keep

import bilevel as bl
from bilevel.drivers._xla_cpu import unrolled_keys
from bilevel.drivers.cpu_rewrites import CpuRewrites


def test_threefry_known_answer():
    zero = jnp.zeros((), jnp.uint32)
    x1, x2 = unrolled_keys.threefry2x32(zero, zero, zero, zero)
    assert (int(x1), int(x2)) == (0x6B200159, 0x99BA4EFE)  # Random123's kat_vectors


@pytest.mark.parametrize("shape", [(2,), (3,), (7,), (2, 3)])
def test_split_is_jax_split_bit_for_bit(shape):
    for seed in (0, 1, 12345):
        key = jax.random.key(seed)
        want = jax.random.key_data(jax.random.split(key, shape))
        got = jax.random.key_data(jax.jit(unrolled_keys.split, static_argnums=1)(key, shape))
        np.testing.assert_array_equal(got, want)
    keys = jax.random.split(jax.random.key(3), 10)  # a batch of keys, as vmapped seeds have
    want = jax.random.key_data(jax.vmap(lambda k: jax.random.split(k, shape))(keys))
    np.testing.assert_array_equal(jax.random.key_data(unrolled_keys.split(keys, shape)), want)


@pytest.mark.parametrize("width", [8, 16, 32, 64])
@pytest.mark.parametrize("shape", [(), (5,), (3, 4)])
def test_random_bits_are_jax_bits_bit_for_bit(width, shape):
    dtype = jnp.dtype(f"uint{width}")
    key = jax.random.key(7)
    want = jax.random.bits(key, shape, dtype=dtype)
    got = unrolled_keys.random_bits(key, width, shape)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    keys = jax.random.split(jax.random.key(1), 4)
    want = jax.vmap(lambda k: jax.random.bits(k, shape, dtype=dtype))(keys)
    np.testing.assert_array_equal(unrolled_keys.random_bits(keys, width, shape), want)


def _split_equations(fn, *args):
    jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
    return [e for e in jaxpr.eqns if e.primitive.name == "random_split"]


def test_applies_only_to_threefry_splits():
    key, rbg_key = jax.random.key(0), jax.random.key(0, impl="rbg")
    (threefry,) = _split_equations(lambda k: jax.random.split(k), key)
    assert unrolled_keys.applies(threefry, key)
    (rbg,) = _split_equations(lambda k: jax.random.split(k), rbg_key)
    assert not unrolled_keys.applies(rbg, rbg_key)
    previous = jax.config.jax_threefry_partitionable
    try:  # JAX's other counter layout: left to JAX
        jax.config.update("jax_threefry_partitionable", False)
        assert not unrolled_keys.applies(threefry, key)
    finally:
        jax.config.update("jax_threefry_partitionable", previous)


def test_rewritten_programs_have_no_key_loop():
    """Ten vmapped splits: JAX's CPU lowering is a rolled loop; rewritten, none is left."""
    keys = jax.random.split(jax.random.key(5), 10)

    def splits(k):  # keys, and Gaussians drawn from them (random_bits underneath)
        new = jax.vmap(lambda kk: jax.random.split(kk, 3))(k)
        return jax.random.key_data(new), jax.vmap(lambda kk: jax.random.normal(kk, (6,)))(k)

    texts, values = {}, {}
    for unrolled in (False, True):
        compiled = jax.jit(keep(splits, unrolled_keys=unrolled)).lower(keys).compile()
        texts[unrolled], values[unrolled] = compiled.as_text(), compiled(keys)
    assert "while" in texts[False] and "while" not in texts[True]
    for on, off in zip(values[True], values[False], strict=True):
        np.testing.assert_array_equal(on, off)


@pytest.mark.parametrize("name", ["f2sa", "soba", "pzobo"])
def test_whole_runs_are_bit_identical(name):
    problem = bl.problems.quadratic(dx=3, dy=5, stochastic=True, n_samples=64)
    # a fixed lr_outer: the runs compare the key draws, not a tuning run's choice
    solver = bl.solvers.make(name, batch_size=8, lr_outer=0.01)
    runs = {}
    for unrolled in (False, True):
        options = CpuRewrites(unrolled_keys=unrolled)  # part of the compile cache's key
        res = bl.solve(
            problem, solver, steps=30, seeds=range(3), progress=False, cpu_rewrites=options
        )
        runs[unrolled] = jax.tree.leaves((res.x, res.y))
    for off, on in zip(runs[False], runs[True], strict=True):
        np.testing.assert_array_equal(on, off)

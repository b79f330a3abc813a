"""``_xla_cpu.small_dots`` (through ``_xla_cpu.rewrite``): small products as multiply-reduce.

The rewrite must give ``dot_general``'s values for every layout of its axes (batch, free and
contracted, in any order), pick the products it says it picks, and leave a whole vmapped run
where it was (float64: the same iterates up to summation order, rtol 1e-12 over 30 steps of a
contraction)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from test_wide_dots import keep

import bilevel as bl
from bilevel.drivers._xla_cpu import small_dots
from bilevel.drivers.cpu_rewrites import CpuRewrites

#: (lhs shape, rhs shape, dimension numbers): matrix-vector, vector-matrix, matrix-matrix with
#: each operand contracted on either axis, batched on leading and trailing axes, two
#: contracted axes, a scalar result
LAYOUTS = [
    ((5, 4), (4,), (((1,), (0,)), ((), ()))),
    ((4,), (4, 3), (((0,), (0,)), ((), ()))),
    ((5, 4), (4, 3), (((1,), (0,)), ((), ()))),
    ((4, 5), (4, 3), (((0,), (0,)), ((), ()))),
    ((5, 4), (3, 4), (((1,), (1,)), ((), ()))),
    ((6, 5, 4), (6, 4), (((2,), (1,)), ((0,), (0,)))),
    ((5, 4, 6), (4, 3, 6), (((1,), (0,)), ((2,), (2,)))),
    ((2, 3, 4), (3, 4, 5), (((1, 2), (0, 1)), ((), ()))),
    ((7,), (7,), (((0,), (0,)), ((), ()))),
]


@pytest.mark.parametrize("lhs_shape, rhs_shape, dims", LAYOUTS)
def test_multiply_reduce_is_dot_general(lhs_shape, rhs_shape, dims):
    rng = np.random.default_rng(len(lhs_shape) + 10 * len(rhs_shape))
    lhs = jnp.asarray(rng.standard_normal(lhs_shape))
    rhs = jnp.asarray(rng.standard_normal(rhs_shape))
    expected = lax.dot_general(lhs, rhs, dims)
    got = small_dots.multiply_reduce(lhs, rhs, dimension_numbers=dims)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)
    as_float32 = small_dots.multiply_reduce(
        lhs.astype(jnp.float32),
        rhs.astype(jnp.float32),
        dimension_numbers=dims,
        preferred_element_type=jnp.float64,
    )
    assert as_float32.dtype == jnp.float64


def _equation(lhs_shape, rhs_shape, dims, dtype=jnp.float64):
    args = (jnp.zeros(lhs_shape, dtype), jnp.zeros(rhs_shape, dtype))
    (eqn,) = jax.make_jaxpr(lambda a, b: lax.dot_general(a, b, dims))(*args).jaxpr.eqns
    return eqn


def test_which_products_are_small():
    plain = (((1,), (0,)), ((), ()))  # the left operand's axis 1 against the right's axis 0
    # a matrix-vector product: up to 256 multiply-adds (XLA:CPU runs larger ones well)
    assert small_dots.keep_small(_equation((16, 16), (16,), plain))  # 256
    assert not small_dots.keep_small(_equation((16, 17), (17,), plain))  # 272
    # a matrix-matrix product (vmapped matrix-vector products): up to 1,024
    assert small_dots.keep_small(_equation((10, 10), (10, 10), plain))  # 1,000
    assert not small_dots.keep_small(_equation((10, 11), (11, 10), plain))  # 1,100
    batched = (((2,), (1,)), ((0,), (0,)))  # 10 seeds' own (8 x 10) matrices times vectors
    assert small_dots.keep_small(_equation((10, 8, 10), (10, 10), batched))  # 800
    assert not small_dots.keep_small(_equation((4, 4), (4,), plain, jnp.int32))
    assert not small_dots.keep_small(_equation((4, 4), (4,), plain, jnp.bfloat16))


def _small_problem():
    rng = np.random.default_rng(3)
    m = rng.standard_normal((5, 5))
    A, B = jnp.asarray(m @ m.T / 5 + np.eye(5)), jnp.asarray(rng.standard_normal((5, 2)))

    def inner(x, y, batch=None):
        return 0.5 * y @ (A @ y) - y @ (B @ x)

    def outer(x, y, batch=None):
        return 0.5 * jnp.sum((y - 1.0) ** 2) + 0.05 * jnp.sum(x**2)

    return bl.BilevelProblem(outer=outer, inner=inner, x0=jnp.zeros(2), y0=jnp.zeros(5))


def _chunk_text(problem, solver, seeds, options):
    """The compiled text of a chunk of 5 steps of ``seeds`` vmapped seeds."""
    from bilevel.drivers import programs

    programs.clear_cache()
    solver = solver.resolve(problem)
    state = programs.init_states(solver, problem, list(range(seeds)))
    programs.compile_chunk(solver, problem, state, 5, cpu_rewrites=options)
    ((_, chunk),) = programs.cached_programs("chunk")
    return chunk.as_text()


def test_vmapped_seeds_compile_without_library_products():
    """10 vmapped seeds make (5 x 5) x (5 x 10) products of every matrix-vector product of one
    seed: without the rewrite XLA:CPU compiles them as library products (``dot``); with it,
    none is left."""
    problem, solver = _small_problem(), bl.solvers.make("stocbio", lr_outer=0.01, lr_inner=0.1)
    texts = {}
    for small in (False, True):
        texts[small] = _chunk_text(problem, solver, 10, CpuRewrites(small_dots=small))
    assert " dot(" in texts[False]
    assert " dot(" not in texts[True]


def test_a_vmapped_run_is_the_same_with_and_without():
    problem = _small_problem()
    traces = {}
    for small in (False, True):
        options = CpuRewrites(small_dots=small)
        for name in ("f2sa", "stocbio", "pzobo"):
            # f2sa's lam0 = 10 (its default with sampled inner gradients): at the exact-gradient
            # default 100, lr_outer = 0.05 is too large for this problem (lam scales the x step)
            extra = {"lam0": 10.0} if name == "f2sa" else {}
            solver = bl.solvers.make(name, lr_outer=0.05, lr_inner=0.1, **extra)
            result = bl.solve(
                problem, solver, steps=30, seeds=[0, 1, 2], progress=False, cpu_rewrites=options
            )
            traces[small, name] = np.asarray(result.x)
    for name in ("f2sa", "stocbio", "pzobo"):
        np.testing.assert_allclose(traces[True, name], traces[False, name], rtol=1e-12)
        assert np.abs(traces[True, name]).max() > 1e-3  # the runs moved


def test_off_with_the_option():
    A, v = jnp.ones((4, 4)), jnp.ones((3, 4))

    def traced(**options):
        return str(jax.make_jaxpr(keep(jax.vmap(lambda u: A @ u), **options))(v))

    assert "dot_general" in traced(small_dots=False)
    assert "dot_general" not in traced()

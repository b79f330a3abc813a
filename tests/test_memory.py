"""No solver step materialises a per-sample Jacobian on data hyper-cleaning.

With x in R^n (one weight per training sample), the x-derivatives a step needs are
``grad_x g`` (F2SA) and the cross product ``d^2 g / dx dy v`` (stocBiO): each is one reverse
pass returning a dense n-vector. Formed naively -- per-sample gradients, or the (dim_y x n)
Jacobian of ``grad_y g`` in x contracted with v afterwards -- they would need n x dim_y numbers
of scratch. XLA's memory analysis of the compiled step tells the two apart without running it:
growing n by 3n must add much less than 3n x dim_y x itemsize temp bytes. The control test shows
the measure does see a materialised Jacobian.
"""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bilevel as bl
from bilevel import oracles

N, D, C = 400, 32, 10  # small: dim_y = C (D + 1) = 330; 3N x dim_y x 8 B = 3.2 MB


def cleaning(n: int) -> bl.BilevelProblem:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n + 50, D))
    y = rng.integers(0, C, n + 50)
    return bl.problems.hyper_cleaning(X[:n], y[:n], X[n:], y[n:], num_classes=C)


def jacobian_budget(problem: bl.BilevelProblem, extra_samples: int) -> int:
    """Bytes of an (extra_samples x dim_y) block: what a per-sample Jacobian would add."""
    leaves = jax.tree.leaves(problem.y0)
    dim_y = sum(a.size for a in leaves)
    return extra_samples * dim_y * leaves[0].dtype.itemsize


def temp_bytes(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def step_temp_bytes(problem: bl.BilevelProblem, name: str) -> int:
    solver = bl.solvers.make(name, lr_outer=0.01, lr_inner=0.05, batch_size=16)
    return temp_bytes(solver.step, problem, solver.init(problem, jax.random.PRNGKey(0)))


@pytest.mark.parametrize("name", ["f2sa", "stocbio"])
def test_step_scratch_does_not_grow_like_n_times_dim_y(name):
    """Temp bytes at 4N minus at N stay under a tenth of 3N x dim_y x 8 bytes = 3.2 MB
    (measured: +15 kB for F2SA, +8 kB for stocBiO, i.e. 0.5% and 0.25% of it: a few dense
    n-vectors, the x-gradients)."""
    small, large = cleaning(N), cleaning(4 * N)
    growth = step_temp_bytes(large, name) - step_temp_bytes(small, name)
    assert growth < jacobian_budget(small, 3 * N) / 10, growth


def test_the_measure_sees_a_materialised_jacobian():
    """Control: the cross product through the dense Jacobian of grad_y g in x (jacrev, then
    contracted with v) does grow by at least 3N x dim_y x 8 bytes; the one-pass product does not."""

    def dense_cross(problem):
        def cross(x, y, batch, v):
            jac = jax.jacrev(oracles.grad_y, argnums=1)(problem.inner, x, y, batch)
            return jax.tree.reduce(
                jnp.add, jax.tree.map(lambda j, u: jnp.tensordot(u, j, u.ndim), jac, v)
            )

        return cross

    def growth(make):
        sizes = [cleaning(N), cleaning(4 * N)]
        args = [(p.x0, p.y0, jax.tree.map(lambda a: a[:16], p.inner_data), p.y0) for p in sizes]
        return [temp_bytes(make(p), *a) for p, a in zip(sizes, args, strict=True)]

    dense = growth(dense_cross)
    one_pass = growth(lambda p: lambda x, y, b, v: oracles.cross_xy(p.inner, x, y, b, v))
    budget = jacobian_budget(cleaning(N), 3 * N)
    assert dense[1] - dense[0] >= budget, dense
    assert one_pass[1] - one_pass[0] < budget / 10, one_pass


def test_network_metrics_over_blocks_are_the_full_data_values(monkeypatch):
    """The mlp / cnn metrics run over blocks of EVAL_ROWS rows (a lax.scan; LeNet-5's default
    one-pass inner_grad_norm on 59,000 images peaked at 19 GB); here blocks of 16 over 70
    training rows (4 blocks and a remainder of 6), 40 validation rows (remainder 8) and 32 test
    rows (no remainder) give the one-pass values (float64: agreement to 1e-12 relative)."""
    hc = importlib.import_module("bilevel.problems.hyper_cleaning")
    M = hc.M
    monkeypatch.setattr(hc, "EVAL_ROWS", 16)
    rng = np.random.default_rng(3)
    X, y = rng.standard_normal((142, 12)), rng.integers(0, 4, 142)
    p = hc.hyper_cleaning(
        X[:70], y[:70], X[70:110], y[70:110], X_test=X[110:], y_test=y[110:], num_classes=4,
        model="mlp", hidden=5,
    )  # fmt: skip
    x = jnp.asarray(rng.standard_normal(70))
    got = jax.jit(p.metrics)(x, p.y0)
    apply = p.reference.apply
    for split, rows in (("val", slice(70, 110)), ("test", slice(110, 142))):
        logits = apply(p.y0, jnp.asarray(X[rows]))
        ce = jnp.mean(M.softmax_cross_entropy(logits, jnp.asarray(y[rows])))
        np.testing.assert_allclose(got[f"{split}_loss"], ce, rtol=1e-12)
        np.testing.assert_allclose(got[f"{split}_acc"], M.accuracy(logits, y[rows]), rtol=1e-12)
    grad = jax.jit(oracles.grad_y, static_argnums=0)(p.inner, x, p.y0, p.inner_data)
    norm = jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree.leaves(grad)))  # one pass, all rows
    np.testing.assert_allclose(got["inner_grad_norm"], norm, rtol=1e-12)

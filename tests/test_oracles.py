"""Oracles against closed forms: on the quadratic family every derivative is a known matrix."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bilevel as bl
from bilevel import oracles

# float64 throughout (conftest): agreement to 1e-10 is rounding level for these 50x50 products.
TOL = 1e-10


@pytest.fixture(scope="module")
def quad():
    return bl.problems.quadratic(dx=4, dy=6, cond=5.0, seed=3)


def _rand(n, seed):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(n))


def test_partial_gradients(quad):
    ref = quad.reference
    x, y = _rand(4, 0), _rand(6, 1)
    gx, gy = oracles.grads(quad.inner, x, y, None)
    np.testing.assert_allclose(gy, ref.A @ y - ref.B @ x - ref.b, atol=TOL)
    np.testing.assert_allclose(gx, -ref.B.T @ y + ref.c_x * x, atol=TOL)
    np.testing.assert_allclose(oracles.grad_x(quad.inner, x, y, None), gx, atol=TOL)
    np.testing.assert_allclose(oracles.grad_y(quad.inner, x, y, None), gy, atol=TOL)
    val, (fx, fy) = oracles.value_and_grads(quad.outer, x, y, None)
    r = y - ref.D @ x - ref.e
    np.testing.assert_allclose(fy, r, atol=TOL)
    np.testing.assert_allclose(fx, -ref.D.T @ r + ref.rho * x, atol=TOL)
    # float() on both sides: pytest.approx of a jax Array goes through numpy conversion
    # and, for a 0-d Array, cannot print the comparison when the assertion fails
    assert float(val) == pytest.approx(float(0.5 * r @ r + 0.5 * ref.rho * x @ x), rel=1e-12)


def test_second_order_products(quad):
    ref = quad.reference
    x, y, v, u = _rand(4, 0), _rand(6, 1), _rand(6, 2), _rand(4, 3)
    g = quad.inner
    np.testing.assert_allclose(oracles.hvp_yy(g, x, y, None, v), ref.A @ v, atol=TOL)
    # d^2 g / dx dy = -B^T (maps y-space to x-space); d^2 g / dy dx = -B
    np.testing.assert_allclose(oracles.cross_xy(g, x, y, None, v), -ref.B.T @ v, atol=TOL)
    np.testing.assert_allclose(oracles.cross_yx(g, x, y, None, u), -ref.B @ u, atol=TOL)
    cross, hvp = oracles.hvp_and_cross(g, x, y, None, v)
    np.testing.assert_allclose(cross, -ref.B.T @ v, atol=TOL)
    np.testing.assert_allclose(hvp, ref.A @ v, atol=TOL)
    np.testing.assert_allclose(oracles.hessian_yy(g, x, y, None), ref.A, atol=TOL)
    np.testing.assert_allclose(oracles.jacobian_xy(g, x, y, None), -ref.B.T, atol=TOL)
    np.testing.assert_allclose(oracles.jacobian_yx(g, x, y, None), -ref.B, atol=TOL)


def test_second_order_on_a_non_quadratic_function():
    """A log-sum-exp coupling: compare with jax.hessian of the joint function."""

    def h(x, y, batch):
        return jnp.log(jnp.sum(jnp.exp(jnp.outer(x, y)))) + 0.5 * jnp.sum(y**2) * jnp.sum(x**2)

    x, y, v, u = _rand(3, 0), _rand(4, 1), _rand(4, 2), _rand(3, 3)
    H = jax.hessian(lambda z: h(z[:3], z[3:], None))(jnp.concatenate([x, y]))
    Hxy, Hyy = H[:3, 3:], H[3:, 3:]
    np.testing.assert_allclose(oracles.hvp_yy(h, x, y, None, v), Hyy @ v, atol=1e-9)
    np.testing.assert_allclose(oracles.cross_xy(h, x, y, None, v), Hxy @ v, atol=1e-9)
    np.testing.assert_allclose(oracles.cross_yx(h, x, y, None, u), Hxy.T @ u, atol=1e-9)


def test_oracles_on_pytrees():
    p = bl.problems.quadratic(dx=4, dy=6, cond=5.0, seed=3, pytree=True)
    ref = p.reference
    x = ref.unravel_x(_rand(4, 0))
    y = ref.unravel_y(_rand(6, 1))
    v = ref.unravel_y(_rand(6, 2))
    flat = lambda t: jax.flatten_util.ravel_pytree(t)[0]  # noqa: E731
    hv = oracles.hvp_yy(p.inner, x, y, None, v)
    assert jax.tree.structure(hv) == jax.tree.structure(y)
    np.testing.assert_allclose(flat(hv), ref.A @ flat(v), atol=TOL)
    np.testing.assert_allclose(
        flat(oracles.cross_xy(p.inner, x, y, None, v)), -ref.B.T @ flat(v), atol=TOL
    )


def test_counts():
    c = oracles.Counts.zeros().add(grad_f=2, hvp=3).add(grad_f=1, samples_inner=64)
    assert int(c.grad_f) == 3 and int(c.hvp) == 3 and int(c.samples_inner) == 64
    assert "samples_outer" not in c.oracle_kinds and "hvp" in c.oracle_kinds
    with pytest.raises(ValueError, match="unknown kinds.*hessian"):
        c.add(hessian=1)

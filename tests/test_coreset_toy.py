"""The IBCG paper's 2-D coreset toy (Sec. 5.1, eq. (13), App. G.2): construction, the closed
forms against autodiff, and IBCG's convergence at mu_g = 1 and mu_g = 0.1."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bilevel as bl


@pytest.mark.parametrize("mu_g", [1.0, 0.1])
def test_construction_and_closed_forms(mu_g):
    """A^T A has eigenvalues {mu_g, L_g = 4}; y*, grad l match autodiff (rtol 1e-12: float64
    2x2 solves); lambda* is a simplex point where the FW gap vanishes (atol 1e-9)."""
    p = bl.problems.coreset_toy(mu_g=mu_g)
    ref = p.reference
    np.testing.assert_allclose(np.linalg.eigvalsh(ref.A.T @ ref.A), [mu_g, 4.0], rtol=1e-12)
    d = bl.diagnose(p)
    np.testing.assert_allclose([d.mu_g, d.L_g], [mu_g, 4.0], rtol=1e-6)
    assert isinstance(p.x_set, bl.sets.Simplex)
    np.testing.assert_allclose(p.x0, 0.25)
    lam = np.array([0.1, 0.2, 0.3, 0.4])
    y_star = bl.metrics.inner_solution(p, jnp.asarray(lam), p.y0)
    np.testing.assert_allclose(y_star, ref.y_star(lam), rtol=1e-12)
    np.testing.assert_allclose(
        bl.metrics.hypergradient(p, jnp.asarray(lam)), ref.grad_F(lam), rtol=1e-10
    )
    # grad_theta theta g = A^T (A theta - X lambda) and d2g/dtheta dlambda = -X^T A (spec 3.1)
    cross = jax.jacfwd(jax.grad(p.inner, argnums=1), argnums=0)(jnp.asarray(lam), jnp.ones(2))
    np.testing.assert_allclose(cross.T, -ref.X.T @ ref.A, rtol=1e-12)
    assert np.isclose(ref.x_star.sum(), 1.0) and (ref.x_star >= 0).all()
    assert abs(float(bl.metrics.fw_gap(p, jnp.asarray(ref.x_star)))) < 1e-9
    np.testing.assert_allclose(ref.F(ref.x_star), ref.f_star)


@pytest.mark.parametrize(("mu_g", "bound"), [(1.0, 2e-3), (0.1, 2e-2)])
def test_ibcg_converges(mu_g, bound):
    """IBCG with its defaults for K = 1000, gamma = log K/K (l is convex): l(lambda_K) - l*
    measured 1.2e-3 (mu_g = 1) and 8.1e-3 (mu_g = 0.1; rho = 1 - eta mu_g is close to 1, so
    the w-tracking is slower), from 0.95; bounds ~2x the measurements, which are deterministic."""
    p = bl.problems.coreset_toy(mu_g=mu_g)
    res = bl.solve(
        p, bl.solvers.make("ibcg", gamma_rule="convex"), 1000, eval_every=500, progress=False
    )
    gaps = res.history.F_gap.to_numpy()
    assert gaps[-1] < bound and gaps[-1] < gaps[0] / 40

"""stocBiO (Ji, Yang, Liang, ICML 2021, Algorithm 2) against exact answers."""

import jax
import numpy as np
import pytest

import bilevel as bl
from bilevel import oracles
from bilevel.core import sampling
from bilevel.core.schedules import inverse_power


@pytest.fixture(scope="module")
def quad():
    return bl.problems.quadratic()


def test_matches_algorithm_2_step_by_step(quad):
    ref = quad.reference
    D, Q, beta, eta, alpha = 3, 4, 0.12, 0.07, 0.05
    solver = bl.solvers.make(
        "stocbio", lr_outer=alpha, lr_inner=beta, inner_steps=D, neumann_steps=Q, neumann_lr=eta
    )
    state = solver.init(quad, jax.random.PRNGKey(0))
    step = jax.jit(solver.step)
    x, y = np.zeros(10), np.zeros(50)
    for _ in range(3):
        for _ in range(D):  # warm-started inner gradient descent
            y = y - beta * (ref.A @ y - ref.B @ x - ref.b)
        r = y - ref.D @ x - ref.e  # grad_y f
        term, v = r.copy(), r.copy()
        for _ in range(Q):  # v = eta sum_{q=0}^{Q} (I - eta A)^q grad_y f
            term = term - eta * ref.A @ term
            v = v + term
        v = eta * v
        hyper = (-ref.D.T @ r + ref.rho * x) - (-ref.B.T @ v)  # grad_x f - d2g/dxdy v
        x = x - alpha * hyper
        state = step(quad, state)
        np.testing.assert_allclose(state.x, x, rtol=1e-11, atol=1e-13)
        np.testing.assert_allclose(state.y, y, rtol=1e-11, atol=1e-13)
    c = state.counts
    assert (int(c.grad_g), int(c.grad_f), int(c.hvp), int(c.cross)) == (3 * D, 3, 3 * Q, 3)


def test_stochastic_step_draws_a_fresh_hessian_sample_per_factor():
    p = bl.problems.quadratic(dx=3, dy=4, stochastic=True, n_samples=40)
    D, Q, bs = 2, 3, 5
    solver = bl.solvers.make(
        "stocbio", lr_outer=0.1, lr_inner=0.1, batch_size=bs, inner_steps=D, neumann_steps=Q
    )
    state = solver.init(p, jax.random.PRNGKey(2))
    new = jax.jit(solver.step)(p, state)
    _, batch_key = jax.random.split(state.key)
    mb = sampling.minibatches(batch_key, p.outer_data, p.inner_data, bs, outer=1, inner=D + Q + 1)
    f, g, x, y = p.outer, p.inner, state.x, state.y
    for t in range(D):
        y = y - 0.1 * oracles.grad_y(g, x, y, mb.inner(t))
    gx, gy = oracles.grads(f, x, y, mb.outer(0))
    term, v = gy, gy
    for q in range(1, Q + 1):  # product of independent minibatch Hessians
        term = term - 0.1 * oracles.hvp_yy(g, x, y, mb.inner(D + q - 1), term)
        v = v + term
    v = 0.1 * v
    x = x - 0.1 * (gx - oracles.cross_xy(g, x, y, mb.inner(D + Q), v))
    np.testing.assert_allclose(new.x, x, rtol=1e-12)
    np.testing.assert_allclose(new.y, y, rtol=1e-12)
    assert int(new.counts.samples_inner) == bs * (D + Q + 1)


def test_deterministic_quadratic_reaches_1e3(quad):
    """Done-means: ||grad F(x_K)|| <= 1e-3 ||grad F(x_0)||. The Neumann truncation bias is
    ||(I - eta A)^(Q+1)|| <= 0.82^61 ~ 6e-6 relative here (eta = 0.18, mu_g = 1), far below."""
    solver = bl.solvers.make("stocbio", lr_outer=0.05, lr_inner=0.18, neumann_steps=60)
    res = bl.solve(quad, solver, steps=1000, eval_every=250, progress=False)
    g0, gK = res.history.grad_norm.iloc[0], res.history.grad_norm.iloc[-1]
    assert gK <= 1e-3 * g0, res.history
    np.testing.assert_allclose(np.asarray(res.x), quad.reference.x_star, atol=1e-3)


def test_neumann_bias_with_few_terms(quad):
    """With Q = 5 the truncated series leaves a bias that does not vanish: the x it settles at
    is off by an amount predicted by the truncated inverse (a sharp check of eta and Q)."""
    ref = quad.reference
    eta, Q = 0.1, 5
    res = bl.solve(
        quad,
        bl.solvers.make("stocbio", lr_outer=0.05, lr_inner=0.18, neumann_steps=Q, neumann_lr=eta),
        steps=1500,
        eval_every=1500,
        progress=False,
    )
    # fixed point of x <- x - a (grad_x f + B^T P (y*(x) - D x - e)), P = eta sum (I - eta A)^q
    I = np.eye(50)
    P = eta * sum(np.linalg.matrix_power(I - eta * ref.A, q) for q in range(Q + 1))
    M = np.linalg.solve(ref.A, ref.B) - ref.D
    r = np.linalg.solve(ref.A, ref.b) - ref.e
    G = -ref.D.T @ M + ref.rho * np.eye(10) + ref.B.T @ P @ M
    h = -ref.D.T @ r + ref.B.T @ P @ r
    x_biased = np.linalg.solve(G, -h)
    np.testing.assert_allclose(np.asarray(res.x), x_biased, rtol=1e-6, atol=1e-8)
    assert np.linalg.norm(x_biased - ref.x_star) > 0.05  # the bias is real


def test_stochastic_quadratic_5_seeds_10x():
    """Done-means: batch 32, 5 seeds, mean ||grad F|| falls by at least 10x. Decaying steps
    (k^-1/2) and a Neumann series long enough that its bias (0.85^21 ~ 3%) is not the floor."""
    p = bl.problems.quadratic(stochastic=True)
    solver = bl.solvers.make(
        "stocbio",
        lr_outer=inverse_power(0.05, 0.5, 100),
        lr_inner=inverse_power(0.1, 0.5, 100),
        batch_size=32,
        neumann_lr=0.15,
        neumann_steps=20,
    )
    res = bl.solve(p, solver, steps=3000, seeds=range(5), eval_every=1000, progress=False)
    mean = res.history.groupby("step").grad_norm.mean()
    assert mean.iloc[-1] <= mean.iloc[0] / 10, mean


def test_bad_options():
    with pytest.raises(ValueError, match="neumann_steps"):
        bl.solvers.make("stocbio", neumann_steps=-1)
    with pytest.raises(ValueError, match="neumann_lr explicitly"):
        bl.solvers.make("stocbio", lr_inner=inverse_power(0.1, 0.5, 10))

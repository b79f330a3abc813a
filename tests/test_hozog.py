"""HOZOG (Gu et al., 2021; the PZOBO paper's zeroth-order baseline) against exact answers.

On the quadratic test-bed F_N(x) = f(x, y^N(x)) is a quadratic with Hessian H_N (see
``test_pzobo.path_model``), so the forward difference is exact to second order:
(F_N(x + mu u) - F_N(x)) / mu = <grad F_N, u> + (mu/2) u'H_N u. With Gaussian u the estimate is
therefore unbiased for grad F_N at EVERY mu (odd moments vanish), and its single-direction error
has trace (p + 1) ||grad F_N||^2 + (mu^2/4) [(p + 4) (tr H)^2 + (2p + 8) tr H^2] (Isserlis).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_pzobo import (
    _coefficients,
    expected_sq_error,
    numpy_adam,
    numpy_directions,
    numpy_inner_path,
    path_model,
    stochastic_quadratic_grads,
)

import bilevel as bl
from bilevel.core import sampling
from bilevel.core.schedules import inverse_power
from bilevel.solvers.zeroth_order.pzobo import sample_directions


@pytest.fixture(scope="module")
def quad():
    return bl.problems.quadratic()  # p = 10, d = 50, mu_g = 1, L_g = 10


def numpy_f(ref, x, y):
    return 0.5 * np.sum((y - ref.D @ x - ref.e) ** 2) + 0.5 * ref.rho * np.sum(x**2)


CASES = {
    "gaussian": dict(num_directions=2),
    "official-code": dict(
        directions="sphere_unscaled_per_tensor",
        inner_optimizer="momentum",
        warm_start=True,
        outer_optimizer="adam",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_numpy_replica_step_by_step(quad, case):
    """Three HOZOG steps in numpy, directions rebuilt from the key convention; f is perturbed
    in both arguments. rtol 1e-10: differencing f over mu = 0.01 costs about two digits."""
    ref, N, lr_in, lr_out = quad.reference, 6, 0.15, 0.01
    solver = bl.solvers.make("hozog", lr_outer=lr_out, lr_inner=lr_in, inner_steps=N, **CASES[case])
    Q, mu = solver.with_directions(quad).num_directions, solver.smoothing  # "auto": p + 1
    state = solver.init(quad, jax.random.PRNGKey(8))
    step = jax.jit(solver.step)
    x, y, m, v = np.zeros(10), np.zeros(50), np.zeros(10), np.zeros(10)
    for k in range(3):
        _, _, dir_key = jax.random.split(state.key, 3)
        u, c = numpy_directions(dir_key, Q, [10], solver.directions)
        y_init = y if solver.warm_start else np.zeros(50)

        def path(x_, y_init=y_init):
            return numpy_inner_path(ref, x_, y_init, lr_in, N, solver.inner_optimizer)

        y = path(x)
        f0 = numpy_f(ref, x, y)
        hyper = sum(
            c / (mu * Q) * (numpy_f(ref, x + mu * u[j], path(x + mu * u[j])) - f0) * u[j]
            for j in range(Q)
        )
        if solver.outer_optimizer == "adam":
            hyper, m, v = numpy_adam(hyper, m, v, k + 1)
        x = x - lr_out * hyper
        state = step(quad, state)
        np.testing.assert_allclose(state.x, x, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(state.y, y, rtol=1e-10, atol=1e-13)
    cnt = state.counts  # fully zeroth order in f: Q + 1 values, no gradient of f
    assert (int(cnt.value_f), int(cnt.grad_f), int(cnt.grad_g), int(cnt.hvp)) == (
        3 * (Q + 1),
        0,
        3 * (Q + 1) * N,
        0,
    )


def test_never_differentiates_f(quad):
    """An outer loss whose every derivative is NaN (a custom JVP): HOZOG, which only evaluates
    f, takes the numpy replica's step (rtol 1e-10); PZOBO, which needs grad f, gets NaN."""

    @jax.custom_jvp
    def outer(x, y, batch):
        return quad.outer(x, y, batch)

    @outer.defjvp
    def _outer_jvp(primals, tangents):  # linear in the tangents, but NaN
        leaves = jax.tree.leaves(tangents[:2])
        return outer(*primals), jnp.nan * sum(jnp.sum(t) for t in leaves)

    poisoned, ref, N, mu = quad.replace(outer=outer), quad.reference, 20, 0.01
    hozog = bl.solvers.make("hozog", lr_outer=0.01, lr_inner=0.1, num_directions=1)
    state = hozog.init(quad, jax.random.PRNGKey(0))
    new = jax.jit(hozog.step)(poisoned, state)
    u, _ = numpy_directions(jax.random.split(state.key, 3)[2], 1, [10], "gaussian")
    x_pert = mu * u[0]
    y_n, y_pert = (numpy_inner_path(ref, x_, np.zeros(50), 0.1, N) for x_ in (0 * x_pert, x_pert))
    diff = numpy_f(ref, x_pert, y_pert) - numpy_f(ref, 0 * x_pert, y_n)
    np.testing.assert_allclose(new.x, -0.01 * diff / mu * u[0], rtol=1e-10)
    pzobo = bl.solvers.make("pzobo", lr_outer=0.01, lr_inner=0.1)
    assert np.isnan(np.asarray(jax.jit(pzobo.step)(poisoned, state).x)).all()


def test_estimate_is_unbiased_with_the_predicted_spread(quad):
    """At mu = 0.5 (large, to make the forward-difference term visible) the mean of 20000
    single-direction estimates matches grad F_N(x) to 4.5 standard errors per coordinate, and
    their centred second moment matches the closed form (module docstring) to 10% and 4 of its
    standard errors; the mu-term is more than a fifth of it, so the check sees it."""
    ref, N, lr, Q, mu = quad.reference, 5, 0.1, 20_000, 0.5
    solver = bl.solvers.make("hozog", lr_inner=lr, inner_steps=N, num_directions=Q, smoothing=mu)
    x_flat = np.random.default_rng(2).standard_normal(10)
    x = jnp.asarray(x_flat)
    key = jax.random.PRNGKey(3)
    u, c = sample_directions(key, x, Q, "gaussian")
    mb = solver.minibatches(quad, key, outer=1, inner=N)
    coeffs = _coefficients(solver, quad, mb, x, quad.y0, lr, u)[0]
    samples = np.asarray(c * coeffs[:, None] * u)
    _, H, x_n, _, _ = path_model(ref, lr, N)
    grad_FN = H @ (x_flat - x_n)  # F_N is a quadratic with Hessian H_N, minimised at x*_N
    se = samples.std(axis=0, ddof=1) / np.sqrt(Q)
    assert (np.abs(samples.mean(0) - grad_FN) / se).max() < 4.5
    p = 10
    mu_term = mu**2 / 4 * ((p + 4) * np.trace(H) ** 2 + (2 * p + 8) * np.trace(H @ H))
    predicted = (p + 1) * grad_FN @ grad_FN + mu_term
    assert mu_term > 0.2 * predicted
    sq = np.sum((samples - grad_FN) ** 2, axis=1)
    assert abs(sq.mean() / predicted - 1) < 0.10
    assert abs(sq.mean() - predicted) < 4 * sq.std(ddof=1) / np.sqrt(Q)


def test_stochastic_paths_share_inner_draws_and_values_share_the_outer_draw():
    """Our minibatch extension: every path uses inner draw t at step t and all Q + 1 values of
    f use the one outer draw (independent draws would add noise ~ sigma/mu to each difference).
    Numpy replica on the solver's own draws; rtol 1e-10."""
    p = bl.problems.quadratic(dx=3, dy=4, stochastic=True, n_samples=40)
    N, Q, bs, lr, mu = 3, 2, 5, 0.1, 0.01
    solver = bl.solvers.make(
        "hozog", lr_outer=0.1, lr_inner=lr, batch_size=bs, inner_steps=N, num_directions=Q
    )
    state = solver.init(p, jax.random.PRNGKey(6))
    new = jax.jit(solver.step)(p, state)
    _, batch_key, dir_key = jax.random.split(state.key, 3)
    mb = sampling.minibatches(batch_key, p.outer_data, p.inner_data, bs, outer=1, inner=N)
    inner_rows, outer_rows = np.asarray(mb.inner_idx), np.asarray(mb.outer_idx)
    u, _ = numpy_directions(dir_key, Q, [3], "gaussian")
    grad_y_g, _ = stochastic_quadratic_grads(p)
    ref, e_batch = p.reference, np.asarray(p.outer_data["e"])[outer_rows[0]].mean(0)

    def f(x, y):  # the library's minibatch f: the batch mean of e enters the square
        return 0.5 * np.sum((y - ref.D @ x - e_batch) ** 2) + 0.5 * ref.rho * np.sum(x**2)

    def path(x):
        y = np.zeros(4)
        for t in range(N):
            y = y - lr * grad_y_g(x, y, inner_rows[t])
        return y

    x = np.zeros(3)
    f0 = f(x, path(x))
    hyper = sum((f(x + mu * u[j], path(x + mu * u[j])) - f0) / mu * u[j] for j in range(Q)) / Q
    np.testing.assert_allclose(new.x, x - 0.1 * hyper, rtol=1e-10)
    assert (int(new.counts.samples_inner), int(new.counts.samples_outer)) == (N * bs, bs)


def test_deterministic_quadratic_done_means(quad):
    """Done-means: ||x_K - x*|| <= 1e-2 ||x_0 - x*||, mean over seeds 0..4, defaults but
    lr_outer/lr_inner. Bias and variance here: smoothing bias 0 (quadratic F_N), finite-N bias
    ||x*_N - x*|| = 0.4% of ||x*|| (lr_inner = 0.18, N = 20), direction noise vanishing at x*_N
    except the forward-difference term (mu/2)(u'H u) u, whose floor is 3.8% of ||x*|| at a
    constant step 0.01 with Q = 1 (divided by Q: the default "auto" is p + 1 = 11 here). With
    beta_k = 1 / (k + 100) the exact recursion predicts an RMS of 0.39% at K = 3000 (0.68% with
    Q = 1); the run must match it (factor 0.6-1.5, five seeds)."""
    ref, K = quad.reference, 3000
    sched = inverse_power(0.01, 1.0, 100.0)
    solver = bl.solvers.make("hozog", lr_outer=sched, lr_inner=0.18)
    res = bl.solve(quad, solver, steps=K, eval_every=K, seeds=range(5), progress=False)
    norm = np.linalg.norm(ref.x_star)
    err = res.history[res.history.step == K].x_err.to_numpy() / norm
    betas = [sched(k) for k in range(K)]
    Q = solver.with_directions(quad).num_directions  # "auto": p + 1 = 11
    predicted = np.sqrt(expected_sq_error(ref, 0.18, 20, betas, Q=Q, method="hozog")) / norm
    print(f"HOZOG x_err/||x*|| at K={K}: mean {err.mean():.2e}, predicted RMS {predicted:.2e}")
    assert predicted < 1e-2 and err.mean() <= 1e-2
    assert 0.6 * predicted < np.sqrt(np.mean(err**2)) < 1.5 * predicted

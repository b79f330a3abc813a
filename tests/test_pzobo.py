"""PZOBO and PZOBO-S (Sow, Ji, Liang, NeurIPS 2022, Algorithms 1 and 2) against exact answers.

On the quadratic test-bed every quantity is in closed form (spec section 5): N GD steps from
y_0 = 0 give the affine map y^N(x) = J_N x + c_N with J_N = A^{-1}(I - (I - alpha A)^N) B, so

* delta(x; u) = J_N u exactly, for every mu (no smoothing bias);
* the estimator's mean over Gaussian u is J_N^T v (the N-step PATH Jacobian, not J_* = A^{-1} B)
  and its single-direction error covariance is ||a||^2 I + a a^T, a = J_N^T v (Isserlis), so
  E||<delta, v> u - a||^2 = (p + 1) ||a||^2; for u uniform on the sphere scaled by p it is
  (p - 1) ||a||^2;
* PZOBO is SGD on F_N(x) = f(x, y^N(x)) with noise (u u^T - I) a(x), a(x) affine in x, so the
  second moment of x_k - x* obeys an exact matrix recursion (:func:`expected_sq_error`).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree

import bilevel as bl
from bilevel.core import sampling
from bilevel.core.schedules import inverse_power
from bilevel.solvers.zeroth_order.pzobo import sample_directions


@pytest.fixture(scope="module")
def quad():
    return bl.problems.quadratic()  # dx = p = 10, dy = d = 50, mu_g = 1, L_g = 10


# ---- closed forms --------------------------------------------------------------------------
def path_model(ref, lr_inner, N):
    """F_N(x) = f(x, y^N(x)) for N GD steps from y_0 = 0, as (J_N, H_N, x*_N, K, a*).

    y^N(x) = J_N x + c_N; grad_y f = M x + r0 with M = J_N - D; the PZOBO estimate is
    H_N x + h + (u u^T - I) a(x) with a(x) = J_N^T (M x + r0) = K (x - x*_N) + a*.
    """
    d, p = ref.B.shape
    P = np.linalg.matrix_power(np.eye(d) - lr_inner * ref.A, N)
    S = np.linalg.solve(ref.A, np.eye(d) - P)
    J, c = S @ ref.B, S @ ref.b
    M, r0 = J - ref.D, c - ref.e
    H = M.T @ M + ref.rho * np.eye(p)
    x_n = -np.linalg.solve(H, M.T @ r0)
    return J, H, x_n, J.T @ M, J.T @ (M @ x_n + r0)


def expected_sq_error(ref, lr_inner, N, betas, *, Q=1, method="pzobo", mu=0.01):
    """E||x_K - x*||^2 after the outer steps ``betas`` from x_0 = 0 (Gaussian directions).

    e_k = x_k - x*_N obeys e_{k+1} = (I - beta H_N) e_k - beta xi_k with E[xi | e] = 0, so
    S = E[e e^T] evolves as S <- T S T^T + beta^2 E[xi xi^T] exactly, where for Q directions
    * PZOBO: E[xi xi^T] = (tr W I + W) / Q with W = E[a a^T]
      = K S K^T + K m a*^T + a* m^T K^T + a* a*^T (m = E e);
    * HOZOG: E[xi xi^T] = (tr(H S H) I + H S H + (mu^2/4) C) / Q with
      C = E[(u^T H u)^2 u u^T] = ((tr H)^2 + 2 tr H^2) I + 4 tr(H) H + 8 H^2 (Isserlis).
    """
    J, H, x_n, K, a = path_model(ref, lr_inner, N)
    p = H.shape[0]
    eye = np.eye(p)
    C = (np.trace(H) ** 2 + 2 * np.trace(H @ H)) * eye + 4 * np.trace(H) * H + 8 * H @ H
    m = -x_n.copy()
    S = np.outer(m, m)
    for beta in betas:
        T = eye - beta * H
        if method == "pzobo":
            Km = K @ m
            W = K @ S @ K.T + np.outer(Km, a) + np.outer(a, Km) + np.outer(a, a)
            noise = np.trace(W) * eye + W
        else:
            HSH = H @ S @ H
            noise = np.trace(HSH) * eye + HSH + mu**2 / 4 * C
        S = T @ S @ T.T + beta**2 / Q * noise
        m = T @ m
    bias = x_n - ref.x_star  # finite-N bias: x_K - x* = e_K + bias
    return float(np.trace(S) + 2 * m @ bias + bias @ bias)


# ---- a numpy replica of Algorithm 1 with the official code's options --------------------------
def numpy_directions(dir_key, Q, sizes, mode):
    """The solver's directions rebuilt from its key convention (see ``sample_directions``)."""
    z = np.asarray(jax.random.normal(dir_key, (Q, sum(sizes)), dtype=jnp.float64))
    if mode == "gaussian":
        return z, 1.0
    if mode == "sphere_scaled":
        return z / np.linalg.norm(z, axis=1, keepdims=True), float(z.shape[1])
    parts = np.split(z, np.cumsum(sizes)[:-1], axis=1)  # per tensor, in ravel_pytree order
    return np.concatenate([q / np.linalg.norm(q, axis=1, keepdims=True) for q in parts], 1), 1.0


def numpy_inner_path(ref, x, y, lr, N, opt="gd", momentum=0.9, betas=(0.9, 0.999), eps=1e-8):
    m, v = np.zeros_like(y), np.zeros_like(y)  # a fresh optimiser state per path (P2)
    for t in range(1, N + 1):
        g = ref.A @ y - ref.B @ x - ref.b
        if opt == "gd":
            y = y - lr * g
        elif opt == "momentum":  # PyTorch SGD momentum: v <- m v + g; y <- y - lr v
            m = momentum * m + g
            y = y - lr * m
        else:
            m = betas[0] * m + (1 - betas[0]) * g
            v = betas[1] * v + (1 - betas[1]) * g * g
            y = y - lr * (m / (1 - betas[0] ** t)) / (np.sqrt(v / (1 - betas[1] ** t)) + eps)
    return y


def numpy_adam(g, m, v, t, betas=(0.9, 0.999), eps=1e-8):
    m = betas[0] * m + (1 - betas[0]) * g
    v = betas[1] * v + (1 - betas[1]) * g * g
    return (m / (1 - betas[0] ** t)) / (np.sqrt(v / (1 - betas[1] ** t)) + eps), m, v


REPLICA_CASES = {
    "paper": dict(num_directions=2),
    "code-momentum": dict(
        num_directions=3,
        directions="sphere_scaled",
        inner_optimizer="momentum",
        warm_start=True,
        outer_optimizer="adam",
    ),
    "code-adam-sequential": dict(  # also: the Q paths one after another (lax.map)
        num_directions=2,
        directions="sphere_unscaled_per_tensor",
        inner_optimizer="adam",
        smoothing=0.1,
        parallel_directions=False,
    ),
}


@pytest.mark.parametrize("case", sorted(REPLICA_CASES))
def test_matches_numpy_replica_step_by_step(quad, case):
    """Three steps of Algorithm 1 (eqs. 4, 5) in numpy, with the directions rebuilt from the
    solver's key convention (state key -> (next, minibatch, direction) keys). rtol 1e-10: the
    forward difference over mu = 0.01 costs about two of float64's sixteen digits."""
    opts = REPLICA_CASES[case]
    ref, N, lr_in, lr_out = quad.reference, 6, 0.15, 0.05
    solver = bl.solvers.make("pzobo", lr_outer=lr_out, lr_inner=lr_in, inner_steps=N, **opts)
    Q, mu = solver.with_directions(quad).num_directions, solver.smoothing
    state = solver.init(quad, jax.random.PRNGKey(3))
    step = jax.jit(solver.step)
    x, y, m, v = np.zeros(10), np.zeros(50), np.zeros(10), np.zeros(10)
    for k in range(3):
        nxt, _, dir_key = jax.random.split(state.key, 3)
        u, c = numpy_directions(dir_key, Q, [10], solver.directions)
        y_init = y if solver.warm_start else np.zeros(50)
        path = lambda x_, y_=y_init: numpy_inner_path(ref, x_, y_, lr_in, N, solver.inner_optimizer)  # noqa: E731
        y = path(x)
        r = y - ref.D @ x - ref.e  # grad_y f(x, y^N)
        hyper = -ref.D.T @ r + ref.rho * x  # grad_x f(x, y^N)
        for j in range(Q):
            delta = (path(x + mu * u[j]) - y) / mu
            hyper = hyper + c / Q * (delta @ r) * u[j]
        if solver.outer_optimizer == "adam":
            hyper, m, v = numpy_adam(hyper, m, v, k + 1)
        x = x - lr_out * hyper
        state = step(quad, state)
        np.testing.assert_allclose(state.x, x, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(state.y, y, rtol=1e-10, atol=1e-13)
        np.testing.assert_array_equal(state.key, nxt)
    cnt = state.counts
    assert (int(cnt.grad_g), int(cnt.grad_f), int(cnt.hvp), int(cnt.cross)) == (
        3 * (Q + 1) * N,
        3,
        0,
        0,
    )  # Hessian-free: (Q + 1) N gradients of g and one fused gradient of f per step


# ---- the Jacobian estimator: mean, second moment, exactness ---------------------------------
_coefficients = jax.jit(
    lambda solver, *args: solver.coefficients(*args), static_argnums=0
)  # one compilation per distinct (frozen, hashable) solver


def _single_direction_estimates(problem, mode, Q, *, lr=0.1, N=5, seed=11):
    """Q single-direction estimates c <delta_j, v> u_j of J_N^T v at a random x (flattened)."""
    solver = bl.solvers.make("pzobo", lr_inner=lr, inner_steps=N, num_directions=Q, directions=mode)
    x_flat = np.random.default_rng(seed).standard_normal(10)
    _, unravel = ravel_pytree(problem.x0)
    x = unravel(jnp.asarray(x_flat))
    key = jax.random.PRNGKey(seed)
    u, c = sample_directions(key, x, Q, mode)
    mb = solver.minibatches(problem, key, outer=1, inner=solver.inner_draws)
    coeffs, _, y_n = _coefficients(solver, problem, mb, x, problem.y0, lr, u)
    u_flat = jax.vmap(lambda t: ravel_pytree(t)[0])(u)
    samples = np.asarray(c * coeffs[:, None] * u_flat)
    ref = problem.reference
    v = np.asarray(ravel_pytree(y_n)[0]) - ref.D @ x_flat - ref.e  # grad_y f(x, y^N)
    J_N = path_model(ref, lr, N)[0]
    J_star = np.linalg.solve(ref.A, ref.B)
    return samples, J_N.T @ v, J_star.T @ v


@pytest.mark.parametrize("mode, var_factor", [("gaussian", 11), ("sphere_scaled", 9)])
def test_jacobian_estimator_mean_and_second_moment(quad, mode, var_factor):
    """Spec checks (ii), (iii). With N = 5, alpha = 0.1, J_N is far from J_* (0.9^5 = 0.59 of
    it remains), and the mean must match J_N^T v, not J_*^T v: to 4.5 standard errors per
    coordinate (p = 10 coordinates: a false alarm has probability ~1e-4). The centred second
    moment is (p + 1) ||a||^2 for Gaussian u and (p - 1) ||a||^2 for p-scaled sphere u (module
    docstring); checked to 10% and to 4 of its own standard errors."""
    Q = 20_000
    samples, a_N, a_star = _single_direction_estimates(quad, mode, Q)
    se = samples.std(axis=0, ddof=1) / np.sqrt(Q)
    z_path = np.abs(samples.mean(0) - a_N) / se
    assert z_path.max() < 4.5, z_path
    z_star = np.abs(samples.mean(0) - a_star) / se
    assert z_star.max() > 10, z_star  # the test tells J_N from J_*
    sq = np.sum((samples - a_N) ** 2, axis=1)
    predicted = var_factor * a_N @ a_N
    assert abs(sq.mean() / predicted - 1) < 0.10
    assert abs(sq.mean() - predicted) < 4 * sq.std(ddof=1) / np.sqrt(Q)


def test_per_tensor_unit_directions_shrink_each_block_by_its_size():
    """Spec section 3.4: the code's per-tensor unit directions have E[u u^T] = blockdiag(I/p_i),
    so the indirect term's mean is J_N^T v scaled by 1/p_i per leaf (here p_1 = p_2 = 5)."""
    tree = bl.problems.quadratic(pytree=True)
    Q = 20_000
    samples, a_N, _ = _single_direction_estimates(tree, "sphere_unscaled_per_tensor", Q)
    se = samples.std(axis=0, ddof=1) / np.sqrt(Q)
    assert (np.abs(samples.mean(0) - a_N / 5) / se).max() < 4.5
    u, c = sample_directions(jax.random.PRNGKey(0), tree.x0, 4, "sphere_unscaled_per_tensor")
    for leaf in jax.tree.leaves(u):
        np.testing.assert_allclose(np.linalg.norm(leaf, axis=1), 1.0, rtol=1e-12)
    assert c == 1.0


def _coefficients_for_mu(solver, problem, mb, x, u, mu):
    """The coefficients a solver with smoothing ``mu`` would give, from ``solver`` (smoothing
    mu0) without recompiling: perturbing by mu0 (s u) is perturbing by (mu0 s) u, and
    delta(mu0; s u) = s delta(mu0 s; u), so c(mu; u) = c(mu0; s u) / s with s = mu / mu0."""
    s = mu / solver.smoothing
    scaled = jax.tree.map(lambda leaf: s * leaf, u)
    return (
        np.asarray(_coefficients(solver, problem, mb, x, problem.y0, solver.lr_inner, scaled)[0])
        / s
    )


def test_delta_is_exactly_the_path_jacobian_for_every_mu(quad):
    """Spec check (i): y^N is affine in x, so delta = J_N u for every mu (1e-3 and 10)."""
    ref, N, lr, Q = quad.reference, 7, 0.12, 6
    J_N = path_model(ref, lr, N)[0]
    x = jnp.asarray(np.random.default_rng(1).standard_normal(10))
    u, _ = sample_directions(jax.random.PRNGKey(5), x, Q, "gaussian")
    solver = bl.solvers.make("pzobo", lr_inner=lr, inner_steps=N, num_directions=Q)
    mb = solver.minibatches(quad, jax.random.PRNGKey(0), outer=1, inner=N)
    y_n = _coefficients(solver, quad, mb, x, quad.y0, lr, u)[2]
    v = np.asarray(y_n) - ref.D @ np.asarray(x) - ref.e  # the solver's v = grad_y f(x, y^N)
    for mu in (1e-3, 10.0):
        # rtol 1e-9: the difference of two O(1) iterates over mu = 1e-3 loses 3 digits
        np.testing.assert_allclose(
            _coefficients_for_mu(solver, quad, mb, x, u, mu),
            (np.asarray(u) @ J_N.T) @ v,
            rtol=1e-9,
        )


# ---- PZOBO-S: one minibatch per inner step, shared by all paths ----------------------------
@pytest.fixture(scope="module")
def small_sto():
    return bl.problems.quadratic(dx=3, dy=4, stochastic=True, n_samples=40)


def stochastic_quadratic_grads(problem):
    """Per-minibatch gradients of the stochastic quadratic in numpy (module doc of
    ``bilevel.problems.quadratic``): g_i = 1/2 y'A0 y + 1/2 (w_i'y)^2 - y'(B0 x + w_i v_i'x + b_i)
    + c_x/2 |x|^2 with A0 = A - mean w w', B0 = B - mean w v'; f_j = 1/2 |y - D x - e_j|^2 + ..."""
    ref, data = problem.reference, problem.inner_data
    w, v, b = (np.asarray(data[k]) for k in ("w", "v", "b"))
    e = np.asarray(problem.outer_data["e"])
    A0, B0 = ref.A - w.T @ w / len(w), ref.B - w.T @ v / len(w)

    def grad_y_g(x, y, rows):
        wr = w[rows]
        return (
            A0 @ y
            + wr.T @ (wr @ y) / len(rows)
            - B0 @ x
            - wr.T @ (v[rows] @ x) / len(rows)
            - b[rows].mean(0)
        )

    def grads_f(x, y, rows):
        r = y - ref.D @ x - e[rows].mean(0)
        return -ref.D.T @ r + ref.rho * x, r

    return grad_y_g, grads_f


def test_pzobo_s_feeds_one_minibatch_to_all_paths(small_sto):
    """Algorithm 2 in numpy: step t of the unperturbed AND of every perturbed path uses the rows
    of inner draw t (read from the solver's own draws, rebuilt from its key convention), and
    the outer gradient the one outer draw D_F. rtol 1e-10 as for Algorithm 1."""
    p, N, Q, bs, lr, mu = small_sto, 3, 2, 5, 0.1, 0.01
    solver = bl.solvers.make(
        "pzobo-s", lr_outer=0.1, lr_inner=lr, batch_size=bs, inner_steps=N, num_directions=Q
    )
    state = solver.init(p, jax.random.PRNGKey(2))
    new = jax.jit(solver.step)(p, state)
    _, batch_key, dir_key = jax.random.split(state.key, 3)
    mb = sampling.minibatches(batch_key, p.outer_data, p.inner_data, bs, outer=1, inner=N)
    inner_rows, outer_rows = np.asarray(mb.inner_idx), np.asarray(mb.outer_idx)
    assert inner_rows.shape == (N, bs) and outer_rows.shape == (1, bs)  # N draws in all
    u, _ = numpy_directions(dir_key, Q, [3], "gaussian")
    grad_y_g, grads_f = stochastic_quadratic_grads(p)

    def path(x):
        y = np.zeros(4)
        for t in range(N):
            y = y - lr * grad_y_g(x, y, inner_rows[t])  # draw t, whichever path
        return y

    x = np.zeros(3)
    y_n = path(x)
    gx, gy = grads_f(x, y_n, outer_rows[0])
    hyper = gx + sum(((path(x + mu * u[j]) - y_n) / mu @ gy) * u[j] for j in range(Q)) / Q
    np.testing.assert_allclose(new.x, x - 0.1 * hyper, rtol=1e-10)
    np.testing.assert_allclose(new.y, y_n, rtol=1e-10)
    assert (int(new.counts.samples_inner), int(new.counts.samples_outer)) == (N * bs, bs)
    assert int(new.counts.grad_g) == (Q + 1) * N


def test_shared_minibatches_make_delta_exact_and_independent_ones_blow_up():
    """Spec check (vii). Every sample g_i of the stochastic quadratic is quadratic in (x, y), so
    along a FIXED minibatch sequence y^N is affine in x and delta = J_N^S u for every mu: the
    coefficients at mu = 0.01 and mu = 1 agree to 1e-8 only if both paths saw identical
    batches. With independent draws per path (``shared_batches=False``) the coefficient is
    n_j / mu + d_j with the SGD-noise difference n_j fixed by the draws: at mu = 1e-3 and 1e-2
    the n_j / mu part dominates, so the spread over directions scales by 10 (9 to 10.1)."""
    p = bl.problems.quadratic(stochastic=True, n_samples=500)
    x = jnp.asarray(np.random.default_rng(0).standard_normal(10))
    Q, N, key = 200, 5, jax.random.PRNGKey(4)
    u, _ = sample_directions(key, x, Q, "gaussian")

    def coeffs(shared, mu):
        solver = bl.solvers.make(
            "pzobo-s",
            lr_inner=0.1,
            batch_size=32,
            inner_steps=N,
            num_directions=Q,
            shared_batches=shared,
        )
        mb = solver.minibatches(p, key, outer=1, inner=solver.inner_draws)
        return _coefficients_for_mu(solver, p, mb, x, u, mu)

    shared = coeffs(True, 0.01)
    np.testing.assert_allclose(shared, coeffs(True, 1.0), rtol=1e-8)
    spread_1e3, spread_1e2 = coeffs(False, 1e-3).std(), coeffs(False, 1e-2).std()
    print(f"spread: shared {shared.std():.3g}, independent {spread_1e2:.3g} / {spread_1e3:.3g}")
    assert 9.0 < spread_1e3 / spread_1e2 < 10.1
    assert spread_1e2 > 5 * shared.std()


@pytest.mark.parametrize("inner_optimizer", ["gd", "adam"])
@pytest.mark.parametrize("num_directions", [1, 3])
def test_joint_scan_of_all_paths_matches_the_paths_run_one_by_one(inner_optimizer, num_directions):
    """With shared batches and parallel directions the Q + 1 inner paths run in ONE scan that
    draws each inner batch once (``joint_paths``); run one after another (``lax.map``,
    ``inner_path``, each drawing the batch itself) they must give the same y^N and the same
    coefficients on the same minibatches: float64 round-off, rtol 1e-12 (Adam's state is
    broadcast to the Q paths and must start fresh in each; Q = 1 runs its one perturbed path
    without vmap)."""
    p = bl.problems.quadratic(stochastic=True, n_samples=500)
    x = jnp.asarray(np.random.default_rng(2).standard_normal(10))
    key = jax.random.PRNGKey(5)
    u, _ = sample_directions(key, x, num_directions, "gaussian")
    results = []
    for parallel in (True, False):
        solver = bl.solvers.make(
            "pzobo-s",
            lr_inner=0.05,
            batch_size=32,
            inner_steps=6,
            num_directions=num_directions,
            inner_optimizer=inner_optimizer,
            parallel_directions=parallel,
        )
        mb = solver.minibatches(p, key, outer=1, inner=solver.inner_draws)
        results.append(_coefficients(solver, p, mb, x, p.y0, solver.lr_inner, u))
    (c_joint, d_joint, y_joint), (c_seq, d_seq, y_seq) = results
    np.testing.assert_allclose(c_joint, c_seq, rtol=1e-12)
    np.testing.assert_allclose(y_joint, y_seq, rtol=1e-12)
    np.testing.assert_allclose(d_joint, d_seq, rtol=1e-12)
    assert np.abs(np.asarray(c_joint)).min() > 1e-3  # the paths did move apart


def test_pzobo_s_is_pzobo_on_deterministic_problems(quad):
    """PZOBO-S changes only defaults: without data it runs the same Algorithm 1 (so PZOBO's
    Done-means on the deterministic quadratic covers it), and "auto" differs: 1/L (Thm 1) vs
    2/(L + mu_g) (Thm 2); here L = max(L_f, L_g) = max(1, 10)."""
    from bilevel.solvers.zeroth_order.pzobo import PZOBO
    from bilevel.solvers.zeroth_order.pzobo_s import PZOBOS

    for method in ("step", "coefficients", "hypergradient", "inner_path", "_coefficient"):
        assert getattr(PZOBOS, method) is getattr(PZOBO, method), method
    assert (
        bl.solvers.make("pzobo-s").batch_size == 256 and bl.solvers.make("pzobo").batch_size is None
    )
    assert bl.solvers.make("pzobo").resolve(quad).lr_inner == pytest.approx(0.1, rel=1e-9)
    assert bl.solvers.make("pzobo-s").resolve(quad).lr_inner == pytest.approx(2 / 11, rel=1e-9)


def test_auto_inner_step_uses_the_larger_of_L_f_and_L_g(quad):
    """Theorems 1-2 take L = max(L_f, L_g) (Assumptions A2-A3), not L_g alone. With the outer
    loss scaled by 25, d2f/dy2 = 25 I, so L = L_f = 25 > L_g = 10: "auto" is 1/25 for PZOBO and
    2/(25 + mu_g) = 2/26 for PZOBO-S (it was 1/10 and 2/11). A nonconvex f counts its most
    negative curvature (the spectral norm). Lanczos is exact on these spectra (rel 1e-9)."""
    from bilevel.analysis.diagnose import outer_smoothness

    sharp = quad.replace(outer=lambda x, y, b: 25.0 * quad.outer(x, y, b))
    assert bl.solvers.make("pzobo").resolve(sharp).lr_inner == pytest.approx(1 / 25, rel=1e-9)
    assert bl.solvers.make("pzobo-s").resolve(sharp).lr_inner == pytest.approx(2 / 26, rel=1e-9)
    assert bl.solvers.make("pzobo", lr_inner=0.3).resolve(sharp).lr_inner == 0.3  # given: kept
    assert outer_smoothness(quad) == pytest.approx(1.0, rel=1e-9)
    assert outer_smoothness(bl.problems.quadratic(stochastic=True)) == pytest.approx(1.0, rel=1e-9)
    curv = jnp.asarray([-15.0, 3.0, 0.5])
    saddle = bl.BilevelProblem(
        outer=lambda x, y, b: 0.5 * jnp.sum(curv * y**2),
        inner=lambda x, y, b: 0.5 * jnp.sum(y**2) - x @ y,
        x0=jnp.zeros(3),
        y0=jnp.ones(3),
    )
    assert outer_smoothness(saddle) == pytest.approx(15.0, rel=1e-9)
    assert bl.solvers.make("pzobo").resolve(saddle).lr_inner == pytest.approx(1 / 15, rel=1e-9)


def test_pzobo_s_halves_its_auto_inner_step_with_minibatches(monkeypatch):
    """Theorem 2's 2/(L + mu_g) has no margin; a run on minibatches takes half of it (each path
    step sees a new minibatch Hessian), IBCG's rule. With the smoothness pinned at the full
    data's L = 10 (mu_g = 1), the full-batch step is 2/11 and the minibatch one 1/11."""
    from bilevel.solvers.zeroth_order import pzobo_s

    p = bl.problems.quadratic(stochastic=True)
    monkeypatch.setattr(pzobo_s, "auto_smoothness", lambda problem, batch=None: 10.0)
    full = bl.solvers.make("pzobo-s", batch_size=None).resolve(p).lr_inner
    sampled = bl.solvers.make("pzobo-s", batch_size=32).resolve(p).lr_inner
    assert full == pytest.approx(2 / 11, rel=1e-6) and sampled == pytest.approx(1 / 11, rel=1e-6)


# ---- memory ------------------------------------------------------------
def test_no_inner_path_is_stored(quad):
    """The compiled step's scratch memory does not grow with N (a stored path would add
    N (Q + 1) d * 8 bytes = 640 kB at N = 400): the scans carry only the current iterates."""

    def temp_bytes(N):
        solver = bl.solvers.make(
            "pzobo", lr_outer=0.01, lr_inner=0.1, inner_steps=N, num_directions=3
        )
        state = solver.init(quad, jax.random.PRNGKey(0))
        stats = jax.jit(solver.step).lower(quad, state).compile().memory_analysis()
        return stats.temp_size_in_bytes

    small, large = temp_bytes(5), temp_bytes(400)
    assert large <= small + 4096, (small, large)


# ---- Done-means ------------------------------------------------------------------------------
def test_deterministic_quadratic_converges_to_the_predicted_error(quad):
    """Done-means: ||x_K - x*|| <= 1e-2 ||x_0 - x*|| (x_0 = 0), mean over seeds 0..4.

    The bias and variance of PZOBO here, with defaults (N = 20, Q = "auto" = p + 1 = 11,
    mu = 0.01, Gaussian u) and lr_inner = 0.18: smoothing bias 0 (affine path); finite-N bias
    ||x*_N - x*|| = 0.4% of ||x*||; direction variance (p + 1) ||a||^2 / Q with
    a = J_N^T grad_y f != 0 at x*, which no constant step removes. A Robbins-Monro step
    beta_k = 0.4 / (k + 4) drives it down like 1/sqrt(k): the exact recursion predicts an RMS
    (bias included) of 0.45% at K = 10000 (with Q = 1: 1.04%), and the run must match it
    (factor 0.6-1.5: five seeds estimate an RMS to about +-25%)."""
    ref, K = quad.reference, 10_000
    sched = inverse_power(0.1, 1.0, 4.0)
    solver = bl.solvers.make("pzobo", lr_outer=sched, lr_inner=0.18)
    res = bl.solve(quad, solver, steps=K, eval_every=K, seeds=range(5), progress=False)
    err = res.history[res.history.step == K].x_err.to_numpy() / np.linalg.norm(ref.x_star)
    Q = solver.with_directions(quad).num_directions  # "auto": p + 1 = 11
    predicted = np.sqrt(expected_sq_error(ref, 0.18, 20, [sched(k) for k in range(K)], Q=Q))
    predicted /= np.linalg.norm(ref.x_star)
    print(f"PZOBO x_err/||x*|| at K={K}: mean {err.mean():.2e}, predicted RMS {predicted:.2e}")
    assert predicted < 1e-2
    assert err.mean() <= 1e-2
    assert 0.6 * predicted < np.sqrt(np.mean(err**2)) < 1.5 * predicted


def test_constant_step_floor_matches_the_closed_form(quad):
    """The stationary error of a constant step is the Lyapunov floor of the recursion: the time
    average of ||x_k - x*||^2 over steps 300..1200 (mixing time 1/(beta h_min) = 25 steps), one
    value per seed, 8 seeds; agreement within 4 standard errors of the seed mean."""
    ref, beta = quad.reference, 0.02
    solver = bl.solvers.make("pzobo", lr_outer=beta, lr_inner=0.18)
    res = bl.solve(quad, solver, steps=1200, eval_every=20, seeds=range(8), progress=False)
    h = res.history[res.history.step >= 300]
    per_seed = (h.x_err**2).groupby(h.seed).mean().to_numpy()
    Q = solver.with_directions(quad).num_directions  # "auto": p + 1 = 11
    predicted = expected_sq_error(ref, 0.18, 20, [beta] * 3000, Q=Q)
    se = per_seed.std(ddof=1) / np.sqrt(len(per_seed))
    print(f"floor: measured {per_seed.mean():.4f} +- {se:.4f}, predicted {predicted:.4f}")
    assert abs(per_seed.mean() - predicted) < 4 * se


def test_pzobo_s_stochastic_quadratic_gradient_falls_tenfold():
    """Done-means: on the stochastic quadratic with batch_size = 32, the mean over seeds 0..4 of
    ||grad F(x_K)|| falls at least 10x (measured 25x at K = 500; lr_inner = 2/(L_g + mu_g),
    Theorem 2's rule, which "auto" gives: see test_pzobo_s_is_pzobo_on_deterministic_problems)."""
    p = bl.problems.quadratic(stochastic=True)
    sched = inverse_power(0.1, 1.0, 4.0)
    solver = bl.solvers.make("pzobo-s", lr_outer=sched, lr_inner=2 / 11, batch_size=32)
    res = bl.solve(p, solver, steps=500, eval_every=500, seeds=range(5), progress=False)
    g = res.history.groupby("step").grad_norm.mean()
    print(f"PZOBO-S grad_norm: {g.iloc[0]:.3f} -> {g.iloc[-1]:.4f} ({g.iloc[0] / g.iloc[-1]:.1f}x)")
    assert g.iloc[-1] <= g.iloc[0] / 10


# ---- options ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad",
    [
        {"num_directions": 0},
        {"smoothing": 0.0},
        {"smoothing": float("nan")},
        {"directions": "rademacher"},
        {"inner_optimizer": "lbfgs"},
        {"outer_optimizer": "rmsprop"},
        {"inner_optimizer": 0.9},
        {"inner_optimizer": None},
        {"warm_start": 1},
        {"inner_steps": 0},
        {"lr_inner": "fast"},
    ],
)
def test_bad_options_are_refused(bad):
    for name in ("pzobo", "pzobo-s"):
        with pytest.raises(ValueError, match=next(iter(bad))):
            bl.solvers.make(name, **bad)


def test_an_unknown_inner_optimizer_names_the_field_and_the_choices():
    for bad in ("lbfgs", 0.9, ("momentum", 0.9)):
        with pytest.raises(
            ValueError,
            match=r"PZOBO\(inner_optimizer=.*\) is unknown; use one of "
            r"gd, momentum, adam or an optax.GradientTransformation",
        ):
            bl.solvers.make("pzobo", inner_optimizer=bad)


def test_an_optax_transformation_is_an_inner_optimizer(quad):
    """The names are optax transformations without a learning rate: "momentum" is
    ``optax.trace(decay=0.9)`` and "adam" ``optax.scale_by_adam()``, to the last bit; another
    transformation is used as given."""

    def x_after(inner_optimizer, steps=3):
        solver = bl.solvers.make(
            "pzobo", lr_outer=0.05, lr_inner=0.15, inner_steps=6, inner_optimizer=inner_optimizer
        )
        state = solver.init(quad, jax.random.PRNGKey(3))
        step = jax.jit(solver.step)  # one compilation for the steps (a new jit recompiles)
        for _ in range(steps):
            state = step(quad, state)
        return np.asarray(state.x)

    momentum, adam = x_after("momentum"), x_after("adam")
    np.testing.assert_array_equal(x_after(optax.trace(decay=0.9)), momentum)
    assert not np.array_equal(x_after(optax.trace(decay=0.5)), momentum)
    np.testing.assert_array_equal(x_after(optax.scale_by_adam()), adam)
    assert not np.array_equal(x_after(optax.scale_by_adam(b1=0.5)), adam)
    np.testing.assert_array_equal(x_after(optax.identity()), x_after("gd"))

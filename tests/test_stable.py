"""STABLE (Chen, Sun, Xiao, Yin, AISTATS 2022, Algorithm 1, eqs. (8)-(9)) against exact answers.

Notation of the deterministic quadratic (bl.problems.quadratic): g = 1/2 y'Ay - y'(Bx + b) +
c_x/2 |x|^2, so d2g/dy2 = A, d2g/dxdy = -B' (dim x by dim y), y*(x) = A^{-1}(Bx + b).
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bilevel as bl
from bilevel import oracles
from bilevel.core import sampling
from bilevel.solvers.second_order.stable import (
    DENSE_DIM_LIMIT,
    DenseHessianWarning,
    clip_frobenius,
    floor_eigenvalues,
)


@pytest.fixture(scope="module")
def quad():
    return bl.problems.quadratic()  # dx = 10, dy = 50, mu_g = 1, L_g = 10


def logistic_ho(stochastic: bool, n: int = 40, d: int = 5, seed: int = 0):
    """The paper's HO structure (eq. (32)) with a sample-dependent x-y coupling, so that both
    d2g/dy2 and d2g/dxdy depend on the point AND on the sample (a quadratic's do not):
    g_i = log(1 + exp(-b_i (a_i'y + c_i'x))) + sum_j x_j y_j^2,  x in [0.1, 10]^d."""
    rng = np.random.default_rng(seed)
    train = {
        "a": rng.standard_normal((n, d)),
        "c": 0.3 * rng.standard_normal((n, d)),
        "b": np.sign(rng.standard_normal(n)),
    }
    val = {"a": rng.standard_normal((n, d)), "b": np.sign(rng.standard_normal(n))}
    full_tr = jax.tree.map(jnp.asarray, train)
    full_va = jax.tree.map(jnp.asarray, val)

    def inner(x, y, batch):
        batch = full_tr if batch is None else batch
        z = batch["b"] * (batch["a"] @ y + batch["c"] @ x)
        return jnp.mean(jnp.logaddexp(0.0, -z)) + jnp.sum(x * y**2)

    def outer(x, y, batch):
        batch = full_va if batch is None else batch
        return jnp.mean(jnp.logaddexp(0.0, -batch["b"] * (batch["a"] @ y)))

    return bl.BilevelProblem(
        outer=outer,
        inner=inner,
        x0=jnp.ones(d),
        y0=0.1 * jnp.ones(d),
        outer_data=val if stochastic else None,
        inner_data=train if stochastic else None,
        x_set=bl.sets.Box(0.1, 10.0),
        name="logistic-ho",
    )


# ---- the projections (9a) and (9b) ---------------------------------------------------------
def test_clip_frobenius():
    """Pbar(M) = M min(1, C/||M||_F): inside the ball unchanged, outside scaled onto the sphere
    (the Frobenius projection onto a ball is radial). Exact up to one rounding (1e-15)."""
    M = np.random.default_rng(0).standard_normal((4, 6))
    norm = np.linalg.norm(M)
    np.testing.assert_array_equal(clip_frobenius(jnp.asarray(M), 2 * norm), M)
    np.testing.assert_array_equal(clip_frobenius(jnp.asarray(M), None), M)
    out = np.asarray(clip_frobenius(jnp.asarray(M), 0.5 * norm))
    np.testing.assert_allclose(np.linalg.norm(out), 0.5 * norm, rtol=1e-14)
    np.testing.assert_allclose(out, 0.5 * M, rtol=1e-14)
    assert np.all(np.asarray(clip_frobenius(jnp.zeros((3, 2)), 1.0)) == 0)  # no 0/0


def test_floor_eigenvalues_is_the_frobenius_projection():
    """Punder(M) = Q max(Lam, mu) Q': symmetric, spectrum >= mu, idempotent, eigenvalues above
    the floor untouched, and no feasible matrix is closer to M in the Frobenius norm (checked
    against 200 random feasible Z). Tolerances 1e-12: eigh is backward stable to ~1e-15 ||M||."""
    rng = np.random.default_rng(1)
    S = rng.standard_normal((6, 6))
    M = S + S.T + 0.1 * rng.standard_normal((6, 6))  # slightly asymmetric input
    mu = 0.7
    P, lam, Q = map(np.asarray, floor_eigenvalues(jnp.asarray(M), mu))
    sym = 0.5 * (M + M.T)
    ref_lam, ref_Q = np.linalg.eigh(sym)
    np.testing.assert_allclose(P, (ref_Q * np.maximum(ref_lam, mu)) @ ref_Q.T, atol=1e-12)
    np.testing.assert_allclose(P, P.T, atol=1e-14)
    assert np.linalg.eigvalsh(P)[0] >= mu - 1e-12
    np.testing.assert_allclose(lam, np.maximum(ref_lam, mu), atol=1e-12)
    np.testing.assert_allclose((Q * lam) @ Q.T, P, atol=1e-12)  # the returned eigh is of P
    again = np.asarray(floor_eigenvalues(jnp.asarray(P), mu)[0])
    np.testing.assert_allclose(again, P, atol=1e-12)  # idempotent
    best = np.linalg.norm(M - P)
    for _ in range(200):
        R = rng.standard_normal((6, 6))
        Z = R @ R.T + mu * np.eye(6)  # a feasible point (Z >= mu I)
        assert np.linalg.norm(M - Z) >= best - 1e-12


def test_state_estimates_respect_the_projections():
    """After every step on noisy data with both projections active: ||H_xy||_F <= C_gxy,
    H_yy symmetric with lambda_min >= mu_g (spec test 8). mu_g = 1.5 lies above the smallest
    eigenvalue of the noisy minibatch Hessians (the true one is 1), C = 2 < ||B||_F ~ 6.9."""
    p = bl.problems.quadratic(dx=3, dy=6, stochastic=True, n_samples=64)
    solver = bl.solvers.make(
        "stable", lr_outer=0.05, lr_inner=0.1, batch_size=4, mu_g=1.5, max_cross_norm=2.0, tau=0.3
    )
    state = solver.init(p, jax.random.PRNGKey(0))
    step = jax.jit(solver.step)
    for _ in range(15):
        state = step(p, state)
        Hxy, Hyy = np.asarray(state.H_xy), np.asarray(state.H_yy)
        assert np.linalg.norm(Hxy) <= 2.0 * (1 + 1e-12)
        np.testing.assert_allclose(Hyy, Hyy.T, atol=1e-13)
        assert np.linalg.eigvalsh(Hyy)[0] >= 1.5 - 1e-10
    assert np.isclose(np.linalg.norm(Hxy), 2.0, rtol=1e-12)  # the clip was active
    assert np.isclose(np.linalg.eigvalsh(Hyy)[0], 1.5, rtol=1e-10)  # and so was the floor


# ---- sharp checks of the y-update with its correction term ---------------------------------
def test_y_error_recursion_is_exact_with_exact_hessians(quad):
    """Derivation (spec test 2). With exact matrices H_yy = A, H_xy = -B' and exact gradients,
    (8b) reads y+ = y - beta_k (A y - B x - b) + A^{-1} B (x+ - x). Since y* is affine,
    y*(x+) = y*(x) + A^{-1} B (x+ - x), and A y - B x - b = A (y - y*(x)); subtracting,
    e_{k+1} := y^{k+1} - y*(x^{k+1}) = (I - beta_k A) e_k  for ANY x-trajectory.
    Checked with decaying beta_k and an active box on x (the projected step is what (8b) uses).
    The prediction is exact, so only float64 round-off remains: 1e-13 on errors of size ~1;
    the drift it removes, A^{-1}B(x+ - x), is checked to be >= 1e-3 (ten orders larger)."""
    ref = quad.reference
    p = quad.replace(x_set=bl.sets.Box(-0.2, 0.2))
    solver = bl.solvers.make(
        "stable", lr_outer=0.05, lr_inner=0.1, mu_g=0.5, regime="strongly-convex", k0=5.0
    )
    state = solver.init(p, jax.random.PRNGKey(0))
    step = jax.jit(solver.step)
    e = np.asarray(state.y) - ref.y_star(state.x)
    clipped = 0
    for k in range(30):
        _, beta, _ = solver.step_sizes(k)
        new = step(p, state)
        dx = np.asarray(new.x) - np.asarray(state.x)
        clipped += np.any(np.abs(np.asarray(new.x)) == 0.2)
        e_new = np.asarray(new.y) - ref.y_star(new.x)
        np.testing.assert_allclose(e_new, e - float(beta) * ref.A @ e, rtol=0, atol=1e-13)
        if k < 10:
            assert np.linalg.norm(np.linalg.solve(ref.A, ref.B @ dx)) > 1e-3
        e, state = e_new, new
    assert clipped > 0  # the projection on x was active along the way


def test_y_error_recursion_with_the_eigenvalue_floor_active(quad):
    """With the floor mu_g = 2 above lambda_min(A) = 1, H_yy^k = Punder(A) =: P for every k (the
    STORM update of a constant Hessian stays at Punder(A)), so the correction predicts with
    P^{-1} instead of A^{-1}: e_{k+1} = (I - beta A) e_k + (P^{-1} - A^{-1}) B (x+ - x).
    A sharp check that the floored matrix is the one used in (8b). Tolerance as above."""
    ref = quad.reference
    solver = bl.solvers.make("stable", lr_outer=0.05, lr_inner=0.1, mu_g=2.0, tau=0.5)
    lam, Q = np.linalg.eigh(ref.A)
    P = (Q * np.maximum(lam, 2.0)) @ Q.T
    state = solver.init(quad, jax.random.PRNGKey(0))
    step = jax.jit(solver.step)
    e = np.asarray(state.y) - ref.y_star(state.x)
    for _ in range(10):
        new = step(quad, state)
        np.testing.assert_allclose(new.H_yy, P, atol=1e-12)
        dx = np.asarray(new.x) - np.asarray(state.x)
        e_new = np.asarray(new.y) - ref.y_star(new.x)
        drift = np.linalg.solve(P, ref.B @ dx) - np.linalg.solve(ref.A, ref.B @ dx)
        assert np.linalg.norm(drift) > 1e-4  # the floor visibly changes the prediction
        np.testing.assert_allclose(e_new, e - 0.1 * ref.A @ e + drift, rtol=0, atol=1e-13)
        e, state = e_new, new


def test_storm_estimate_is_exact_on_a_noise_free_nonquadratic_problem():
    """Spec test 3: with noise-free oracles the correction h^k - h^{k-1}, both at the same
    phi^k, carries the previous exact estimate to the new point, so H^k equals the exact
    d2g at (x^k, y^k) for ANY tau (here 0.05), although the Hessians change along the path.
    Round-off only (1e-12): the difference of two Hessians is added each step."""
    p = logistic_ho(stochastic=False)
    solver = bl.solvers.make("stable", lr_outer=0.5, lr_inner=0.5, mu_g=0.05, tau=0.05)
    state = solver.init(p, jax.random.PRNGKey(0))
    step = jax.jit(solver.step)
    exact = jax.jit(
        lambda x, y: (
            oracles.hessian_yy(p.inner, x, y, None),
            oracles.jacobian_xy(p.inner, x, y, None),
        )
    )
    first_Hyy = None
    for _ in range(8):
        new = step(p, state)
        # the new state's H^k was formed at (x^k, y^k) = the previous state's iterate
        exact_yy, exact_xy = exact(state.x, state.y)
        np.testing.assert_allclose(new.H_yy, exact_yy, atol=1e-12)
        np.testing.assert_allclose(new.H_xy, exact_xy, atol=1e-12)
        first_Hyy = new.H_yy if first_Hyy is None else first_Hyy
        state = new
    assert np.abs(np.asarray(state.H_yy) - np.asarray(first_Hyy)).max() > 1e-3  # they moved


def _falling_convexity_problem():
    """g = 1/2 sum_i x_i y_i^2 - sum_i y_i, so d2g/dy2 = diag(x), d2g/dxdy = diag(y) and
    y*(x) = 1/x; f = -w'y with w > 0, so F(x) = -sum_i w_i / x_i decreases as x does and the
    run drives x from x0 = 1 to the box floor 0.1: g's strong convexity min_i x_i falls tenfold."""
    w = jnp.asarray([1.0, 2.0, 3.0])
    return bl.BilevelProblem(
        outer=lambda x, y, b: -(w @ y),
        inner=lambda x, y, b: 0.5 * jnp.sum(x * y**2) - jnp.sum(y),
        x0=jnp.ones(3),
        y0=jnp.ones(3),
        x_set=bl.sets.Box(0.1, 10.0),
        name="falling-convexity",
    )


def test_auto_floor_follows_the_run():
    """mu_g="auto" floors H_yy^k at half lambda_min of the sampled Hessian at (x^k, y^k), here
    exactly diag(x^k), so the floor is min_i x_i^k / 2 and, the STORM estimate being exact
    without noise, H_yy^k = diag(x^k) although lambda_min falls from 1 to 0.1. A floor fixed at
    the start (half of lambda_min(x0) = 0.5, the former rule) would give diag(max(x^k, 0.5))
    once min_i x_i^k < 0.5, which happens here (checked). Round-off only (1e-12)."""
    p = _falling_convexity_problem()
    solver = bl.solvers.make("stable", lr_outer=0.05, lr_inner=0.5).resolve(p)
    assert solver.mu_g_init == pytest.approx(0.5, rel=1e-10)  # bl.diagnose at x0 = 1
    state = solver.init(p, jax.random.PRNGKey(0))
    step = jax.jit(solver.step)
    lowest = 1.0
    for _ in range(12):
        new = step(p, state)
        x = np.asarray(state.x)  # H^k and its floor are formed at (x^k, y^k)
        assert float(new.mu_g) == pytest.approx(0.5 * x.min(), rel=1e-12)
        np.testing.assert_allclose(new.H_yy, np.diag(x), atol=1e-12)
        np.testing.assert_allclose(new.H_xy, np.diag(np.asarray(state.y)), atol=1e-12)
        lowest = min(lowest, x.min())
        state = new
    assert lowest == pytest.approx(0.1, rel=1e-12)  # x reached the box floor


def test_auto_floor_keeps_the_previous_one_when_a_sample_is_singular():
    """Per-sample Hessians w_i w_i' of rank one (w_i = e_1 or e_2, batch 1) are never positive
    definite, so the floor stays at mu_g_init: half the full-data lambda_min of (e_1e_1' +
    e_2e_2')/2 = I/2 from bl.diagnose, 0.25, or the value given. Exact (eigvalsh of diag(1, 0)
    gives 0)."""
    data = {"w": jnp.eye(2)}
    p = bl.BilevelProblem(
        outer=lambda x, y, b: jnp.sum((y - 1.0) ** 2),
        inner=lambda x, y, b: 0.5 * jnp.mean((b["w"] @ y) ** 2) - x @ y,
        x0=jnp.zeros(2),
        y0=jnp.zeros(2),
        inner_data=data,
    )
    for given, expected in ((None, 0.25), (0.3, 0.3)):
        solver = bl.solvers.make(
            "stable", lr_outer=0.1, lr_inner=0.1, batch_size=1, mu_g_init=given
        ).resolve(p)
        state = solver.init(p, jax.random.PRNGKey(0))
        step = jax.jit(solver.step)
        for _ in range(5):
            state = step(p, state)
            assert float(state.mu_g) == pytest.approx(expected, rel=1e-12)
            assert np.linalg.eigvalsh(np.asarray(state.H_yy))[0] >= expected * (1 - 1e-12)


@pytest.mark.parametrize("mu_g", [0.5, "auto"])
def test_one_eigendecomposition_per_step(mu_g):
    """The step has exactly one ``eigh`` (in the branch where the floor binds, see
    ``bilevel.solvers.second_order.eigen_floor``), also under mu_g="auto", whose floor takes the end
    eigenvalues of h_yy by tridiagonal bisection. Two independent eigendecompositions in one
    program deadlocked jaxlib 0.10.2's CPU thread pool under vmap (8 seeds of the stable-hpo
    problem on 2 cores hung in LAPACK, measured)."""
    p = bl.problems.quadratic(dx=3, dy=6, stochastic=True, n_samples=64)
    solver = bl.solvers.make("stable", lr_outer=0.1, lr_inner=0.1, batch_size=4, mu_g=mu_g)
    solver = solver.resolve(p)
    jaxpr = jax.make_jaxpr(solver.step)(p, solver.init(p, jax.random.PRNGKey(0)))
    assert str(jaxpr).count(" eigh[") == 1


def test_correction_keeps_y_on_y_star_with_a_tiny_inner_step(quad):
    """The single-timescale claim (Lemma 3, spec test 2) as a convergence test: started on
    y^0 = y*(x^0) with exact matrices, the correction -(H_yy)^{-1} H_xy' (x^{k+1} - x^k) of
    (8b) moves y exactly along y*(x) (y* is affine), so with an inner step beta = 1e-3, fifty
    times SMALLER than alpha = 0.05 (TTSA needs alpha << beta), y stays on y*(x^k) to round-off
    and x converges linearly (~0.9 per step; measured ||x - x*|| 1.36 -> 6e-15 in 300 steps).
    With the sign of the correction flipped the y-error grows by 2 A^{-1} B (x^{k+1} - x^k) per
    step and decays only as 1 - beta mu_g = 0.999 per step, so x stalls far from x* (measured:
    0.32 at step 300, y 1.8 from y*(x)): both assertions fail."""
    ref = quad.reference
    p = quad.replace(y0=jnp.asarray(ref.y_star(np.asarray(quad.x0))))
    solver = bl.solvers.make("stable", lr_outer=0.05, lr_inner=1e-3)
    res = bl.solve(p, solver, steps=300, eval_every=100, progress=False)
    x_err = res.history.x_err.to_numpy()
    assert x_err[-1] <= 1e-10 * x_err[0], res.history
    np.testing.assert_allclose(np.asarray(res.y), ref.y_star(np.asarray(res.x)), atol=1e-12)


# ---- replicas of Algorithm 1 ---------------------------------------------------------------
def test_matches_algorithm_1_step_by_step(quad):
    """A numpy replica of (8)-(9) written from the paper, with tau = 0.3 and BOTH projections
    active (floor mu_g = 3 > lambda_min(A) = 1, radius C = 3 < ||B||_F ~ 6.9), so the recursion
    H^k = P((1 - tau)(H^{k-1} - h) + h) is not trivial. k = 0 uses tau_0 = 1 (H^0 = P(h^0)).
    rtol 1e-10: eigendecompositions of 50x50 matrices agree to ~1e-13 between LAPACK calls."""
    ref = quad.reference
    alpha, beta, tau, mu, C = 0.05, 0.1, 0.3, 3.0, 3.0
    solver = bl.solvers.make(
        "stable", lr_outer=alpha, lr_inner=beta, tau=tau, mu_g=mu, max_cross_norm=C
    )
    state = solver.init(quad, jax.random.PRNGKey(0))
    step = jax.jit(solver.step)
    x, y = np.zeros(10), np.zeros(50)
    h_yy, h_xy = ref.A, -ref.B.T  # exact, constant: h^k = h^{k-1}
    Hxy, Hyy = None, None
    for k in range(6):
        t = 1.0 if k == 0 else tau
        Mxy = h_xy if k == 0 else (1 - t) * (Hxy - h_xy) + h_xy
        Hxy = Mxy * min(1.0, C / np.linalg.norm(Mxy))  # (9a)
        Myy = h_yy if k == 0 else (1 - t) * (Hyy - h_yy) + h_yy
        lam, Q = np.linalg.eigh(0.5 * (Myy + Myy.T))
        Hyy = (Q * np.maximum(lam, mu)) @ Q.T  # (9b)
        gx_f = -ref.D.T @ (y - ref.D @ x - ref.e) + ref.rho * x
        gy_f = y - ref.D @ x - ref.e
        x_new = x - alpha * (gx_f - Hxy @ np.linalg.solve(Hyy, gy_f))  # (8a)
        h_g = ref.A @ y - ref.B @ x - ref.b
        y = y - beta * h_g - np.linalg.solve(Hyy, Hxy.T @ (x_new - x))  # (8b)
        x = x_new
        state = step(quad, state)
        np.testing.assert_allclose(state.H_xy, Hxy, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(state.H_yy, Hyy, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(state.x, x, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(state.y, y, rtol=1e-10, atol=1e-12)
    c = state.counts
    calls = (int(c.grad_f), int(c.grad_g), int(c.dense), int(c.hvp), int(c.cross))
    assert calls == (6, 6, 24, 0, 0)


def _replica_step(p, solver, state, prev_draw: int):
    """STABLE's step rebuilt from the solver's own minibatches; the previous-point matrices use
    inner draw ``prev_draw`` (0 = the same phi^k as the current point, as the paper says)."""
    g, f = p.inner, p.outer
    _, batch_key = jax.random.split(state.key)
    mb = sampling.minibatches(
        batch_key, p.outer_data, p.inner_data, solver.batch_size, outer=1, inner=2
    )
    phi, phi_prev, xi = mb.inner(0), mb.inner(prev_draw), mb.outer(0)
    tau = jnp.where(state.k == 0, 1.0, solver.tau)
    Hxy = (1 - tau) * (state.H_xy - oracles.jacobian_xy(g, state.x_prev, state.y_prev, phi_prev))
    Hxy = Hxy + oracles.jacobian_xy(g, state.x, state.y, phi)
    Hyy = (1 - tau) * (state.H_yy - oracles.hessian_yy(g, state.x_prev, state.y_prev, phi_prev))
    Hyy = Hyy + oracles.hessian_yy(g, state.x, state.y, phi)
    if solver.mu_g == "auto":  # half lambda_min of this step's sampled Hessian (all PD here)
        floor = 0.5 * jnp.linalg.eigvalsh(oracles.hessian_yy(g, state.x, state.y, phi))[0]
    else:
        floor = solver.mu_g
    lam, Q = jnp.linalg.eigh(0.5 * (Hyy + Hyy.T))
    Hyy = (Q * jnp.maximum(lam, floor)[None, :]) @ Q.T
    gx_f, gy_f = oracles.grads(f, state.x, state.y, xi)
    x_new = p.project_x(state.x - solver.lr_outer * (gx_f - Hxy @ jnp.linalg.solve(Hyy, gy_f)))
    h_g = oracles.grad_y(g, state.x, state.y, phi)
    y_new = state.y - solver.lr_inner * h_g - jnp.linalg.solve(Hyy, Hxy.T @ (x_new - state.x))
    return x_new, y_new, Hxy, Hyy, floor


_replica = jax.jit(_replica_step, static_argnums=(1, 3))


@pytest.mark.parametrize("mu_g", [0.05, "auto"])
def test_stochastic_step_reuses_one_inner_sample(mu_g):
    """Rebuild each step from the solver's minibatches: ONE inner draw phi^k feeds h_g^k and the
    cross-Jacobian and Hessian at both (x^{k-1}, y^{k-1}) and (x^k, y^k); one outer draw feeds
    both f-gradients. On the logistic problem the matrices depend on the sample and the point,
    so a replica that draws an independent sample for the previous point (negative control)
    gives a different estimate. Per step: batch_size inner and outer samples, 4 dense calls.
    With mu_g="auto" the floor is half lambda_min of the SAME sampled Hessian h_yy^k (every
    sample is positive definite here: sum x_j y_j^2 with x >= 0.1)."""
    p = logistic_ho(stochastic=True)
    bs = 4
    solver = bl.solvers.make(
        "stable", lr_outer=0.3, lr_inner=0.3, batch_size=bs, tau=0.2, mu_g=mu_g
    ).resolve(p)
    state = solver.init(p, jax.random.PRNGKey(3))
    step = jax.jit(solver.step)
    for _ in range(4):
        x, y, Hxy, Hyy, floor = _replica(p, solver, state, 0)
        _, _, Hxy_other, Hyy_other, _ = _replica(p, solver, state, 1)
        new = step(p, state)
        np.testing.assert_allclose(new.mu_g, floor, rtol=1e-12)
        np.testing.assert_allclose(new.H_xy, Hxy, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(new.H_yy, Hyy, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(new.x, x, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(new.y, y, rtol=1e-10, atol=1e-13)
        if int(state.k) > 0:  # at k = 0, tau_0 = 1 discards the previous-point term
            assert np.abs(np.asarray(Hyy_other - Hyy)).max() > 1e-4
            assert np.abs(np.asarray(Hxy_other - Hxy)).max() > 1e-4
        state = new
    c = state.counts
    assert (int(c.samples_inner), int(c.samples_outer)) == (4 * bs, 4 * bs)
    assert (int(c.grad_f), int(c.grad_g), int(c.dense)) == (4, 4, 16)


# ---- options, resolution, warnings ------------------------------------------------------------
def test_schedules():
    """Theorem 3's orders: alpha_k, beta_k ~ k0/(k0 + k); the default tau is its own sequence,
    k0/(k0 + k) ("strongly-convex") or (k + 1)^(-1/2) ("constant", Theorem 2's 1/sqrt(K) reached
    at k = K - 1), whatever lr_inner is: with lr_inner >= 1 (in the stable-hpo grid) tau stays
    below 1, so the recursion (9) stays on. Floats under "constant" are kept; schedules pass
    through. Exact up to rounding (rel 1e-12)."""
    s = bl.solvers.make("stable", lr_outer=0.2, lr_inner=0.4, mu_g=1.0, regime="strongly-convex")
    for k in (0, 3, 250):
        a, b, t = map(float, s.step_sizes(k))
        decay = 100 / (100 + k)
        assert (a, b, t) == pytest.approx((0.2 * decay, 0.4 * decay, decay), rel=1e-12)
    for lr_inner in (0.4, 1.0, 2.0):
        c = bl.solvers.make("stable", lr_outer=0.2, lr_inner=lr_inner, mu_g=1.0)
        for k in (0, 3, 250):
            a, b, t = map(float, c.step_sizes(k))
            assert (a, b, t) == pytest.approx((0.2, lr_inner, (k + 1) ** -0.5), rel=1e-12)
    c = bl.solvers.make("stable", lr_outer=0.2, lr_inner=0.4, mu_g=1.0, tau=0.3)
    assert tuple(map(float, c.step_sizes(77))) == pytest.approx((0.2, 0.4, 0.3))
    sch = bl.solvers.make("stable", lr_outer=lambda k: 1 / (k + 1), lr_inner=0.4, mu_g=1.0)
    assert float(sch.step_sizes(3)[0]) == pytest.approx(0.25)


def test_mu_g_auto_and_unresolved_errors(quad):
    """mu_g="auto" starts from mu_g_init = half the Lanczos estimate of lambda_min at (x0, y0)
    (exact here: 1) and stays "auto" (it follows the run); a given mu_g_init is kept;
    lr_inner="auto" = 1/L_g = 0.1. Unresolved "auto" fails clearly in init; a problem that is
    not strongly convex refuses "auto"."""
    solver = bl.solvers.make("stable", lr_outer=0.01)  # an "auto" lr_outer is tuned by bl.solve
    resolved = solver.resolve(quad)
    assert resolved.mu_g == "auto"
    assert resolved.mu_g_init == pytest.approx(0.5, rel=1e-8)
    assert resolved.lr_inner == pytest.approx(0.1, rel=1e-8)
    assert float(resolved.init(quad, jax.random.PRNGKey(0)).mu_g) == resolved.mu_g_init
    assert bl.solvers.make("stable", mu_g_init=0.3).resolve(quad).mu_g_init == 0.3
    with pytest.raises(ValueError, match="resolve"):
        solver.init(quad, jax.random.PRNGKey(0))
    flat = bl.BilevelProblem(
        outer=lambda x, y, b: jnp.sum(y**2),
        inner=lambda x, y, b: jnp.sum((y[:1] - x) ** 2),  # flat in y[1]
        x0=jnp.zeros(1),
        y0=jnp.zeros(2),
    )
    with pytest.raises(ValueError, match="give mu_g .or mu_g_init. explicitly"):
        bl.solvers.make("stable", lr_inner=0.1).resolve(flat)


def test_large_dim_y_warns():
    """check_problem warns (DenseHessianWarning, a UserWarning) above dim(y) = 2000 and names
    Hessian-free alternatives; at 2000 it is silent."""

    def problem(dim_y):
        return bl.BilevelProblem(
            outer=lambda x, y, b: jnp.sum(y**2) + jnp.sum(x**2),
            inner=lambda x, y, b: 0.5 * jnp.sum(y**2) - jnp.sum(y) * x[0],
            x0=jnp.zeros(2),
            y0=jnp.zeros(dim_y),
        )

    solver = bl.solvers.make("stable", mu_g=1.0, lr_inner=0.1)
    with pytest.warns(DenseHessianWarning, match=r"stocbio.*aid-cg.*f2sa.*pzobo-s"):
        solver.check_problem(problem(DENSE_DIM_LIMIT + 1))
    assert issubclass(DenseHessianWarning, UserWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        solver.check_problem(problem(DENSE_DIM_LIMIT))


def test_bad_options():
    for kwargs, match in (
        ({"regime": "fast"}, "regime"),
        ({"mu_g": -1.0}, "mu_g"),
        ({"mu_g": "big"}, "mu_g"),
        ({"mu_g_init": 0.0}, "mu_g_init"),
        ({"mu_g_init": "auto"}, "mu_g_init"),
        ({"tau": 1.5}, "tau"),
        ({"max_cross_norm": 0.0}, "max_cross_norm"),
        ({"k0": 0}, "k0"),
    ):
        with pytest.raises(ValueError, match=match):
            bl.solvers.make("stable", **kwargs)


# ---- Done-means convergence ----------------------------------------------------------------
def test_deterministic_quadratic_reaches_1e2(quad):
    """Done-means: ||x_K - x*|| <= 1e-2 ||x_0 - x*|| (x_0 = 0) with lr given and otherwise
    default settings (mu_g="auto"). With exact matrices STABLE is a contraction here (x by
    ~1 - alpha mu_F = 0.9, y by 0.9 per step): 300 steps give ~1e-14, far below."""
    solver = bl.solvers.make("stable", lr_outer=0.05, lr_inner=0.1)
    res = bl.solve(quad, solver, steps=300, eval_every=100, progress=False)
    x_err = res.history.x_err.to_numpy()
    assert x_err[-1] <= 1e-2 * x_err[0], res.history
    assert x_err[-1] <= 1e-8 * x_err[0]  # in fact linear convergence to machine precision


def test_stochastic_quadratic_5_seeds_10x():
    """Done-means: batch 32, 5 seeds, mean ||grad F|| falls at least 10x. Theorem 3's decaying
    steps ("strongly-convex": alpha_k, beta_k, tau_k ~ 100/(100 + k)); F is 2-strongly convex.
    Measured: 6.96 -> ~0.17 (about 40x) after 1000 steps."""
    p = bl.problems.quadratic(stochastic=True)
    solver = bl.solvers.make(
        "stable", lr_outer=0.05, lr_inner=0.1, batch_size=32, regime="strongly-convex"
    )
    res = bl.solve(p, solver, steps=1000, seeds=range(5), eval_every=500, progress=False)
    mean = res.history.groupby("step").grad_norm.mean()
    assert mean.iloc[-1] <= mean.iloc[0] / 10, mean
    h = res.history
    last = h[h.step == 1000]
    assert (last.samples_inner == 1000 * 32).all() and (last.samples_outer == 1000 * 32).all()


def test_stable_hpo_experiment_cites_the_stable_paper():
    """``bilevel reproduce --list`` names STABLE's own paper (Chen, Sun, Xiao, Yin, AISTATS
    2022), not the authors' NeurIPS 2021 paper on alternating SGD (ALSET)."""
    from bilevel import experiments

    assert (
        experiments.get("stable-hpo").paper == "STABLE (Chen, Sun, Xiao, Yin, AISTATS 2022), Fig. 2"
    )

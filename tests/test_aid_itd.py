"""AID-CG, AID-FP (Grazzi et al., ICML 2020) and ITD-R (Franceschi et al., ICML 2017) against
exact answers on the quadratic (g = 1/2 y'Ay - y'(Bx + b) + c_x/2 |x|^2, f = 1/2 |y - Dx - e|^2
+ rho/2 |x|^2, so d2g/dy2 = A, d2g/dxdy = -B^T)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bilevel as bl
from bilevel import oracles
from bilevel.core import linsolve, sampling

LR = 0.1  # the inner step 1/L_g of the hypergradient checks


@pytest.fixture(scope="module")
def quad():
    return bl.problems.quadratic()  # dx = 10, dy = 50, mu_g = 1, L_g = 10


@pytest.fixture(scope="module")
def point(quad):
    """A fixed x away from x* and a start y0 away from y*(x)."""
    rng = np.random.default_rng(3)
    return 0.5 * rng.standard_normal(10), 0.5 * rng.standard_normal(50)


def _gd_closed_form(ref, x, y0, lr, N):
    """N GD steps on g(x, .) from y0: y_N - y* = (I - lr A)^N (y0 - y*)."""
    P_N = np.linalg.matrix_power(np.eye(ref.dy) - lr * ref.A, N)
    y_star = ref.y_star(x)
    return y_star + P_N @ (y0 - y_star), P_N


def _implicit(ref, x, y, v):
    """grad_x f(x, y) - (d2g/dxdy) v with d2g/dxdy = -B^T."""
    return -ref.D.T @ (y - ref.D @ x - ref.e) + ref.rho * x + ref.B.T @ v


def _numpy_cg(A, b, iters):
    u, r = np.zeros_like(b), b.copy()
    p = r.copy()
    for _ in range(iters):
        Ap = A @ p
        alpha = (r @ r) / (p @ Ap)
        u, r_new = u + alpha * p, r - alpha * Ap
        p, r = r_new + (r_new @ r_new) / (r @ r) * p, r_new
    return u


def _hypergradients(solvers, problem, num_inner):
    """The solvers' hypergradients at one (x, y), as ONE compiled function (deterministic data;
    one program for a sweep over N or K keeps the test's compile time down)."""
    mb = solvers[0].minibatches(problem, jax.random.PRNGKey(0), outer=1, inner=num_inner)
    return jax.jit(lambda x, y: [s.hypergradient(problem, x, y, mb) for s in solvers])


def _strictly_decreasing(errors):
    return all(b < a for a, b in zip(errors, errors[1:], strict=False))


# ---- ITD-R ------------------------------------------------------------------------------------
def test_itd_is_the_exact_gradient_of_the_unrolled_loop(quad, point):
    """For GD on the quadratic, y_N = P^N y0 + (I - P^N) y*(x) with P = I - lr A, hence
    dy_N/dx = (I - P^N) A^{-1} B and grad F_N(x) = grad_x f + B^T A^{-1} (I - P^N) grad_y f at
    (x, y_N): the reverse pass through the scan must give it to 1e-10 (float64, 16 steps of a
    well-conditioned map). Its error against the exact grad F falls with N."""
    ref, (x, y0) = quad.reference, point
    Ns = (1, 2, 4, 8, 16)
    solvers = [bl.solvers.make("itd", lr_outer=0.01, lr_inner=LR, inner_steps=N) for N in Ns]
    results = _hypergradients(solvers, quad, 16)(jnp.asarray(x), jnp.asarray(y0))
    errors = []
    for N, (h, y_N) in zip(Ns, results, strict=True):
        y_closed, P_N = _gd_closed_form(ref, x, y0, LR, N)
        r = y_closed - ref.D @ x - ref.e
        expected = _implicit(ref, x, y_closed, np.linalg.solve(ref.A, r - P_N @ r))
        np.testing.assert_allclose(y_N, y_closed, rtol=1e-10)
        np.testing.assert_allclose(h, expected, rtol=1e-10)
        errors.append(np.linalg.norm(h - ref.grad_F(x)))
    assert _strictly_decreasing(errors), errors


def test_itd_backward_pass_is_the_adjoint_recursion_on_minibatches():
    """Stochastic ITD, one step replayed with the solver's own minibatches: SGD forward with
    draw t at step t, then the adjoint recursion h += (dPsi_t/dx)^T a, a <- (dPsi_t/dy)^T a
    (spec pzobo.md 3.5) with hvp_and_cross on the same draws. rtol 1e-11: the same products,
    summed by autodiff in another order."""
    p = bl.problems.quadratic(dx=3, dy=4, stochastic=True, n_samples=40)
    N, bs, lr_in, lr_out = 3, 5, 0.1, 0.1
    solver = bl.solvers.make("itd", lr_outer=lr_out, lr_inner=lr_in, batch_size=bs, inner_steps=N)
    state = solver.init(p, jax.random.PRNGKey(2))
    state = state._replace(y=jnp.asarray([0.3, -0.2, 0.1, 0.4]))  # y0 != 0: warm start matters
    new = jax.jit(solver.step)(p, state)
    f, g = p.outer, p.inner

    @jax.jit
    def replica(state):
        _, batch_key = jax.random.split(state.key)
        mb = sampling.minibatches(batch_key, p.outer_data, p.inner_data, bs, outer=1, inner=N)
        x, ys = state.x, [state.y]
        for t in range(N):
            ys.append(ys[-1] - lr_in * oracles.grad_y(g, x, ys[-1], mb.inner(t)))
        h, a = oracles.grads(f, x, ys[N], mb.outer(0))
        for t in reversed(range(N)):  # Psi_t(x, y) = y - lr grad_y g(x, y; B_t)
            cross, hvp = oracles.hvp_and_cross(g, x, ys[t], mb.inner(t), a)
            h, a = h - lr_in * cross, a - lr_in * hvp
        return x - lr_out * h, ys[N]

    x1, y_N = replica(state)
    np.testing.assert_allclose(new.y, y_N, rtol=1e-12)
    np.testing.assert_allclose(new.x, x1, rtol=1e-11)
    c = new.counts
    assert (int(c.grad_g), int(c.grad_f), int(c.hvp), int(c.cross)) == (N, 1, N, N)
    assert int(c.samples_inner) == bs * N and int(c.samples_outer) == bs


# ---- AID --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["aid-cg", "aid-fp"])
def test_aid_error_falls_with_inner_steps(quad, point, name):
    """K large (CG: 50 iterations on dim 50; FP: 0.82^200 ~ 1e-17), so the error is y_N's.
    Error at N = 1, 2, 4, 8, 16 strictly decreasing. One compiled N = 1 step, chained: with GD
    the estimate after N steps from y0 is the N = 1 estimate from y_{N-1}."""
    ref, (x, y0) = quad.reference, point
    extra = {"linsolve_steps": 50} if name == "aid-cg" else {"linsolve_steps": 200, "fp_lr": 0.18}
    solver = bl.solvers.make(name, lr_outer=0.01, lr_inner=LR, inner_steps=1, **extra)
    hypergradient = _hypergradients([solver], quad, 3)
    y, errors = jnp.asarray(y0), {}
    for n in range(1, 17):
        [(h, y)] = hypergradient(jnp.asarray(x), y)
        errors[n] = np.linalg.norm(h - ref.grad_F(x))
    np.testing.assert_allclose(y, _gd_closed_form(ref, x, y0, LR, 16)[0], rtol=1e-10)
    powers = [errors[n] for n in (1, 2, 4, 8, 16)]
    assert _strictly_decreasing(powers), powers


@pytest.mark.parametrize("name", ["aid-cg", "aid-fp"])
def test_aid_adjoint_closed_form_and_error_falls_with_linsolve_steps(quad, point, name):
    """y = y*(x) exactly (one GD step keeps it there), so the error is the adjoint's. FP from 0:
    u_K = (I - (I - eta A)^K) A^{-1} grad_y f; CG: a numpy CG replica. Both to 1e-10 (K <= 16
    float64 iterations on a condition-10 system); error at K = 1, ..., 16 strictly decreasing."""
    ref, (x, _) = quad.reference, point
    y_star = ref.y_star(x)
    r = y_star - ref.D @ x - ref.e
    Ks = (1, 2, 4, 8, 16)
    solvers = [
        bl.solvers.make(name, lr_outer=0.01, lr_inner=LR, inner_steps=1, linsolve_steps=K)
        for K in Ks
    ]
    results = _hypergradients(solvers, quad, 3)(jnp.asarray(x), jnp.asarray(y_star))
    errors = []
    for K, (h, _) in zip(Ks, results, strict=True):
        if name == "aid-fp":  # fp_lr defaults to lr_inner
            Q_K = np.linalg.matrix_power(np.eye(ref.dy) - LR * ref.A, K)
            v = np.linalg.solve(ref.A, r - Q_K @ r)
        else:
            v = _numpy_cg(ref.A, r, K)
        np.testing.assert_allclose(h, _implicit(ref, x, y_star, v), rtol=1e-10)
        errors.append(np.linalg.norm(h - ref.grad_F(x)))
    assert _strictly_decreasing(errors), errors


@pytest.mark.parametrize("name", ["aid-cg", "aid-fp"])
def test_stochastic_aid_uses_a_minibatch_for_every_oracle(name):
    """One step replayed with the solver's own minibatches: draw t for inner SGD step t, the
    outer draw for both partials of f, draw N for all K Hessian-vector products, draw N + 1 for
    the cross product. rtol 1e-12: the same float64 operations."""
    p = bl.problems.quadratic(dx=3, dy=4, stochastic=True, n_samples=40)
    N, K, bs = 2, 3, 5
    solver = bl.solvers.make(
        name, lr_outer=0.1, lr_inner=0.1, batch_size=bs, inner_steps=N, linsolve_steps=K
    )
    state = solver.init(p, jax.random.PRNGKey(5))
    new = jax.jit(solver.step)(p, state)
    f, g = p.outer, p.inner

    @jax.jit
    def replica(state):
        _, batch_key = jax.random.split(state.key)
        mb = sampling.minibatches(batch_key, p.outer_data, p.inner_data, bs, outer=1, inner=N + 2)
        x, y = state.x, state.y
        for t in range(N):
            y = y - 0.1 * oracles.grad_y(g, x, y, mb.inner(t))
        gx, gy = oracles.grads(f, x, y, mb.outer(0))

        def hvp(v):
            return oracles.hvp_yy(g, x, y, mb.inner(N), v)

        if name == "aid-cg":
            v = linsolve.cg(hvp, gy, num_iters=K)
        else:
            v = linsolve.fixed_point(hvp, gy, lr=0.1, num_iters=K)
        x = x - 0.1 * (gx - oracles.cross_xy(g, x, y, mb.inner(N + 1), v))
        return x, y, mb.inner(N)["b"], mb.inner(N + 1)["b"]

    x1, y1, b_hessian, b_cross = replica(state)
    np.testing.assert_allclose(new.x, x1, rtol=1e-12)
    np.testing.assert_allclose(new.y, y1, rtol=1e-12)
    assert not np.array_equal(b_hessian, b_cross)
    c = new.counts
    assert (int(c.grad_g), int(c.grad_f), int(c.hvp), int(c.cross)) == (N, 1, K, 1)
    assert int(c.samples_inner) == bs * (N + 2) and int(c.samples_outer) == bs


@pytest.mark.parametrize("name", ["aid-cg", "aid-fp"])
def test_fresh_hessian_draws_a_minibatch_for_every_product(name):
    """fresh_hessian=True (hypertorch's stochastic=True, spec pzobo.md 3.5): one step replayed
    with the solver's own minibatches, product i of the K-iteration solve on draw N + i, the
    cross product on draw N + K. rtol 1e-12: the same float64 operations."""
    p = bl.problems.quadratic(dx=3, dy=4, stochastic=True, n_samples=40)
    N, K, bs, lr = 2, 3, 5, 0.1
    common = dict(lr_outer=lr, lr_inner=lr, batch_size=bs, inner_steps=N, linsolve_steps=K)
    solver = bl.solvers.make(name, fresh_hessian=True, **common)
    state = solver.init(p, jax.random.PRNGKey(5))
    new = jax.jit(solver.step)(p, state)
    f, g = p.outer, p.inner

    @jax.jit
    def replica(state):
        _, batch_key = jax.random.split(state.key)
        draws = N + K + 1  # N steps, K Hessian samples, 1 cross
        mb = sampling.minibatches(batch_key, p.outer_data, p.inner_data, bs, outer=1, inner=draws)
        x, y = state.x, state.y
        for t in range(N):
            y = y - lr * oracles.grad_y(g, x, y, mb.inner(t))
        gx, gy = oracles.grads(f, x, y, mb.outer(0))
        v, r = jnp.zeros_like(gy), gy
        d = r
        for i in range(K):  # Hessian sample N + i for product i
            hd = oracles.hvp_yy(g, x, y, mb.inner(N + i), d if name == "aid-cg" else v)
            if name == "aid-fp":
                v = v - lr * (hd - gy)
                continue
            a = (r @ r) / (d @ hd)
            v, r_new = v + a * d, r - a * hd
            d, r = r_new + (r_new @ r_new) / (r @ r) * d, r_new
        return x - lr * (gx - oracles.cross_xy(g, x, y, mb.inner(N + K), v)), y

    x1, y1 = replica(state)
    np.testing.assert_allclose(new.x, x1, rtol=1e-12)
    np.testing.assert_allclose(new.y, y1, rtol=1e-12)
    c = new.counts
    assert (int(c.grad_g), int(c.grad_f), int(c.hvp), int(c.cross)) == (N, 1, K, 1)
    assert int(c.samples_inner) == bs * (N + K + 1) and int(c.samples_outer) == bs


@pytest.mark.parametrize("name", ["aid-cg", "aid-fp"])
def test_fresh_hessian_draws_more_samples_and_converges(name):
    """Stochastic AID with a fresh Hessian minibatch per product: the same Done-means target
    as the shared-minibatch default below (batch 32, seeds 0-4, mean ||grad F|| falls >= 10x
    in 400 steps), at K - 1 more inner minibatches per step (K = 20: 31 instead of 12)."""
    p = bl.problems.quadratic(stochastic=True)
    kwargs = dict(lr_outer=0.02, lr_inner=0.1, batch_size=32)
    fresh = bl.solvers.make(name, fresh_hessian=True, **kwargs)
    res = bl.solve(p, fresh, steps=400, seeds=range(5), eval_every=400, progress=False)
    mean = res.history.groupby("step").grad_norm.mean()
    assert mean.iloc[-1] <= mean.iloc[0] / 10, mean
    shared = bl.solvers.make(name, **kwargs)
    key = jax.random.PRNGKey(0)
    [n_fresh, n_shared] = [
        int(s.step(p, s.init(p, key)).counts.samples_inner) for s in (fresh, shared)
    ]
    assert (n_fresh, n_shared) == (32 * (10 + 20 + 1), 32 * (10 + 1 + 1))


# ---- Done-means convergence -------------------------------------------------------------------
def _truncated_fixed_point(ref, lr: float, K: int) -> np.ndarray:
    """The x where the hypergradient with the adjoint truncated to K fixed-point steps from 0,
    (I - (I - lr A)^K) A^{-1} in place of A^{-1}, vanishes (closed form on the quadratic)."""
    M = np.linalg.solve(ref.A, ref.B) - ref.D
    r0 = np.linalg.solve(ref.A, ref.b) - ref.e
    P = np.linalg.matrix_power(np.eye(ref.dy) - lr * ref.A, K)
    W = ref.B.T @ np.linalg.solve(ref.A, np.eye(ref.dy) - P)
    G = -ref.D.T @ M + ref.rho * np.eye(ref.dx) + W @ M
    return np.linalg.solve(G, ref.D.T @ r0 - W @ r0)


@pytest.mark.parametrize(
    "name, options",
    [("aid-cg", {}), ("aid-fp", {}), ("aid-fp", {"warm_adjoint": False}), ("itd", {})],
)
def test_deterministic_quadratic_reaches_1e2_x_error(quad, name, options):
    """Done-means: ||x_K - x*|| <= 1e-2 ||x_0 - x*|| (x_0 = 0), lr_inner = 0.18, defaults
    N = 10 (AID) / 20 (ITD), K = 20. Warm-started, y converges to y*(x); a K-step adjoint from
    v = 0 (AID-FP with ``warm_adjoint=False``) and ITD's 20-step Jacobian then leave the same
    bias, (I - lr A)^20 in B^T A^{-1} (I - ...): x_K must sit at that biased fixed point (closed
    form, 1e-6: 200 steps of a contraction with rate ~0.9), 3.2e-3 from x*. AID-FP's default
    warm adjoint carries v over, so its iterations add up across steps and the bias goes: it
    must end 10x closer to x* than that point. CG's 20 iterations on dim 50, condition 10,
    leave ~1e-5."""
    ref = quad.reference
    solver = bl.solvers.make(name, lr_outer=0.05, lr_inner=0.18, **options)
    res = bl.solve(quad, solver, steps=200, eval_every=200, progress=False)
    x0_err = np.linalg.norm(ref.x_star)
    assert res.history.x_err.iloc[-1] <= 1e-2 * x0_err, res.history
    if name == "aid-cg":
        return
    x_biased = _truncated_fixed_point(ref, 0.18, 20)
    bias = np.linalg.norm(x_biased - ref.x_star)
    assert bias > 1e-3 * x0_err  # the bias is real
    if name == "itd" or not options.get("warm_adjoint", True):
        np.testing.assert_allclose(np.asarray(res.x), x_biased, rtol=1e-6)
    else:
        assert np.linalg.norm(np.asarray(res.x) - ref.x_star) < 0.1 * bias


@pytest.mark.parametrize("name", ["aid-cg", "aid-fp", "itd"])
def test_stochastic_quadratic_5_seeds_10x(name):
    """Done-means: batch 32, seeds 0-4, mean ||grad F|| falls >= 10x (observed ~20x after 400
    steps: constant steps settle at an SGD noise floor)."""
    p = bl.problems.quadratic(stochastic=True)
    solver = bl.solvers.make(name, lr_outer=0.02, lr_inner=0.1, batch_size=32)
    res = bl.solve(p, solver, steps=400, seeds=range(5), eval_every=400, progress=False)
    mean = res.history.groupby("step").grad_norm.mean()
    assert mean.iloc[-1] <= mean.iloc[0] / 10, mean


def test_bad_options():
    with pytest.raises(ValueError, match="linsolve_steps"):
        bl.solvers.make("aid-cg", linsolve_steps=0)
    with pytest.raises(ValueError, match="fp_lr"):
        bl.solvers.make("aid-fp", fp_lr=-1.0)
    with pytest.raises(ValueError, match="fp_lr explicitly"):
        bl.solvers.make("aid-fp", lr_inner=lambda k: 0.1 / (k + 1))
    with pytest.raises(ValueError, match="no hyperparameter"):
        bl.solvers.make("aid-cg", fp_lr=0.1)
    with pytest.raises(ValueError, match="inner_steps"):
        bl.solvers.make("itd", inner_steps=0)


@pytest.mark.parametrize("name", ["aid-cg", "aid-fp"])
def test_without_warm_start_every_inner_loop_starts_at_y0(quad, name):
    """``warm_start=False``: the N inner steps of every outer step start from ``problem.y0``,
    not from the previous y. After step k the inner iterate is N GD steps on g(x_k, .) from y0,
    the closed form ``y* + (I - lr A)^N (y0 - y*)`` at the x the step started from."""
    ref = quad.reference
    solver = bl.solvers.make(
        name, lr_outer=0.05, lr_inner=LR, inner_steps=3, warm_start=False
    ).resolve(quad)
    state = solver.init(quad, jax.random.PRNGKey(0))
    step = jax.jit(solver.step)
    y0 = np.asarray(quad.y0)
    for _ in range(3):
        x = np.asarray(state.x)
        state = step(quad, state)
        want, _ = _gd_closed_form(ref, x, y0, LR, 3)
        np.testing.assert_allclose(np.asarray(state.y), want, rtol=1e-10, atol=1e-12)

"""IBCG (Abolfazli, Jiang, Mokhtari, Yazdandoost Hamedani; Algorithm 1) and the FW-gap metrics.

1. a numpy replica of Algorithm 1 written from the paper, step by step at rtol 1e-11;
2. a stochastic replica that rebuilds the step's minibatches, proving which draw feeds which
   oracle;
3. Done means: on the simplex-constrained quadratic (x* certified by projected gradient on the
   exact F), the default steps for K = 3000 end within 5% of ||x0 - x*|| and the FW gap falls;
   with minibatches within 50%;
4. bad input, and the exact metrics fw_gap / grad_mapping on a closed form.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bilevel as bl
from bilevel.core.sampling import minibatches

DX, DY = 10, 50


def np_project_simplex(v):
    """Euclidean projection onto the probability simplex (sort-based, Held et al. 1974)."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u)
    j = np.arange(1, v.size + 1)
    r = np.max(np.nonzero(u * j > css - 1)[0])
    return np.maximum(v - (css[r] - 1) / (r + 1), 0)


def simplex_problem(**kwargs):
    q = bl.problems.quadratic(dx=DX, dy=DY, **kwargs)
    return q.replace(x_set=bl.sets.Simplex(), x0=jnp.full(DX, 1.0 / DX))


@pytest.fixture(scope="module")
def problem():
    return simplex_problem()


@pytest.fixture(scope="module")
def x_star(problem):
    """x* = argmin_{x in simplex} F(x) by 20000 projected-gradient steps 1/L_F on the exact F
    (strongly convex, mu_F ~ 2, L_F ~ 10.5: contraction 0.8 per step, so converged to
    rounding); certified by the fixed-point residual of the projected-gradient map."""
    ref = problem.reference
    step = 1.0 / np.linalg.eigvalsh(ref.hessian_F)[-1]
    x = np.full(DX, 1.0 / DX)
    for _ in range(20000):
        x = np_project_simplex(x - step * ref.grad_F(x))
    assert np.linalg.norm(x - np_project_simplex(x - step * ref.grad_F(x))) < 1e-13
    return x


# ---- 1. numpy replica of Algorithm 1 -----------------------------------------------------------
def np_ibcg(ref, x, y, w, gamma, alpha, eta, steps):
    """Algorithm 1 from the paper on g = 1/2 y'Ay - y'(Bx + b) + c_x/2|x|^2,
    f = 1/2|y - Dx - e|^2 + rho/2|x|^2: d2g/dy2 = A, d2g/dxdy w = -B'w."""
    A, B, b, D, e = ref.A, ref.B, ref.b, ref.D, ref.e
    out = []
    for _ in range(steps):
        grad_y_f = y - D @ x - e
        grad_x_f = -D.T @ grad_y_f + ref.rho * x
        w = w - eta * (A @ w - grad_y_f)  # line 4, at (x_k, y_k, w_k)
        F = grad_x_f + B.T @ w  # line 5: grad_x f - d2g/dxdy w_{k+1}, d2g/dxdy = -B'
        s = np.zeros_like(x)
        s[np.argmin(F)] = 1.0  # line 6: simplex LMO
        gap = F @ (x - s)
        x = x + gamma * (s - x)  # line 7
        y = y - alpha * (A @ y - B @ x - b)  # line 8: grad_y g at the NEW x
        out.append((x, y, w, np.linalg.norm(F), gap))
    return out


@pytest.mark.parametrize("w0", ["y0", "zero"])
def test_matches_numpy_replica_of_algorithm_1(problem, w0):
    """Float64 both ways, the same operations up to summation order: rtol 1e-11."""
    ref = problem.reference
    y0 = np.random.default_rng(0).normal(size=DY)  # w_0 = y_0 matters only when y_0 != 0
    p = problem.replace(y0=jnp.asarray(y0))
    solver = bl.solvers.make("ibcg", lr_outer=0.3, lr_inner=0.15, lr_adjoint=0.12, w0=w0)
    state = solver.init(p, jax.random.key(0))
    step = jax.jit(solver.step, static_argnums=())
    w_start = y0 if w0 == "y0" else np.zeros(DY)
    expected = np_ibcg(ref, np.asarray(p.x0), y0, w_start, 0.3, 0.15, 0.12, steps=8)
    for x, y, w, norm, gap in expected:
        state = step(p, state)
        np.testing.assert_allclose(state.x, x, rtol=1e-11, atol=1e-14)
        np.testing.assert_allclose(state.y, y, rtol=1e-11, atol=1e-14)
        np.testing.assert_allclose(state.w, w, rtol=1e-11, atol=1e-14)
        metrics = solver.state_metrics(state)
        np.testing.assert_allclose(metrics["hypergrad_estimate_norm"], norm, rtol=1e-11)
        np.testing.assert_allclose(metrics["fw_gap_estimate"], gap, rtol=1e-11, atol=1e-14)
    assert int(state.counts.hvp) == 8 and int(state.counts.cross) == 8
    assert int(state.counts.grad_g) == 8 and int(state.counts.grad_f) == 8


def test_inner_step_uses_the_new_x(problem):
    """Spec pitfall 3: y_{k+1} = y_k - alpha grad_y g(x_{k+1}, y_k); the old x differs."""
    ref = problem.reference
    solver = bl.solvers.make("ibcg", lr_outer=0.5, lr_inner=0.1, lr_adjoint=0.1)
    state = solver.step(problem, solver.init(problem, jax.random.key(0)))
    x0, x1 = np.asarray(problem.x0), np.asarray(state.x)
    new = -0.1 * (-ref.B @ x1 - ref.b)  # y0 = 0
    old = -0.1 * (-ref.B @ x0 - ref.b)
    np.testing.assert_allclose(state.y, new, rtol=1e-12)
    assert not np.allclose(state.y, old)


def test_exact_variant_is_frank_wolfe_on_the_true_hypergradient(problem):
    """hessian_inverse="exact" + inner_solve="exact": y_k = y*(x_k), w = A^{-1} grad_y f, so
    F_k = grad F(x_k) (eq. (6) with exact pieces) and the step is FW on F: rtol 1e-10 (a dense
    solve against the closed form)."""
    ref = problem.reference
    solver = bl.solvers.make(
        "ibcg", lr_outer=0.2, lr_inner=0.1, lr_adjoint=0.1,
        hessian_inverse="exact", inner_solve="exact",
    )  # fmt: skip
    p = problem.replace(y0=jnp.asarray(ref.y_star(np.asarray(problem.x0))))
    state = solver.init(p, jax.random.key(0))
    x = np.asarray(p.x0)
    for _ in range(5):
        state = solver.step(p, state)
        s = np.zeros(DX)
        s[np.argmin(ref.grad_F(x))] = 1.0
        x = x + 0.2 * (s - x)
        np.testing.assert_allclose(state.x, x, rtol=1e-10)
        np.testing.assert_allclose(state.y, ref.y_star(x), rtol=1e-10)
    assert int(state.counts.hvp) == 0 and int(state.counts.dense) > 0


# ---- 2. stochastic replica: which draw feeds which oracle -------------------------------------
def test_stochastic_step_uses_its_declared_draws():
    """Rebuild the step's minibatches: outer draw 0 for both partials of f, inner draw 0 for the
    HVP (line 4), 1 for the cross product (line 5), 2 for the y step (line 8). A swap of any two
    draws changes the result (the draws are independent samples)."""
    p = simplex_problem(stochastic=True, n_samples=200)
    solver = bl.solvers.make("ibcg", lr_outer=0.3, lr_inner=0.1, lr_adjoint=0.1, batch_size=16)
    state = solver.init(p, jax.random.key(5))
    state = solver.step(p, state)  # one step to move y, w away from the start
    key, batch_key = jax.random.split(state.key)
    mb = minibatches(batch_key, p.outer_data, p.inner_data, 16, outer=1, inner=3)
    f, g = p.outer, p.inner
    x, y, w = state.x, state.y, state.w
    gx, gy = jax.grad(f, argnums=(0, 1))(x, y, mb.outer(0))
    hvp = jax.jvp(lambda yy: jax.grad(g, argnums=1)(x, yy, mb.inner(0)), (y,), (w,))[1]
    w1 = w - 0.1 * (hvp - gy)
    cross = jax.grad(lambda xx: jnp.vdot(jax.grad(g, argnums=1)(xx, y, mb.inner(1)), w1))(x)
    F = gx - cross
    s = jnp.zeros(DX).at[jnp.argmin(F)].set(1.0)
    x1 = x + 0.3 * (s - x)
    y1 = y - 0.1 * jax.grad(g, argnums=1)(x1, y, mb.inner(2))
    got = solver.step(p, state)
    np.testing.assert_allclose(got.w, w1, rtol=1e-12)
    np.testing.assert_allclose(got.x, x1, rtol=1e-12)
    np.testing.assert_allclose(got.y, y1, rtol=1e-12)
    assert int(got.counts.samples_inner) == 2 * 3 * 16
    assert int(got.counts.samples_outer) == 2 * 16


# ---- 3. Done means -----------------------------------------------------------------------------
def _rel_err(res, x0, x_star):
    return np.linalg.norm(np.asarray(res.x) - x_star) / np.linalg.norm(x0 - x_star)


@pytest.mark.parametrize("rule", ["convex", "nonconvex", "last-iterate"])
def test_default_steps_reach_x_star_on_the_simplex(problem, x_star, rule):
    """K = 3000 with the paper's defaults (gamma = log K/K or 1/sqrt K, alpha = 2/(mu+L),
    eta = 0.99 alpha): within 5% of ||x0 - x*|| (measured 0.3% convex, 2.4% nonconvex: a
    constant gamma leaves an O(gamma) zigzag), and the exact FW gap falls (measured 4.6 ->
    0.005 / 0.03; asserted 50x)."""
    res = bl.solve(
        problem, bl.solvers.make("ibcg", gamma_rule=rule), 3000, eval_every=500, progress=False
    )
    assert res.solver.horizon == 3000.0
    expected_gamma = np.log(3000) / 3000 if rule == "convex" else 1 / np.sqrt(3000)
    gamma = res.solver.lr_outer
    if rule == "last-iterate":  # 1/sqrt(K) for K/10 steps, then ~ k^(-3/2)
        assert gamma.horizon == 3000.0
        np.testing.assert_allclose(gamma(299), expected_gamma, rtol=1e-12)
        np.testing.assert_allclose(gamma(2999), expected_gamma / 10**1.5, rtol=1e-12)
        gamma = gamma.gamma
    np.testing.assert_allclose(gamma, expected_gamma, rtol=1e-12)
    np.testing.assert_allclose(res.solver.lr_inner, 2 / 11, rtol=1e-6)  # mu_g 1, L_g 10
    assert _rel_err(res, np.asarray(problem.x0), x_star) <= 0.05
    gap = res.history.fw_gap.to_numpy()
    assert gap[-1] <= gap[0] / 50 and (gap >= -1e-12).all()
    assert (res.history.fw_gap_estimate.iloc[1:] > 0).all()


def test_minibatches_reach_half_the_distance(x_star):
    """Noisy oracles (batch 32 of 2000 samples): within 50% of ||x0 - x*||. The stochastic
    quadratic's means are the deterministic one, so x* is the same."""
    p = simplex_problem(stochastic=True, n_samples=2000)
    np.testing.assert_allclose(p.reference.x_star, simplex_problem().reference.x_star)
    solver = bl.solvers.make("ibcg", gamma_rule="convex", batch_size=32)
    res = bl.solve(p, solver, 3000, eval_every=1000, progress=False, seed=1)
    assert _rel_err(res, np.asarray(p.x0), x_star) <= 0.5


# ---- 3b. minibatches: the LMO takes the running average of the estimates ----------------------
@pytest.fixture(scope="module")
def stochastic_simplex():
    return simplex_problem(stochastic=True, n_samples=2000)


def test_averaging_is_on_exactly_when_the_run_draws_minibatches(problem, stochastic_simplex):
    from bilevel.solvers.frank_wolfe.ibcg import averaging_weight

    assert bl.solvers.make("ibcg", batch_size=32).averages(stochastic_simplex)
    assert not bl.solvers.make("ibcg").averages(stochastic_simplex)
    assert not bl.solvers.make("ibcg", batch_size=32, averaging="none").averages(stochastic_simplex)
    assert bl.solvers.make("ibcg", averaging="sfw").averages(problem)
    k = np.array([0, 1, 10, 2999])  # Mokhtari et al. (2020): rho_t = 4 / (t + 8)^(2/3)
    np.testing.assert_allclose(averaging_weight(k), 4 / (k + 8) ** (2 / 3), rtol=1e-12)
    assert float(averaging_weight(0)) == 1.0  # d_0 = F_0


def test_the_direction_is_the_running_average_of_the_estimates(stochastic_simplex):
    """From one state, the averaged step's d_k is (1 - rho_k) d_{k-1} + rho_k F_k, where F_k is
    the plain step's direction from the same state and key (same draws), and its x moves
    toward the LMO vertex of d_k."""
    from bilevel.solvers.frank_wolfe.ibcg import averaging_weight

    p = stochastic_simplex
    solvers = {
        avg: bl.solvers.make(
            "ibcg", batch_size=32, averaging=avg, lr_outer=0.1, lr_inner=0.1, lr_adjoint=0.1
        ).resolve(p)
        for avg in ("none", "sfw")
    }
    step = jax.jit(lambda solver, state: solver.step(p, state))
    state = solvers["sfw"].init(p, jax.random.PRNGKey(3))
    for _ in range(3):  # a state with k = 3 and a d_2 that is no single estimate
        state = step(solvers["sfw"], state)
    plain, averaged = step(solvers["none"], state), step(solvers["sfw"], state)
    rho = float(averaging_weight(3))
    assert 0 < rho < 1
    expected = (1 - rho) * np.asarray(state.direction) + rho * np.asarray(plain.direction)
    np.testing.assert_allclose(averaged.direction, expected, rtol=1e-12, atol=1e-14)
    vertex = p.x_set.lmo(jnp.asarray(expected))
    np.testing.assert_allclose(averaged.x, 0.9 * np.asarray(state.x) + 0.1 * vertex, rtol=1e-12)


def test_minibatch_defaults_average_and_their_last_iterate_gap_falls(stochastic_simplex):
    """Batch 32, K = 3000, two seeds: with the defaults (the average, the last-iterate gamma)
    the exact FW gap of x_K ends at 0.03-0.06 (measured over 4 seeds; start 4.64), asserted
    <= 0.1; without the average every noisy F_k picks its own vertex and it ends at
    0.15-0.18 (asserted > 0.1: the average is what closes the gap)."""
    p = stochastic_simplex
    gaps = {}
    for avg in ("auto", "none"):
        solver = bl.solvers.make("ibcg", batch_size=32, averaging=avg)
        res = bl.solve(p, solver, 3000, eval_every=3000, progress=False, seeds=range(2))
        gaps[avg] = [float(bl.metrics.fw_gap(p, x)) for x in res.x]
    assert max(gaps["auto"]) <= 0.1 < min(gaps["none"]), gaps


# ---- 4. metrics and bad input ------------------------------------------------------------------
def test_fw_gap_and_grad_mapping_on_the_closed_form(problem, x_star):
    """G(x) = <grad F, x> - min_i grad F_i on the simplex; both measures vanish at x*
    (atol 1e-9: x* is certified to 1e-13, grad F is O(10))."""
    ref = problem.reference
    x = np.asarray(problem.x0)
    g = ref.grad_F(x)
    np.testing.assert_allclose(bl.metrics.fw_gap(problem, jnp.asarray(x)), g @ x - g.min())
    moved = np_project_simplex(x - g)
    np.testing.assert_allclose(
        bl.metrics.grad_mapping(problem, jnp.asarray(x)), np.linalg.norm(x - moved)
    )
    assert abs(float(bl.metrics.fw_gap(problem, jnp.asarray(x_star)))) < 1e-9
    assert float(bl.metrics.grad_mapping(problem, jnp.asarray(x_star))) < 1e-9
    with pytest.raises(ValueError, match="fw_gap needs a constrained upper level"):
        bl.metrics.fw_gap(bl.problems.quadratic(dx=3, dy=4), jnp.zeros(3))


def test_frank_wolfe_refuses_a_missing_or_unbounded_set():
    q = bl.problems.quadratic(dx=3, dy=4)
    solver = bl.solvers.make("ibcg", lr_outer=0.1, lr_inner=0.1, lr_adjoint=0.1)
    with pytest.raises(ValueError, match="Frank-Wolfe method: it needs a bounded"):
        bl.solve(q, solver, 10, progress=False)
    box = q.replace(x_set=bl.sets.Box(-1.0, np.inf))
    with pytest.raises(ValueError, match="infinite diameter"):
        bl.solve(box, solver, 10, progress=False)


def test_nuclear_ball_on_a_vector_is_refused_before_compiling():
    q = bl.problems.quadratic(dx=3, dy=4)
    with pytest.raises(ValueError, match="NuclearBall needs x to be a single 2-D array"):
        q.replace(x_set=bl.sets.NuclearBall(1.0))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lr_outer": 1.5}, r"must lie in \(0, 1\]"),
        ({"lr_outer": -0.1}, "lr_outer"),
        ({"lr_adjoint": 0.0}, "lr_adjoint"),
        ({"gamma_rule": "strong"}, "gamma_rule"),
        ({"hessian_inverse": "neumann"}, "hessian_inverse"),
        ({"inner_solve": "cg"}, "inner_solve"),
        ({"w0": "random"}, "w0"),
        ({"averaging": "momentum"}, "averaging"),
        ({"horizon": 0}, "horizon"),
        ({"outer_optimizer": "adam"}, "convex combination"),
    ],
)
def test_bad_options(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        bl.solvers.make("ibcg", **kwargs)


def test_auto_gamma_needs_a_horizon(problem):
    with pytest.raises(ValueError, match="give horizon=K"):
        bl.solvers.make("ibcg", lr_inner=0.1, lr_adjoint=0.1).resolve(problem)
    with pytest.raises(ValueError, match="horizon K >= 2"):
        bl.solvers.make("ibcg", lr_inner=0.1, lr_adjoint=0.1, horizon=1).resolve(problem)
    solver = bl.solvers.make("ibcg", lr_inner=0.1, lr_adjoint=0.1, horizon=100)
    gamma = solver.resolve(problem).lr_outer  # "last-iterate": 1/sqrt(100) for 10 steps
    np.testing.assert_allclose([gamma(0), gamma(9), gamma(39)], [0.1, 0.1, 0.0125], rtol=1e-12)
    solver = dataclasses.replace(solver, gamma_rule="nonconvex")
    np.testing.assert_allclose(solver.resolve(problem).lr_outer, 0.1)  # 1/sqrt(100)


def test_last_iterate_gammas_of_every_horizon_share_one_program(problem):
    """The default ``"last-iterate"`` gamma is a ``TracedSchedule``: its numbers are leaves of
    the solver, so runs of different horizons (every ``bl.solve(..., steps=K)``) reuse one
    compiled step; a static callable would compile one program per K."""
    step = jax.jit(lambda solver, state: solver.step(problem, state))
    for horizon in (100, 400):
        solver = bl.solvers.make("ibcg", lr_inner=0.1, lr_adjoint=0.1, horizon=horizon)
        solver = solver.resolve(problem)
        state = step(solver, solver.init(problem, jax.random.PRNGKey(0)))
        assert float(state.k) == 1
    assert step._cache_size() == 1

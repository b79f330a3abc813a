"""SOBA and SABA (Dagreou, Ablin, Vaiter, Moreau, NeurIPS 2022) against exact answers.

Deterministic quadratic (bl.problems.quadratic): d2g/dy2 = A, d2g/dxdy = -B',
grad_y g = A y - B x - b, grad_x f = -D'(y - D x - e) + rho x, grad_y f = y - D x - e.
The library's v is the paper's -v: v <- v - rho (H v - grad_y f), x-direction
grad_x f - d2g/dxdy v.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bilevel as bl
from bilevel import oracles
from bilevel.core import sampling


@pytest.fixture(scope="module")
def quad():
    return bl.problems.quadratic()  # dx = 10, dy = 50, mu_g = 1, L_g = 10


@pytest.fixture(scope="module")
def small_sto():
    return bl.problems.quadratic(dx=3, dy=4, stochastic=True, n_samples=40)


# ---- (a) deterministic replicas ---------------------------------------------------------------
@pytest.mark.parametrize(
    "name, regime",
    [("soba", "constant"), ("soba", "decreasing"), ("saba", "constant")],  # SABA: Theorem 2
)
def test_matches_the_papers_update_step_by_step(quad, name, regime):
    """Numpy replica of SOBA's simultaneous updates (Sec. 2: D_y, D_v, D_x all at
    (x_k, y_k, v_k), the cross term with the OLD v_k) on exact oracles; SABA on a problem
    without data is the same update (SAGA over one "sample", the whole function, is exact).
    "decreasing" is Theorem 1's rho_t = rho_0 t^-2/5, gamma_t = gamma_0 t^-3/5 with t = k + 1.
    rtol 1e-11: the same float64 arithmetic in another order."""
    ref = quad.reference
    gamma0, rho0 = 0.05, 0.08
    solver = bl.solvers.make(name, lr_outer=gamma0, lr_inner=rho0, regime=regime)
    state = solver.init(quad, jax.random.PRNGKey(0))
    step = jax.jit(solver.step)
    x, y, v = np.zeros(10), np.zeros(50), np.zeros(50)
    for k in range(5):
        t = k + 1
        rho, gamma = (rho0, gamma0) if regime == "constant" else (rho0 * t**-0.4, gamma0 * t**-0.6)
        grad_y_g = ref.A @ y - ref.B @ x - ref.b
        grad_y_f = y - ref.D @ x - ref.e
        grad_x_f = -ref.D.T @ grad_y_f + ref.rho * x
        d_x = grad_x_f - (-ref.B.T @ v)  # cross term with v_k, before v moves
        y, v, x = y - rho * grad_y_g, v - rho * (ref.A @ v - grad_y_f), x - gamma * d_x
        state = step(quad, state)
        np.testing.assert_allclose(state.x, x, rtol=1e-11, atol=1e-13)
        np.testing.assert_allclose(state.y, y, rtol=1e-11, atol=1e-13)
        np.testing.assert_allclose(state.v, v, rtol=1e-11, atol=1e-13)
    assert np.linalg.norm(v) > 1e-2  # v moved, so the cross term was exercised
    c = state.counts
    assert (int(c.grad_f), int(c.grad_g), int(c.hvp), int(c.cross)) == (5, 5, 5, 5)


# ---- (b) stochastic replicas: which sample feeds which oracle ---------------------------------
def test_soba_uses_one_inner_and_one_outer_sample(small_sto):
    """Rebuild each step's minibatches from the solver's key: inner draw 0 (sample i) feeds the
    y-gradient, the Hessian product AND the cross term; outer draw 0 (sample j) both partials
    of f. Three steps, so v_k != 0 and the products matter. Jitted replica, same float64 ops:
    rtol 1e-12."""
    p, bs, rho, gamma = small_sto, 5, 0.1, 0.07
    f, g = p.outer, p.inner
    solver = bl.solvers.make("soba", lr_outer=gamma, lr_inner=rho, batch_size=bs)
    state = solver.init(p, jax.random.PRNGKey(2))

    @jax.jit
    def replica(state):
        _, batch_key = jax.random.split(state.key)
        mb = sampling.minibatches(batch_key, p.outer_data, p.inner_data, bs, outer=1, inner=1)
        x, y, v, i, j = state.x, state.y, state.v, mb.inner(0), mb.outer(0)
        grad_x_f, grad_y_f = oracles.grads(f, x, y, j)
        y_new = y - rho * oracles.grad_y(g, x, y, i)
        v_new = v - rho * (oracles.hvp_yy(g, x, y, i, v) - grad_y_f)
        x_new = x - gamma * (grad_x_f - oracles.cross_xy(g, x, y, i, v))
        return x_new, y_new, v_new

    step = jax.jit(solver.step)
    for _ in range(3):
        x, y, v = replica(state)
        state = step(p, state)
        np.testing.assert_allclose(state.x, x, rtol=1e-12)
        np.testing.assert_allclose(state.y, y, rtol=1e-12)
        np.testing.assert_allclose(state.v, v, rtol=1e-12)
    assert (int(state.counts.samples_inner), int(state.counts.samples_outer)) == (3 * bs, 3 * bs)


def _one_row(data, r):
    return jax.tree.map(lambda a: a[r : r + 1], data)


@pytest.mark.parametrize("scheme", sampling.SCHEMES)
def test_saba_saga_estimates_and_memory(small_sto, scheme):
    """SABA's five SAGA estimates and memory rows rebuilt by hand: per-sample terms from
    one-row batches (a Python loop over the drawn rows, independent of the solver's vmap),
    estimate = mean_b(new_b - w[i_b]) + mean(w), then w[i_b] <- new_b; memory initialised by a
    pass over the data at (x_0, y_0) ("full"). Four steps, so rows are revisited and v != 0.
    Both sampling schemes: with windows the table rows are the window's rows, in batch order.
    rtol 1e-10: per-sample sums in another order, compounded over the steps."""
    p, bs, rho, gamma = small_sto.replace(sampling=scheme), 5, 0.1, 0.07
    f, g, n = p.outer, p.inner, 40
    solver = bl.solvers.make("saba", lr_outer=gamma, lr_inner=rho, batch_size=bs)
    state = solver.init(p, jax.random.PRNGKey(3))
    x, y, v = (np.asarray(a) for a in (state.x, state.y, state.v))
    mem_gy_g = np.stack([oracles.grad_y(g, x, y, _one_row(p.inner_data, r)) for r in range(n)])
    mem_hvp, mem_cross = np.zeros((n, 4)), np.zeros((n, 3))  # v_0 = 0: exact zeros
    outer0 = [oracles.grads(f, x, y, _one_row(p.outer_data, r)) for r in range(n)]
    mem_gx_f = np.stack([a for a, _ in outer0])
    mem_gy_f = np.stack([b for _, b in outer0])
    np.testing.assert_allclose(state.memory.grad_y_g, mem_gy_g, rtol=1e-12)
    np.testing.assert_allclose(state.memory.grad_x_f, mem_gx_f, rtol=1e-12)
    assert int(state.counts.samples_inner) == n and int(state.counts.grad_g) == 1

    def saga(new, table, rows):
        est = np.mean(new - table[rows], axis=0) + table.mean(axis=0)
        table = table.copy()
        table[rows] = new
        return est, table

    step = jax.jit(solver.step)
    for _ in range(4):
        _, batch_key = jax.random.split(state.key)
        mb = sampling.minibatches(
            batch_key, p.outer_data, p.inner_data, bs, outer=1, inner=1, scheme=scheme
        )
        rows_i, rows_j = np.asarray(mb.inner_rows(0)), np.asarray(mb.outer_rows(0))
        new_gy_g, new_hvp, new_cross, new_gx_f, new_gy_f = [], [], [], [], []
        for r in rows_i:
            batch = _one_row(p.inner_data, r)
            new_gy_g.append(oracles.grad_y(g, x, y, batch))
            new_hvp.append(oracles.hvp_yy(g, x, y, batch, jnp.asarray(v)))
            new_cross.append(oracles.cross_xy(g, x, y, batch, jnp.asarray(v)))
        for r in rows_j:
            a, b = oracles.grads(f, x, y, _one_row(p.outer_data, r))
            new_gx_f.append(a)
            new_gy_f.append(b)
        d_gy_g, mem_gy_g = saga(np.stack(new_gy_g), mem_gy_g, rows_i)
        d_hvp, mem_hvp = saga(np.stack(new_hvp), mem_hvp, rows_i)
        d_cross, mem_cross = saga(np.stack(new_cross), mem_cross, rows_i)
        d_gx_f, mem_gx_f = saga(np.stack(new_gx_f), mem_gx_f, rows_j)
        d_gy_f, mem_gy_f = saga(np.stack(new_gy_f), mem_gy_f, rows_j)
        y, v, x = y - rho * d_gy_g, v - rho * (d_hvp - d_gy_f), x - gamma * (d_gx_f - d_cross)
        state = step(p, state)
        for got, want in (
            (state.x, x),
            (state.y, y),
            (state.v, v),
            (state.memory.grad_y_g, mem_gy_g),
            (state.memory.hvp, mem_hvp),
            (state.memory.cross, mem_cross),
            (state.memory.grad_x_f, mem_gx_f),
            (state.memory.grad_y_f, mem_gy_f),
        ):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-13)
    assert np.abs(mem_cross).max() > 1e-3  # the product tables were really filled
    c = state.counts  # init pass (n per level) + 4 steps of bs samples, SOBA's calls per step
    assert (int(c.samples_inner), int(c.samples_outer)) == (n + 4 * bs, n + 4 * bs)
    assert (int(c.grad_g), int(c.grad_f), int(c.hvp), int(c.cross)) == (5, 5, 4, 4)


def test_saba_equals_soba_without_data(quad):
    """On a problem without data SABA's step is SOBA's (exact terms, no memory)."""
    a = bl.solve(quad, bl.solvers.make("soba", lr_inner=0.1, lr_outer=0.05), 30, progress=False)
    b = bl.solve(quad, bl.solvers.make("saba", lr_inner=0.1, lr_outer=0.05), 30, progress=False)
    np.testing.assert_allclose(b.x, a.x, rtol=1e-13)
    assert b.state.memory == (None,) * 5


# ---- (c) convergence to the closed-form x* -----------------------------------------------------
@pytest.mark.parametrize("name", ["soba", "saba"])
def test_deterministic_quadratic_reaches_x_star(quad, name):
    """Exact oracles, constant steps: the joint (y, v, x) iteration is a linear contraction
    (measured ||x - x*|| ~ 1e-15 relative at 600 steps), so 1% of ||x0 - x*|| is a loose bound
    that still fails for a wrong sign or a wrong sample (those do not converge to x*)."""
    x_star = quad.reference.x_star
    solver = bl.solvers.make(name, lr_outer=0.05, lr_inner=0.1)
    res = bl.solve(quad, solver, steps=600, eval_every=600, progress=False)
    err0 = np.linalg.norm(np.asarray(quad.x0) - x_star)
    assert np.linalg.norm(np.asarray(res.x) - x_star) <= 0.01 * err0


@pytest.mark.parametrize(
    "name, hyper",
    [
        # Theorem 1's decreasing steps (k0 = 100 so the early steps stay large)
        ("soba", dict(lr_outer=0.1, lr_inner=0.1, regime="decreasing", k0=100.0)),
        ("saba", dict(lr_outer=0.05, lr_inner=0.1)),  # Theorem 2's constant steps
    ],
)
def test_stochastic_quadratic_reaches_x_star(name, hyper):
    """Batch 32 on the 2000-sample quadratic, 3 seeds, 3000 steps: the mean ||x - x*|| must be
    within 50% of ||x0 - x*||. Measured: SOBA 0.02-0.04 ||x0 - x*|| by seed (still noise-
    limited), SABA <= 4e-14 (linear convergence, Theorem 3); 50% leaves a wide margin
    for seeds while a biased estimator (wrong sign, wrong sample) does not get there."""
    p = bl.problems.quadratic(stochastic=True)
    x_star = p.reference.x_star
    solver = bl.solvers.make(name, batch_size=32, **hyper)
    res = bl.solve(p, solver, steps=3000, seeds=[0, 1, 2], eval_every=3000, progress=False)
    errs = np.linalg.norm(np.asarray(res.x) - x_star, axis=1)
    assert errs.mean() <= 0.5 * np.linalg.norm(np.asarray(p.x0) - x_star), errs


# ---- (d) variance reduction -----------------------------------------------------------------
def test_saba_reduces_the_variance_of_soba():
    """Same finite-sum problem (400 samples per level), batch 16, same constant steps, 3 seeds,
    1500 steps: SOBA stalls at its noise floor (measured mean ||x - x*|| = 0.14), SABA keeps
    converging linearly (4e-16, machine precision). Asserted margin: SABA's mean error below
    SOBA's / 100 (measured ratio ~1e-15)."""
    p = bl.problems.quadratic(stochastic=True, n_samples=400)
    x_star = p.reference.x_star
    errs = {}
    for name in ("soba", "saba"):
        solver = bl.solvers.make(name, lr_outer=0.05, lr_inner=0.1, batch_size=16)
        res = bl.solve(p, solver, steps=1500, seeds=[0, 1, 2], eval_every=1500, progress=False)
        errs[name] = np.linalg.norm(np.asarray(res.x) - x_star, axis=1).mean()
    assert errs["saba"] < errs["soba"] / 100, errs


# ---- (e) bad options -------------------------------------------------------------------------
def test_bad_options(quad):
    with pytest.raises(ValueError, match="regime='slow'"):
        bl.solvers.make("soba", regime="slow")
    with pytest.raises(ValueError, match="k0"):
        bl.solvers.make("soba", regime="decreasing", k0=0.0)
    with pytest.raises(ValueError, match=r"regime='decreasing'.*\['constant'\]"):
        bl.solvers.make("saba", regime="decreasing")
    with pytest.raises(ValueError, match="init_memory='last'"):
        bl.solvers.make("saba", init_memory="last")
    with pytest.raises(ValueError, match="lr_inner"):
        bl.solvers.make("soba", lr_inner=-0.1)
    sto = bl.problems.quadratic(dx=3, dy=4, stochastic=True, n_samples=40)
    with pytest.raises(ValueError, match=r"SABA\(batch_size=None\) on .*give batch_size"):
        bl.solve(sto, bl.solvers.make("saba", lr_inner=0.1, batch_size=None), steps=2)
    with pytest.raises(ValueError, match="batch_size=64 is larger"):
        bl.solve(sto, bl.solvers.make("saba", lr_inner=0.1), steps=2)  # default 64 > 40


def test_saba_warns_before_large_memory_tables(small_sto, monkeypatch):
    """SAGA's tables: 40 inner rows of 2 dim_y + dim_x = 11 numbers and 40 outer rows of
    dim_x + dim_y = 7, float64: 40 * 18 * 8 = 5,760 bytes. Above the threshold: a warning
    naming the size; at it: none."""
    saba = bl.solvers.make("saba", lr_inner=0.1, batch_size=5)
    monkeypatch.setattr(type(saba), "memory_warning_bytes", 5759)
    with pytest.warns(UserWarning, match=r"SABA on .*40 inner rows of 11 numbers.*consider 'soba'"):
        saba.check_problem(small_sto)
    monkeypatch.setattr(type(saba), "memory_warning_bytes", 5760)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        saba.check_problem(small_sto)

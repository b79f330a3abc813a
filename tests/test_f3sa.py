"""F3SA (Kwon et al., ICML 2023, Algorithm 2, Appendix C) against exact answers."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bilevel as bl
from bilevel import oracles
from bilevel.core import sampling
from bilevel.solvers.penalty.f3sa import F3SA_REGIMES, F3SAEstimators, momentum_weight


@functools.cache
def _jit_step(solver):
    """One compiled step per solver configuration, shared by the tests that use it."""
    return jax.jit(solver.step)


@pytest.fixture(scope="module")
def quad():
    return bl.problems.quadratic()  # dx = 10, dy = 50, mu_g = 1, L_g = 10


def test_schedules_lam_ratio_and_momentum_weights(quad):
    """(9a)-(9b) with the spec's corrections: lam_k = gamma_k / alpha_k (so beta_k = gamma_k),
    eta_0 = eta_1 = 1 and eta_k = (k+1)^(-2c) after."""
    solver = bl.solvers.make("f3sa", lr_outer=0.3, lr_inner=0.2, lam0=5.0, k0=10.0, a=0.6, c=0.4)
    for k in (0, 1, 7, 1000):
        s = solver.schedule(quad, k)
        assert float(s.lam) == pytest.approx(float(s.gamma / s.alpha), rel=1e-12)
        assert float(s.lam) == pytest.approx(5.0 * ((k + 10) / 10) ** 0.2, rel=1e-12)
        assert float(s.alpha * s.lam) == pytest.approx(float(s.gamma), rel=1e-12)
        assert float(s.outer) == pytest.approx(0.3 * (10 / (k + 10)) ** 0.6, rel=1e-12)
    etas = [float(solver.momentum(quad, k)) for k in range(5)]
    assert etas[:2] == [1.0, 1.0]  # (8b), not (9a)'s 2^(-0.8) at k = 1
    np.testing.assert_allclose(etas[2:], [(k + 1) ** -0.8 for k in (2, 3, 4)], rtol=1e-14)
    assert float(momentum_weight(5, 0.0)) == 1.0  # deterministic regime: no momentum
    assert [float(momentum_weight(k, 0.4, eta=0.3)) for k in (0, 1, 2, 9)] == [1, 1, 0.3, 0.3]


def test_regimes_follow_corollary_4_4(quad):
    assert F3SA_REGIMES["stochastic"] == (3 / 5, 2 / 5)
    assert F3SA_REGIMES["outer-noise"] == (1 / 2, 1 / 4)
    assert F3SA_REGIMES["deterministic"] == (1 / 3, 0.0)
    s = bl.solvers.make("f3sa")
    assert s.exponents(quad) == F3SA_REGIMES["deterministic"]
    p = bl.problems.quadratic(dx=2, dy=3, stochastic=True, n_samples=10)
    assert s.exponents(p) == F3SA_REGIMES["deterministic"]  # full batches are exact
    assert bl.solvers.make("f3sa", batch_size=4).exponents(p) == F3SA_REGIMES["stochastic"]


# ---- a numpy replica of Algorithm 2, written from the corrected spec (section 3.5) -------------
def _numpy_f3sa(ref, s, k, *, lr_outer, lr_inner, lam0, a, c, k0, lam=None):
    """One F3SA iteration on the deterministic quadratic; ``s`` holds x, y, z, their previous
    values and the six estimators (dict of numpy arrays). ``lam`` (lam_k) defaults to the
    closed form of (9b)."""
    A, B, b, D, e, rho, cx = ref.A, ref.B, ref.b, ref.D, ref.e, ref.rho, ref.c_x
    gamma = lr_inner * (k0 / (k + k0)) ** c  # (9a)
    alpha = lr_inner / lam0 * (k0 / (k + k0)) ** a  # (9a), (9c): gamma_0 / alpha_0 = lam0
    if lam is None:
        lam = lam0 * ((k + k0) / k0) ** (a - c)  # closed form of (9b): gamma_k / alpha_k
    eta = 1.0 if k <= 1 else (k + 1) ** (-2 * c)  # (9a) with (8b)'s eta_0 = eta_1 = 1

    def gy_g(x, y):
        return A @ y - B @ x - b

    def gy_f(x, y):
        return y - D @ x - e

    def gx_f(x, y):
        return -D.T @ (y - D @ x - e) + rho * x

    def gx_g(x, y):
        return -B.T @ y + cx * x

    def storm(grad, point, previous_point, previous_estimate):  # Appendix C
        return grad(*point) + (1 - eta) * (previous_estimate - grad(*previous_point))

    x, y, z, xp, yp, zp = (s[n] for n in ("x", "y", "z", "xp", "yp", "zp"))
    h_gz = storm(gy_g, (x, z), (xp, zp), s["gz"])
    h_fy = storm(gy_f, (x, y), (xp, yp), s["fy"])
    h_gy = storm(gy_g, (x, y), (xp, yp), s["gy"])
    z1 = z - gamma * h_gz
    y1 = y - alpha * (h_fy + lam * h_gy)
    h_fx = storm(gx_f, (x, y1), (xp, y), s["fx"])
    h_gxy = storm(gx_g, (x, y1), (xp, y), s["gxy"])
    h_gxz = storm(gx_g, (x, z1), (xp, z), s["gxz"])
    x1 = x - lr_outer * (k0 / (k + k0)) ** a * (h_fx + lam * (h_gxy - h_gxz))
    return dict(x=x1, y=y1, z=z1, xp=x, yp=y, zp=z, gz=h_gz, fy=h_fy, gy=h_gy, fx=h_fx,
                gxy=h_gxy, gxz=h_gxz)  # fmt: skip


@pytest.mark.parametrize("start", ["init", "mid-run"])
def test_matches_algorithm_2_step_by_step(quad, start):
    """rtol 1e-11 (float64, a few dozen flops per entry). From ``init`` the estimators start at
    zero and eta_0 = eta_1 = 1. With exact oracles a correct STORM recursion reproduces the plain
    gradient, so the ``mid-run`` start (k = 3, random previous points and estimators) is what
    makes eta_k, the (1 - eta_k) recursion and the previous-point pairs visible."""
    hp = dict(lr_outer=0.05, lr_inner=0.08, lam0=4.0, k0=3.0, regime="stochastic")
    solver = bl.solvers.make("f3sa", **hp)
    a, c = F3SA_REGIMES["stochastic"]
    ref = quad.reference
    state = solver.init(quad, jax.random.PRNGKey(0))
    rng = np.random.default_rng(1)
    s = dict(x=np.zeros(10), y=np.zeros(50), z=np.zeros(50), xp=np.zeros(10), yp=np.zeros(50),
             zp=np.zeros(50), gz=np.zeros(50), fy=np.zeros(50), gy=np.zeros(50),
             fx=np.zeros(10), gxy=np.zeros(10), gxz=np.zeros(10))  # fmt: skip
    k_first = 0
    if start == "mid-run":
        s = {n: 0.3 * rng.standard_normal(v.shape) for n, v in s.items()}
        k_first = 3
        state = state._replace(
            x=jnp.asarray(s["x"]), y=jnp.asarray(s["y"]), z=jnp.asarray(s["z"]),
            x_prev=jnp.asarray(s["xp"]), y_prev=jnp.asarray(s["yp"]),
            z_prev=jnp.asarray(s["zp"]), k=jnp.asarray(k_first, jnp.int32),
            est=F3SAEstimators(*(jnp.asarray(s[n]) for n in F3SAEstimators._fields)),
        )  # fmt: skip
    step = _jit_step(solver)
    for k in range(k_first, k_first + 4):
        s = _numpy_f3sa(ref, s, k, lr_outer=0.05, lr_inner=0.08, lam0=4.0, a=a, c=c, k0=3.0)
        state = step(quad, state)
        got = dict(x=state.x, y=state.y, z=state.z, xp=state.x_prev, yp=state.y_prev,
                   zp=state.z_prev, **state.est._asdict())  # fmt: skip
        for name, value in s.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-11, atol=1e-13, err_msg=name)
    c_ = state.counts
    assert (int(c_.grad_f), int(c_.grad_g)) == (4 * 4, 4 * 8)  # 6 estimators x 2 points


def test_lagged_multiplier_rule_step_by_step(quad):
    """``lam_rule="lagged"``: literal (9b), delta_k = gamma_k/alpha_k - lam_k, run as an update
    in the replica (lam_0 = lam_1 = lam0, lam_{k+1} = gamma_k/alpha_k) with alpha_k, gamma_k on
    their power laws. Four steps, so that eta_2, eta_3 < 1 and the momentum is live. Tolerances
    as in the replica test above; the closed rule's trajectory differs by > 1e-4 (checked)."""
    hp = dict(lr_outer=0.05, lr_inner=0.08, lam0=4.0, k0=3.0, regime="stochastic")
    solver = bl.solvers.make("f3sa", lam_rule="lagged", **hp)
    a, c = F3SA_REGIMES["stochastic"]
    kw = dict(lr_outer=0.05, lr_inner=0.08, lam0=4.0, a=a, c=c, k0=3.0)
    ref = quad.reference
    names = ("x", "y", "z", "xp", "yp", "zp", "gz", "fy", "gy", "fx", "gxy", "gxz")
    s = closed = {n: np.zeros(10 if n in ("x", "xp", "fx", "gxy", "gxz") else 50) for n in names}
    lam = 4.0  # lam_0
    state = solver.init(quad, jax.random.PRNGKey(0))
    step = _jit_step(solver)
    for k in range(4):
        s = _numpy_f3sa(ref, s, k, lam=lam, **kw)
        closed = _numpy_f3sa(ref, closed, k, **kw)
        gamma, alpha = 0.08 * (3.0 / (k + 3.0)) ** c, 0.08 / 4.0 * (3.0 / (k + 3.0)) ** a
        lam = lam + (gamma / alpha - lam)  # delta_k of (9b)
        state = step(quad, state)
        for name, got in (("x", state.x), ("y", state.y), ("z", state.z)):
            np.testing.assert_allclose(got, s[name], rtol=1e-11, atol=1e-13, err_msg=name)
        if k >= 1:
            assert np.abs(s["x"] - closed["x"]).max() > 1e-4


def test_constant_regime_is_section_4_4(quad):
    """Sec. 4.4's constant multiplier with alpha_k, gamma_k ~ k^(-1/2) (as F2SA), and (9a)'s
    momentum weight eta_k = (k+1)^(-2c) = 1/(k+1) from k = 2 on. Exact up to one rounding."""
    assert F3SA_REGIMES["constant"] == (0.5, 0.5)
    solver = bl.solvers.make(
        "f3sa", lr_outer=0.3, lr_inner=0.2, lam0=5.0, k0=10.0, regime="constant"
    )
    for k in (0, 1, 7, 1000):
        s = solver.schedule(quad, k)
        decay = (10.0 / (k + 10.0)) ** 0.5
        assert float(s.lam) == 5.0
        assert float(s.gamma) == pytest.approx(0.2 * decay, rel=1e-14)
        assert float(s.alpha) == pytest.approx(0.2 / 5.0 * decay, rel=1e-14)
        assert float(s.outer) == pytest.approx(0.3 * decay, rel=1e-14)
    etas = [float(solver.momentum(quad, k)) for k in (0, 1, 2, 9)]
    assert etas == pytest.approx([1.0, 1.0, 1 / 3, 1 / 10], rel=1e-14)


@pytest.mark.parametrize("shared_inner", [True, False])
@pytest.mark.parametrize("shared", [True, False])
def test_momentum_evaluates_the_same_sample_at_both_points(shared, shared_inner):
    """Rebuilds each step's minibatches with ``sampling.minibatches`` and recomputes all
    six estimators: each one's sample is used at the current AND the previous point; h_gxy and
    h_gxz share phi_x (Appendix C) unless ``shared_x_sample=False``, h_gz and h_gy share one
    unless ``shared_inner_sample=False`` (Algorithm 2's phi_z, phi_y). Four steps, so that
    eta_2, eta_3 < 1 and the recursion is live. rtol 1e-12: the same float64 operations."""
    p = bl.problems.quadratic(dx=3, dy=4, stochastic=True, n_samples=50)
    bs, lr_in, lr_out, lam0, k0 = 5, 0.1, 0.1, 3.0, 2.0
    solver = bl.solvers.make(
        "f3sa", lr_outer=lr_out, lr_inner=lr_in, batch_size=bs, lam0=lam0, k0=k0,
        shared_x_sample=shared, shared_inner_sample=shared_inner,
    )  # fmt: skip
    a, c = solver.exponents(p)
    assert (a, c) == F3SA_REGIMES["stochastic"]
    f, g = p.outer, p.inner
    n_x, n_y = (1 if shared else 2), (1 if shared_inner else 2)

    @jax.jit
    def replica(state):
        _, batch_key = jax.random.split(state.key)
        mb = sampling.minibatches(batch_key, p.outer_data, p.inner_data, bs, outer=2,
                                  inner=n_y + n_x)  # fmt: skip
        k = state.k.astype(float)
        gamma = lr_in * (k0 / (k + k0)) ** c
        lam = lam0 * ((k + k0) / k0) ** (a - c)
        eta = jnp.where(k <= 1, 1.0, (k + 1) ** (-2 * c))
        x, y, z, xp, est = state.x, state.y, state.z, state.x_prev, state.est

        def storm(oracle, fn, now, before, sample, prev_est):
            return oracle(fn, *now, sample) + (1 - eta) * (prev_est - oracle(fn, *before, sample))

        h_gz = storm(oracles.grad_y, g, (x, z), (xp, state.z_prev), mb.inner(0), est.gz)
        h_fy = storm(oracles.grad_y, f, (x, y), (xp, state.y_prev), mb.outer(0), est.fy)
        h_gy = storm(oracles.grad_y, g, (x, y), (xp, state.y_prev), mb.inner(n_y - 1), est.gy)
        z1, y1 = z - gamma * h_gz, y - gamma / lam * (h_fy + lam * h_gy)
        h_fx = storm(oracles.grad_x, f, (x, y1), (xp, y), mb.outer(1), est.fx)
        h_gxy = storm(oracles.grad_x, g, (x, y1), (xp, y), mb.inner(n_y), est.gxy)
        h_gxz = storm(oracles.grad_x, g, (x, z1), (xp, z), mb.inner(n_y + n_x - 1), est.gxz)
        x1 = x - lr_out * (k0 / (k + k0)) ** a * (h_fx + lam * (h_gxy - h_gxz))
        # a wrong variant (another sample at the previous point) to show the check is sharp
        wrong_gz = storm(oracles.grad_y, g, (x, z), (xp, state.z_prev), mb.inner(1), est.gz)
        expected = F3SAEstimators(h_gz, h_fy, h_gy, h_fx, h_gxy, h_gxz)
        return expected, (x1, y1, z1), wrong_gz, mb.inner(0)["b"], mb.inner(1)["b"]

    state = solver.init(p, jax.random.PRNGKey(7))
    step = jax.jit(solver.step)
    for k in range(4):
        new = step(p, state)
        expected, (x1, y1, z1), wrong_gz, b0, b1 = replica(state)
        for name in F3SAEstimators._fields:
            np.testing.assert_allclose(
                getattr(new.est, name), getattr(expected, name), rtol=1e-12, err_msg=name
            )
        np.testing.assert_allclose(new.x, x1, rtol=1e-12)
        np.testing.assert_allclose(new.y, y1, rtol=1e-12)
        np.testing.assert_allclose(new.z, z1, rtol=1e-12)
        if k == 3:  # eta_3 < 1: a different sample at the previous point would change h_gz
            assert not np.allclose(wrong_gz, expected.gz, rtol=1e-6)
            assert not np.array_equal(b0, b1)
        state = new
    assert int(state.counts.samples_inner) == 4 * bs * (n_y + n_x)
    assert int(state.counts.samples_outer) == 4 * bs * 2


def test_deterministic_quadratic_reaches_1e2_x_error(quad):
    """Done-means: ||x_K - x*|| <= 1e-2 ||x_0 - x*|| (x_0 = 0), default regime ("auto" ->
    deterministic: lam_k = 10 ((k+100)/100)^(1/3)). The error is bias-limited, ~ C/lam_k:
    at lam = 10 the penalty minimiser x*_lam is 1.4e-2 from x*, at lam_1000 = 22 about 6e-3."""
    solver = bl.solvers.make("f3sa", lr_outer=0.05, lr_inner=0.1)
    res = bl.solve(quad, solver, steps=1000, eval_every=1000, progress=False)
    x0_err = np.linalg.norm(quad.reference.x_star)
    assert res.history.x_err.iloc[0] == pytest.approx(x0_err, rel=1e-12)
    assert res.history.x_err.iloc[-1] <= 1e-2 * x0_err, res.history


@pytest.fixture(scope="module")
def stochastic_runs():
    """Batch 32, seeds 0-4, 1000 steps, regime "auto" (-> stochastic), with and without
    momentum (eta = 1 turns F3SA into single-loop F2SA with lam = gamma/alpha). lam0 = 10:
    with this fixed lr_outer, the smaller "auto" lam0 of sampled inner gradients (1 here) leaves
    both runs at the penalty's O(1/lam) bias (0.55 and 0.67), which hides the momentum."""
    p = bl.problems.quadratic(stochastic=True)
    hp = dict(lr_outer=0.05, lr_inner=0.05, batch_size=32, lam0=10.0)
    out = {}
    for label, extra in (("momentum", {}), ("no momentum", {"eta": 1.0})):
        res = bl.solve(p, bl.solvers.make("f3sa", **hp, **extra), steps=1000, seeds=range(5),
                       eval_every=1000, progress=False)  # fmt: skip
        out[label] = res.history.groupby("step").grad_norm.mean()
    return out


def test_stochastic_quadratic_5_seeds_10x(stochastic_runs):
    """Done-means: mean ||grad F|| over 5 seeds falls >= 10x (observed ~17x)."""
    mean = stochastic_runs["momentum"]
    assert mean.iloc[-1] <= mean.iloc[0] / 10, mean


def test_momentum_reduces_the_noise_floor(stochastic_runs):
    """The point of Algorithm 2: the same runs with eta_k = 1 stall at a noise floor about 2.7x
    higher (same seeds, so the comparison is paired); require at least 1.5x."""
    with_m, without = stochastic_runs["momentum"].iloc[-1], stochastic_runs["no momentum"].iloc[-1]
    assert with_m * 1.5 <= without, (with_m, without)


def test_bad_options():
    with pytest.raises(ValueError, match="regime='fast'"):
        bl.solvers.make("f3sa", regime="fast")
    with pytest.raises(ValueError, match="a >= c"):
        bl.solvers.make("f3sa", a=0.2, c=0.5)
    with pytest.raises(ValueError, match="eta=1.5"):
        bl.solvers.make("f3sa", eta=1.5)
    with pytest.raises(ValueError, match="lam_rule"):
        bl.solvers.make("f3sa", lam_rule="fast")
    with pytest.raises(ValueError, match="inner_steps"):  # T = 1: there is no inner loop
        bl.solvers.make("f3sa", inner_steps=3)

"""The synthetic online streams (bl.problems.drifting_quadratic, bl.problems.oscillating): their
closed forms against the library's dense reference solves, their drift, and the variation
measures of bl.metrics.variation against brute force.

Break checks (made once by hand on 2026-11-24, then reverted): the box sup taken with the two LMOs
swapped fails the brute-force variation test; the oscillating sign (-1)^(t+1) instead of
(-1)^t fails the oscillating closed-form test.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bilevel as bl
from bilevel import metrics


@pytest.fixture(scope="module")
def stream():
    return bl.problems.drifting_quadratic(
        dx=3, dy=4, horizon=12, drift_inner=0.2, drift_outer=0.3, seed=1
    )


def test_drifting_quadratic_closed_forms_match_dense_solves(stream):
    """y*_t, F_t, grad F_t and y*_{lam,t} against Newton + dense IFT on round t's functions
    (exact on a quadratic up to a dense solve of a condition-10 system: 1e-10)."""
    ref = stream.reference
    x = jnp.array([0.3, -0.2, 0.5])
    for t in (1, 5, 12):
        f, g = stream.at_round(t)
        y_star = metrics.newton_inner_solution(g, x, stream.y0, None)
        np.testing.assert_allclose(ref.y_star(t, x), y_star, rtol=1e-10)
        np.testing.assert_allclose(ref.F(t, x), f(x, y_star, None), rtol=1e-10)
        grad = metrics.dense_hypergradient(f, g, x, stream.y0, None, None)
        np.testing.assert_allclose(ref.grad_F(t, x), grad, rtol=1e-10, atol=1e-12)

        def lagrangian(x_, y_, b, f=f, g=g):
            return f(x_, y_, b) + 7.0 * g(x_, y_, b)

        penalty = metrics.newton_inner_solution(lagrangian, x, stream.y0, None)
        np.testing.assert_allclose(ref.y_star_penalty(t, x, 7.0), penalty, rtol=1e-10)


def test_drift_steps_have_the_stated_length():
    """c_t and b_t are random walks whose step at round t has length drift * t^-decay."""
    p = bl.problems.drifting_quadratic(
        horizon=30, drift_inner=0.2, drift_outer=0.5, drift_decay=0.75
    )
    t = np.arange(2, 31)
    for centres, speed in ((p.reference.c, 0.2), (p.reference.b, 0.5)):
        steps = np.linalg.norm(np.diff(centres, axis=0), axis=1)
        np.testing.assert_allclose(steps, speed * t**-0.75, rtol=1e-12)
    still = bl.problems.drifting_quadratic(horizon=5)
    assert np.all(still.reference.c == still.reference.c[0])


def test_stochastic_stream_has_the_deterministic_problem_as_its_round_means():
    """The per-round samples average exactly to c_t and b_t, so round t's full data gives the
    deterministic f_t, g_t (same seed: the same instance), and a batch is unbiased."""
    det = bl.problems.drifting_quadratic(horizon=6, drift_inner=0.3, drift_outer=0.3)
    sto = bl.problems.drifting_quadratic(
        horizon=6, drift_inner=0.3, drift_outer=0.3, stochastic=True, n_samples=10
    )
    assert sto.n_inner == sto.n_outer == 10
    assert sto.inner_data["c"].shape == (6, 10, 10)
    x, y = jnp.linspace(-1, 1, 5), jnp.linspace(0, 1, 10)
    for t in (1, 6):
        fd, gd = det.at_round(t)
        fs, gs = sto.at_round(t)
        od, idata = sto.evaluation_data(t)
        np.testing.assert_allclose(fs(x, y, od), fd(x, y, None), rtol=1e-12)
        np.testing.assert_allclose(gs(x, y, idata), gd(x, y, None), rtol=1e-12)
    np.testing.assert_array_equal(sto.reference.c, det.reference.c)


def test_oscillating_closed_forms():
    """Sec. 4.2: y*_t(x) = (-1)^t x, F_t(x) = c exp(-x^2) for every t."""
    p = bl.problems.oscillating(horizon=6, c=0.8, mu_g=2.0)
    ref = p.reference
    x = jnp.array([0.4])
    for t in (1, 2, 5):
        f, g = p.at_round(t)
        y_star = metrics.newton_inner_solution(g, x, p.y0, None)
        np.testing.assert_allclose(y_star, (-1) ** t * 0.4, rtol=1e-12)
        np.testing.assert_allclose(ref.y_star(t, x), y_star, rtol=1e-12)
        np.testing.assert_allclose(ref.F(t, x), 0.8 * np.exp(-0.16), rtol=1e-12)
        grad = metrics.dense_hypergradient(f, g, x, p.y0, None, None)
        np.testing.assert_allclose(ref.grad_F(t, x), grad, rtol=1e-10)
    assert isinstance(p.x_set, bl.sets.Box) and float(p.x0[0]) == 0.5


def test_oscillating_variation_in_closed_form():
    """V_T = 0, H_{2,T} = 4 (T - 1), E^g_{y,T} = 4 mu_g^2 (T - 1) (Sec. 4.2)."""
    v = bl.metrics.variation(bl.problems.oscillating(horizon=50, mu_g=3.0))
    totals = v.totals()
    assert totals["V_T"] == 0.0 and totals["E_f_yT"] == 0.0
    assert totals["H_2T"] == pytest.approx(4 * 49) and totals["E_g_yT"] == pytest.approx(36 * 49)
    assert v.H2.shape == (50,) and v.H2[0] == 0.0 and v.H2[1] == pytest.approx(4.0)


def test_drifting_quadratic_variation_against_brute_force(stream):
    """Over a box, sup |F_t - F_{t-1}| of an affine difference is attained at a vertex: the
    closed form (two LMOs) must equal the max over all 8 vertices (1e-12). H_{2,T}, E^f, E^g
    do not depend on x: any x gives them."""
    box = bl.sets.Box(-0.5, 1.0)
    v = bl.metrics.variation(stream.replace(x_set=box))
    ref = stream.reference
    vertices = [jnp.array(p) for p in itertools.product([-0.5, 1.0], repeat=3)]
    T = stream.horizon

    def F_all(x):
        return np.array([ref.F(t, x) for t in range(1, T + 1)])

    brute = np.max([np.abs(np.diff(F_all(x))) for x in vertices], axis=0)
    np.testing.assert_allclose(np.diff(v.V), brute, rtol=1e-12)
    x = jnp.array([0.1, 0.2, -0.3])
    ys = np.array([ref.y_star(t, x) for t in range(1, T + 1)])
    np.testing.assert_allclose(np.diff(v.H2), np.sum(np.diff(ys, axis=0) ** 2, axis=1), rtol=1e-10)
    np.testing.assert_allclose(np.diff(v.E_f), np.sum(np.diff(ref.b, axis=0) ** 2, axis=1))
    np.testing.assert_allclose(v.P, v.H2 + v.E_f + v.E_g)
    assert "Box" in v.over


def test_variation_over_a_ball_and_over_points(stream):
    """Over ||x|| <= R the sup of |<a, x> + d| is |d| + R ||a||, attained at x = +-R a/||a||;
    over a finite set of points (a reference without ``variation``) it can only be smaller."""
    v = bl.metrics.variation(stream, radius=2.0)
    assert v.over == "the ball ||x|| <= 2.0"
    ref = stream.reference

    class PointsOnly:  # F and y_star only: variation() falls back to the given points
        F, y_star = ref.F, ref.y_star

    points = jax.random.normal(jax.random.key(0), (40, 3))
    points = 2.0 * points / jnp.linalg.norm(points, axis=1, keepdims=True)
    on_points = bl.metrics.variation(stream.replace(reference=PointsOnly()), xs=points)
    assert on_points.over.startswith("the 40 given points") and on_points.E_f is None
    assert np.all(np.diff(on_points.V) <= np.diff(v.V) + 1e-12)
    np.testing.assert_allclose(on_points.H2, v.H2, rtol=1e-10)  # x-independent here
    with pytest.raises(ValueError, match=r"infinite over an unbounded X.*radius="):
        bl.metrics.variation(stream)
    with pytest.raises(ValueError, match=r"needs closed forms"):
        bl.metrics.variation(stream.replace(reference=None))


def test_f2obo_plays_the_oscillating_stream_inside_the_box():
    p = bl.problems.oscillating(horizon=30)
    solver = bl.solvers.make("f2obo", lr_outer=0.1, lr_inner=0.5, inner_steps=5, tau=0.5)
    res = bl.solve_online(p, solver, progress=False)
    assert res.ok and res.regret_oracle == "closed form"
    assert np.all(np.abs(res.xs) <= 1.0) and np.all(np.isfinite(res.regret))

"""The online hypergradient baselines: AOBO and FSOBO (Jia, Wang & Chen, arXiv:2602.06457) and
SOGD (Nazari et al., arXiv:2511.01126), against numpy replicas written from their updates.

The replicas run on the drifting quadratic (grad_y g_t = A y - B x - c_t, d2g/dy2 = A,
d2g/dxdy v = -B^T v, grad_y f_t = y - b_t, grad_x f = rho x) and, for SOGD and the sample
layouts, on a variant whose x-gradient, Hessian and cross term depend on the round and the
sample (``_stream``): on the drifting quadratic the estimator h = rho x + B^T v is the same
function every round, so the STORM correction h_t(x_{t-1}, y_t, v_t) equals h_{t-1} exactly
and SOGD's direction reduces to h_t (checked below); the variant is needed to see the recursion.

Break checks (each made once by hand on 2026-11-24, then reverted; the tests named failed):
* AOBO's loop stopping early (``norm > 10 * tol`` in ``descend_until``):
  test_aobo_rounds_match_a_numpy_replica at round 1 (the cap test still passed: the cap binds);
* the linear system and hypergradient at the OLD y_t instead of y_{t+1} (``state.y`` for ``y``
  in ``HypergradientRound.round``): the AOBO and the FSOBO replica tests at round 1;
* SOGD's correction on another inner draw than the round's cross term (``mb.inner(1)`` for
  ``h_old``): test_sogd_rounds_match_a_numpy_replica[3-storm] at round 2, and only it;
* SOGD without d_1 = h_1 (the ``tree_where(first, h, d)`` line removed): all four
  test_sogd_rounds_match_a_numpy_replica cases at round 1.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from online_helpers import play_rounds, round_draws

import bilevel as bl

TOL = dict(rtol=1e-10, atol=1e-13)


def _quad(**kw):
    return bl.problems.drifting_quadratic(
        **{"dx": 3, "dy": 4, "horizon": 6, "cond": 2.0, "drift_inner": 0.3, "drift_outer": 0.3} | kw
    )


# ---- AOBO and FSOBO on the drifting quadratic ---------------------------------------------------
def _aobo_replica(ref, x0, y0, rounds, *, alpha, beta, gamma, delta, cap, K_v, project=None):
    """AOBO in numpy: GD on y while ||grad_y g_t|| > delta (at most cap steps), K_v steps of
    v <- v - beta (A v - (y - b_t)) from the previous v, x <- x - gamma (rho x + B^T v).
    cap = 1 with delta = 0 is FSOBO. Returns per round (x, y, v, y steps)."""
    A, B, rho = ref.A, ref.B, ref.rho_x
    x, y, v = np.array(x0, float), np.array(y0, float), np.zeros(len(y0))
    out = []
    for t in range(1, rounds + 1):
        c, b = ref.c[t - 1], ref.b[t - 1]
        grad, k = A @ y - B @ x - c, 0
        while np.linalg.norm(grad) > delta and k < cap:
            y = y - alpha * grad
            grad, k = A @ y - B @ x - c, k + 1
        for _ in range(K_v):
            v = v - beta * (A @ v - (y - b))
        step = x - gamma * (rho * x + B.T @ v)
        x = step if project is None else project(step)
        out.append((x.copy(), y.copy(), v.copy(), k))
    return out


@pytest.mark.parametrize("constrained", [False, True])
def test_aobo_rounds_match_a_numpy_replica(constrained):
    """Six rounds; the y steps taken vary by round and are what numpy needs to reach delta.
    1e-10 relative: float64 on both sides, the same arithmetic up to summation order."""
    x_set = bl.sets.Box(-0.05, 0.05) if constrained else None
    problem = _quad(x_set=x_set)
    kw = dict(lr_outer=0.2, lr_inner=0.3, lr_linear=0.25, tolerance=0.05, linear_steps=3)
    played = play_rounds(bl.solvers.make("aobo", **kw), problem, 6)
    want = _aobo_replica(
        problem.reference,
        problem.x0,
        problem.y0,
        6,
        alpha=0.3,
        beta=0.25,
        gamma=0.2,
        delta=0.05,
        cap=200,
        K_v=3,
        project=(lambda v: np.clip(v, -0.05, 0.05)) if constrained else None,
    )
    steps = []
    for t, (state, (x, y, v, k)) in enumerate(zip(played, want, strict=True), start=1):
        np.testing.assert_allclose(state.x, x, **TOL, err_msg=f"x, round {t}")
        np.testing.assert_allclose(state.y, y, **TOL, err_msg=f"y, round {t}")
        np.testing.assert_allclose(state.v, v, **TOL, err_msg=f"v, round {t}")
        assert int(state.inner_iterations) == k, (t, int(state.inner_iterations), k)
        assert float(state.inner_grad_norm) <= 0.05
        steps.append(k)
    assert len(set(steps)) > 1 and min(steps) >= 1, steps  # the adaptive path was exercised
    counts = played[-1].counts  # traced per-round counts: grad_g = K_t + 1
    assert int(counts.grad_g) == sum(steps) + 6
    assert (int(counts.grad_f), int(counts.hvp), int(counts.cross)) == (6, 18, 6)
    if constrained:
        assert np.any(np.abs(want[0][0]) == 0.05)  # the projection was active


def test_aobo_stops_at_the_cap_when_the_test_never_passes():
    problem = _quad()
    solver = bl.solvers.make(
        "aobo", lr_outer=0.2, lr_inner=0.3, tolerance=1e-12, max_inner_steps=2, linear_steps=1
    )
    played = play_rounds(solver, problem, 3)
    want = _aobo_replica(
        problem.reference,
        problem.x0,
        problem.y0,
        3,
        alpha=0.3,
        beta=0.3,
        gamma=0.2,
        delta=1e-12,
        cap=2,
        K_v=1,
    )
    for state, (x, y, _, k) in zip(played, want, strict=True):
        np.testing.assert_allclose(state.x, x, **TOL)
        np.testing.assert_allclose(state.y, y, **TOL)
        assert k == int(state.inner_iterations) == 2 and float(state.inner_grad_norm) > 1e-12
    assert int(played[-1].counts.grad_g) == 3 * 3


def test_fsobo_rounds_match_a_numpy_replica():
    problem = _quad()
    played = play_rounds(
        bl.solvers.make("fsobo", lr_outer=0.2, lr_inner=0.3, lr_linear=0.25), problem, 6
    )
    want = _aobo_replica(
        problem.reference,
        problem.x0,
        problem.y0,
        6,
        alpha=0.3,
        beta=0.25,
        gamma=0.2,
        delta=0.0,
        cap=1,
        K_v=1,
    )
    for t, (state, (x, y, v, _)) in enumerate(zip(played, want, strict=True), start=1):
        np.testing.assert_allclose(state.x, x, **TOL, err_msg=f"x, round {t}")
        np.testing.assert_allclose(state.y, y, **TOL, err_msg=f"y, round {t}")
        np.testing.assert_allclose(state.v, v, **TOL, err_msg=f"v, round {t}")
    c = played[-1].counts
    assert (int(c.grad_g), int(c.grad_f), int(c.hvp), int(c.cross)) == (6, 6, 6, 6)


def test_sogd_storm_is_the_plain_hypergradient_on_the_drifting_quadratic():
    """h = rho x + B^T v is the same function every round there, so the STORM correction
    cancels: SOGD("storm") with beta = alpha is FSOBO, whatever eta."""
    problem = _quad()
    kw = dict(lr_outer=0.2, lr_inner=0.3, lr_linear=0.25)
    sogd = play_rounds(bl.solvers.make("sogd", momentum=0.7, **kw), problem, 5)
    fsobo = play_rounds(bl.solvers.make("fsobo", **kw), problem, 5)
    for a, b in zip(sogd, fsobo, strict=True):
        np.testing.assert_allclose(a.x, b.x, **TOL)


# ---- a stream whose estimator moves with the round and the sample ------------------------------
def _stream(horizon=6, n=8, dx=3, dy=4, seed=0):
    """f_t = 1/2 ||y - b||^2 + rho/2 ||x - a||^2, g_t = h/2 y'Ay - m y'Bx - y'c, with
    (a, b) the outer and (h, m, c) the inner samples of round t (a batch enters by its mean):
    grad_y g = h A y - m B x - c, d2g/dy2 = h A, d2g/dxdy v = -m B^T v, grad_x f = rho (x - a),
    grad_y f = y - b. Every round draws new means, so h_t(x, y, v) changes with t."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((dy, dy)))
    A = (q * np.linspace(1.0, 2.0, dy)) @ q.T
    B = rng.standard_normal((dy, dx)) / np.sqrt(dx)
    rho = 0.5
    outer = {"a": rng.standard_normal((horizon, n, dx)), "b": rng.standard_normal((horizon, n, dy))}
    inner = {
        "h": 1 + 0.3 * rng.random((horizon, n)),
        "m": 1 + 0.5 * rng.standard_normal((horizon, n)),
        "c": rng.standard_normal((horizon, n, dy)),
    }
    Aj, Bj = jnp.asarray(A), jnp.asarray(B)

    def f(t, x, y, batch):
        a, b = jnp.mean(batch["a"], 0), jnp.mean(batch["b"], 0)
        return 0.5 * jnp.sum((y - b) ** 2) + 0.5 * rho * jnp.sum((x - a) ** 2)

    def g(t, x, y, batch):
        h, m, c = (jnp.mean(batch[k], 0) for k in ("h", "m", "c"))
        return 0.5 * h * y @ (Aj @ y) - m * y @ (Bj @ x) - y @ c

    problem = bl.OnlineProblem(
        outer=f,
        inner=g,
        horizon=horizon,
        x0=jnp.zeros(dx),
        y0=jnp.zeros(dy),
        outer_data=outer,
        inner_data=inner,
    )
    return problem, A, B, rho


class _Oracles:
    """The closed-form oracles of ``_stream`` on given (outer, inner) batches."""

    def __init__(self, A, B, rho):
        self.A, self.B, self.rho = A, B, rho

    @staticmethod
    def means(batch):
        return {k: np.mean(np.asarray(v), 0) for k, v in batch.items()}

    def grad_y_g(self, x, y, bi):
        return bi["h"] * self.A @ y - bi["m"] * self.B @ x - bi["c"]

    def hvp(self, v, bi):
        return bi["h"] * self.A @ v

    def h(self, x, v, bo, bi):  # grad_x f - d2g/dxdy v
        return self.rho * (x - bo["a"]) + bi["m"] * self.B.T @ v


def _draws(problem, state, t, *, outer, inner, batch_size):
    mb = round_draws(problem, state, t, batch_size, outer=outer, inner=inner)
    return [_Oracles.means(mb.outer(i)) for i in range(outer)], [
        _Oracles.means(mb.inner(i)) for i in range(inner)
    ]


@pytest.mark.parametrize("direction", ["storm", "heavy_ball"])
@pytest.mark.parametrize("batch_size", [None, 3])
def test_sogd_rounds_match_a_numpy_replica(direction, batch_size):
    """SOGD from its update (sogd.py): y step, one v step at the new y, h_t at (x_t, y_{t+1},
    v_{t+1}); "storm": d_t = h_t + eta (d_{t-1} - h_t(x_{t-1}, y_t, v_t)) on round t's samples
    (inner draw 0 for y, 1 for the Hessian, 2 for both cross terms; outer draw 0 for every f
    gradient); "heavy_ball": d_t = eta d_{t-1} + (1 - eta) h_t; d_1 = h_1 in both."""
    problem, A, B, rho = _stream()
    o = _Oracles(A, B, rho)
    alpha, beta, gamma, eta = 0.3, 0.25, 0.2, 0.6
    solver = bl.solvers.make(
        "sogd",
        lr_outer=gamma,
        lr_inner=alpha,
        lr_linear=beta,
        momentum=eta,
        direction=direction,
        batch_size=batch_size,
    )
    state = solver.init(problem, jax.random.key(3))
    play = jax.jit(solver.round)
    x, y, v = np.zeros(3), np.zeros(4), np.zeros(4)
    d, x_prev = np.zeros(3), x
    for t in range(1, 6):
        (bo,), (bi_y, bi_h, bi_c) = _draws(
            problem, state, t, outer=1, inner=3, batch_size=batch_size
        )
        y_new = y - alpha * o.grad_y_g(x, y, bi_y)
        v_new = v - beta * (o.hvp(v, bi_h) - (y_new - bo["b"]))
        h = o.h(x, v_new, bo, bi_c)
        if t == 1:
            d = h
        elif direction == "storm":
            d = h + eta * (d - o.h(x_prev, v, bo, bi_c))
        else:
            d = eta * d + (1 - eta) * h
        x_prev, x, y, v = x, x - gamma * d, y_new, v_new
        state = play(problem, state)
        np.testing.assert_allclose(state.d, d, **TOL, err_msg=f"d, round {t}")
        np.testing.assert_allclose(state.x, x, **TOL, err_msg=f"x, round {t}")
        np.testing.assert_allclose(state.y, y, **TOL, err_msg=f"y, round {t}")
        np.testing.assert_allclose(state.v, v, **TOL, err_msg=f"v, round {t}")
    storm = direction == "storm"
    c = state.counts
    assert (int(c.grad_g), int(c.grad_f), int(c.hvp), int(c.cross)) == (
        5,
        5 * (1 + storm),
        5,
        5 * (1 + storm),
    )
    per_draw = 8 if batch_size is None else batch_size
    assert (int(c.samples_outer), int(c.samples_inner)) == (5 * per_draw, 5 * 3 * per_draw)


def test_sogd_shares_the_round_samples_with_its_correction():
    """The sample sharing of the correction is checked by the replica above (the break noted
    in the module docstring); this checks that it was visible there: at round 2 the correction
    h_2(x_1, y_2, v_2) on round 2's samples differs from d_1, so it moves d_2."""
    problem, A, B, rho = _stream()
    o = _Oracles(A, B, rho)
    solver = bl.solvers.make("sogd", lr_outer=0.2, lr_inner=0.3, lr_linear=0.1, batch_size=3)
    s1 = jax.jit(solver.round)(problem, solver.init(problem, jax.random.key(1)))
    (bo,), (_, _, bi_c) = _draws(problem, s1, 2, outer=1, inner=3, batch_size=3)
    h_old_round2 = o.h(np.asarray(s1.x_prev), np.asarray(s1.v), bo, bi_c)
    assert np.linalg.norm(h_old_round2 - np.asarray(s1.d)) > 1e-3


@pytest.mark.parametrize("name", ["aobo", "fsobo"])
def test_minibatch_layout_of_aobo_and_fsobo(name):
    """One inner batch for the whole y loop (draw 0), Hessian products on draws 1..K_v, the cross
    term on draw K_v + 1, both partials of f on outer draw 0."""
    problem, A, B, rho = _stream()
    o = _Oracles(A, B, rho)
    K_v = 2 if name == "aobo" else 1
    extra = dict(linear_steps=2, tolerance=0.05) if name == "aobo" else {}
    alpha, beta, gamma = 0.3, 0.25, 0.2
    solver = bl.solvers.make(
        name, lr_outer=gamma, lr_inner=alpha, lr_linear=beta, batch_size=3, **extra
    )
    state = solver.init(problem, jax.random.key(5))
    play = jax.jit(solver.round)
    x, y, v = np.zeros(3), np.zeros(4), np.zeros(4)
    for t in range(1, 5):
        (bo,), bi = _draws(problem, state, t, outer=1, inner=K_v + 2, batch_size=3)
        grad, k = o.grad_y_g(x, y, bi[0]), 0
        while k < (200 if name == "aobo" else 1) and (
            name == "fsobo" or np.linalg.norm(grad) > 0.05
        ):
            y = y - alpha * grad
            grad, k = o.grad_y_g(x, y, bi[0]), k + 1
        for i in range(K_v):
            v = v - beta * (o.hvp(v, bi[1 + i]) - (y - bo["b"]))
        x = x - gamma * o.h(x, v, bo, bi[K_v + 1])
        state = play(problem, state)
        np.testing.assert_allclose(state.x, x, **TOL, err_msg=f"x, round {t}")
        np.testing.assert_allclose(state.y, y, **TOL, err_msg=f"y, round {t}")
        assert int(state.inner_iterations) == k
    assert int(state.counts.samples_inner) == 4 * (K_v + 2) * 3


# ---- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, kw, match",
    [
        # the message names the fix: the paper's value (a mutant that garbled the text survived)
        (
            "aobo",
            {"tolerance": 0.0},
            r"^AOBO\(tolerance=0.0\) must be > 0.* when "
            r"\|\|grad_y g_t\|\| <= tolerance \(Experiment 1 used 0.1\)\.$",
        ),
        ("aobo", {"max_inner_steps": 0}, r"max_inner_steps=0\) must be a positive int"),
        ("aobo", {"linear_steps": 2.5}, r"linear_steps=2.5\) must be a positive int"),
        ("aobo", {"lr_linear": -1.0}, r"lr_linear"),
        ("sogd", {"momentum": 1.0}, r"momentum=1.0\) must be in \[0, 1\)"),
        ("sogd", {"direction": "adam"}, r"direction='adam'\) is unknown; use one of"),
        ("sf2obo", {"inner_schedule": "cubic"}, r"inner_schedule='cubic'\) is unknown"),
        ("sf2obo", {"batch_schedule": "cubic"}, r"batch_schedule='cubic'\) is unknown"),
    ],
)
def test_bad_hyperparameters_name_the_fix(name, kw, match):
    with pytest.raises(ValueError, match=match):
        bl.solvers.make(name, **kw)


def test_registered_as_online_with_the_papers_defaults():
    """The experiments' structural settings are the defaults; the step sizes are "auto" (issue
    #33: 1/L_g for the inner steps, lr_outer tuned by bl.solve_online; the experiments' 0.1 and
    0.001 are passed by the reproductions)."""
    assert {"aobo", "fsobo", "sogd"} <= set(bl.solvers.names("online"))
    aobo, sogd = bl.solvers.make("aobo"), bl.solvers.make("sogd")
    assert (aobo.lr_inner, aobo.lr_outer, aobo.tolerance, aobo.linear_steps) == (
        "auto",
        "auto",
        "auto",  # T^-1/2 / kappa_g from the stream; Experiment 1's 0.1 is the reproduction's
        5,
    )
    assert (sogd.momentum, sogd.lr_linear, sogd.lr_inner, sogd.lr_outer) == (
        0.9,
        None,
        "auto",
        "auto",
    )
    assert type(aobo).adaptive and not getattr(type(sogd), "adaptive", False)

"""``"auto"`` inner steps follow the inner curvature along the run (bilevel.drivers.curvature).

The problem: g(x, w) = 1/2 sum_j (w_j - 1)^2 + exp(x_j) w_j^2 and f = 1/2 ||w - b||^2, so
y*(x)_j = 1 / (1 + exp(x_j)), the inner Hessian is diag(1 + exp(x_j)), so
L_g(x) = 1 + exp(max_j x_j), and the outer optimum is x*_j = log(1/b_j - 1). With b_0 = 0.05,
x*_0 = 2.94: the curvature there is ~10x the one at x0 = 0, so ``lr_inner = 1/L_g(x0)`` (the
"auto" rule at the start) is unstable once x_0 passes ~1.1. A run with the step fixed at that
value diverges (the control); the same run with ``lr_inner="auto"`` rescales the step as x
moves and converges to x*.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bilevel as bl

B = jnp.array([0.05, 0.5, 0.2])
X_STAR = jnp.log(1.0 / B - 1.0)


def _problem():
    def inner(x, w, _):
        return 0.5 * jnp.sum((w - 1.0) ** 2 + jnp.exp(x) * w**2)

    def outer(x, w, _):
        return 0.5 * jnp.sum((w - B) ** 2)

    return bl.BilevelProblem(outer=outer, inner=inner, x0=jnp.zeros(3), y0=jnp.zeros(3))


@pytest.mark.parametrize("name", ["aid-cg", "f2sa"])
def test_auto_inner_step_follows_growing_curvature(name):
    problem = _problem()
    at_start = bl.solvers.make(name, lr_outer=0.3).resolve(problem).lr_inner
    assert at_start == pytest.approx(0.5, rel=1e-3)  # 1/L_g(x0) with L_g(x0) = 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bl.DivergenceWarning)
        fixed = bl.solve(
            problem, bl.solvers.make(name, lr_outer=0.3, lr_inner=at_start), 600, progress=False
        )
    assert not fixed.ok  # the control: the start's step is unstable along this path
    res = bl.solve(problem, bl.solvers.make(name, lr_outer=0.3), 600, progress=False)
    assert res.ok
    assert res.solver.lr_inner < 0.5 * at_start  # rescaled as exp(x_0) grew
    # converging to x* (a bound of the slow coordinate's progress in 600 steps, not of noise:
    # the problem is deterministic)
    assert float(jnp.max(jnp.abs(res.x - X_STAR))) < 0.75
    grad = bl.metrics.hypergradient(problem, res.x)
    g0 = bl.metrics.hypergradient(problem, problem.x0)
    assert float(jnp.linalg.norm(grad)) <= 0.1 * float(jnp.linalg.norm(g0))


def test_given_inner_step_is_left_alone():
    problem = _problem()
    res = bl.solve(problem, bl.solvers.make("aid-cg", lr_outer=0.1, lr_inner=0.05), 200,
                   progress=False)  # fmt: skip
    assert res.solver.lr_inner == 0.05


def test_sweep_points_follow_like_solve():
    """A sweep point's trajectory is the solve's with that point's solver, following included."""
    problem = _problem()
    df = bl.sweep(problem, "aid-cg", grid={"lr_outer": [0.1, 0.3]}, steps=300, eval_every=100,
                  progress=False)  # fmt: skip
    res = bl.solve(problem, bl.solvers.make("aid-cg", lr_outer=0.3), 300, eval_every=100,
                   progress=False)  # fmt: skip
    point = df[df["lr_outer"] == 0.3]
    np.testing.assert_allclose(
        point["outer_loss"].to_numpy(), res.history["outer_loss"].to_numpy(), rtol=1e-9
    )


# ---- truncation counts follow the steps -------------------------------------------------------
def test_count_growth_is_the_fall_of_the_steps_in_powers_of_two():
    from bilevel.drivers.curvature import COUNT_GROWTH, count_growth

    assert COUNT_GROWTH == 8
    for scale, growth in [(1.0, 1), (4.0, 1), (0.51, 1), (0.5, 2), (0.26, 2), (0.25, 4),
                          (0.125, 8), (1e-3, 8), (float("nan"), 1)]:  # fmt: skip
        assert count_growth(scale) == growth, scale
    assert count_growth(np.array([1.0, 0.3, 0.12])) == 8  # a sweep: its smallest scale


@pytest.mark.parametrize(
    "name, field, start", [("itd", "inner_steps", 20), ("stocbio", "neumann_steps", 5),
                           ("stocbio", "inner_steps", 10), ("pzobo", "inner_steps", 20),
                           ("hozog", "inner_steps", 20)]
)  # fmt: skip
def test_auto_truncation_count_grows_as_the_auto_step_falls(name, field, start):
    """N steps of lr leave a truncation bias (1 - lr mu_g)^N: as the "auto" inner step falls
    with the rising L_g (10x along this path), an "auto" count rises by the same factor in
    powers of 2 (at most 8x), so N lr stays within 2x of its start; a given count is kept."""
    problem = _problem()
    resolved = bl.solvers.make(name, lr_outer=0.3).resolve(problem)
    assert getattr(resolved, field) == start
    res = bl.solve(problem, bl.solvers.make(name, lr_outer=0.3), 600, progress=False)
    assert res.ok
    fell = resolved.lr_inner / res.solver.lr_inner
    assert fell > 4.0  # L_g(x) = 1 + exp(max_j x_j) rose from 2 towards 20
    growth = getattr(res.solver, field) / start
    assert growth in (2, 4, 8) and fell / 2 < growth <= fell
    given = bl.solve(problem, bl.solvers.make(name, lr_outer=0.3, **{field: start}), 600,
                     progress=False)  # fmt: skip
    assert getattr(given.solver, field) == start
    assert given.solver.lr_inner < resolved.lr_inner / 4  # while the step still follows


def test_the_grown_count_lowers_the_truncation_bias():
    """At the end point of the run above, ITD's hypergradient at y*(x) with the grown count is
    closer to the exact one than with the start's count: the bias that growing it removes
    (the x-coordinate whose curvature stayed at 2 while the step fell to ~1/16)."""
    from bilevel.solvers.hypergradient.itd import unrolled_hypergradient

    problem = _problem()
    res = bl.solve(problem, bl.solvers.make("itd", lr_outer=0.3), 600, progress=False)
    solver = res.solver
    y_star = bl.metrics.inner_solution(problem, res.x)
    exact = bl.metrics.hypergradient(problem, res.x)
    mb = solver.minibatches(problem, jax.random.PRNGKey(0), outer=1, inner=solver.inner_steps)

    def error(n):
        estimate, _ = unrolled_hypergradient(problem, mb, res.x, y_star, solver.lr_inner, n)
        return float(jnp.linalg.norm(estimate - exact))

    # the exact contraction (1 - lr 2)^N of the flat coordinate: 20 steps leave ~0.3 of its
    # gradient, the grown count ~0.01 or less
    assert error(solver.inner_steps) < 0.1 * error(20)


# ---- online: bl.solve_online -----------------------------------------------------------------
#: the stream's inner curvature per round, s_t: from 1 to 5 over the horizon
T_ONLINE = 100
S = jnp.linspace(1.0, 5.0, T_ONLINE)
C = jnp.array([1.0, -2.0])


def _stream():
    """g_t(x, w) = s_t / 2 ||w - x||^2 (L_g = s_t, grows 5x along the stream), f_t(x, w) =
    1/2 ||w - c||^2, so y*_t(x) = x and x*_t = c in every round. The "auto" inner step resolved
    on round 1 (c / s_1) is unstable for the z / y sequences once s_t has doubled."""

    def inner(t, x, w, b):
        return 0.5 * b["s"][0] * jnp.sum((w - x) ** 2)

    def outer(t, x, w, b):
        return 0.5 * jnp.sum((w - C) ** 2)

    data = {"s": S[:, None]}
    return bl.OnlineProblem(outer=outer, inner=inner, horizon=T_ONLINE, x0=jnp.zeros(2),
                            y0=jnp.zeros(2), outer_data=data, inner_data=data,
                            name="growing-curvature-stream")  # fmt: skip


@pytest.mark.parametrize("name", ["f2obo", "fsobo"])
def test_online_auto_inner_step_follows_the_stream(name):
    """The step is rescaled by L_g(round 1) / L_g(round t) every ADAPT_EVERY rounds: the run
    with ``lr_inner="auto"`` stays finite and ends near x* = c, the control with the round-1
    step fixed diverges, and the step the run ends with is the rule's value at the last
    adaptation, after the last round (the state then stands at round T's curvature)."""
    problem = _stream()
    at_start = bl.solvers.make(name, lr_outer=0.1).with_horizon(T_ONLINE).resolve(problem)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bl.DivergenceWarning)
        fixed = bl.solve_online(problem, bl.solvers.make(name, lr_outer=0.1,
                                lr_inner=at_start.lr_inner), progress=False)  # fmt: skip
    assert fixed.diverged  # the control
    res = bl.solve_online(problem, bl.solvers.make(name, lr_outer=0.1), progress=False)
    assert not res.diverged
    expected = at_start.lr_inner * float(S[0] / S[-1])
    assert res.solver.lr_inner == pytest.approx(expected, rel=1e-4)
    assert float(jnp.linalg.norm(res.x - C)) < 0.1 * float(jnp.linalg.norm(C))


# ---- falling curvature: the steps rise with it (offline) -------------------------------------
#: g(x, w) = 1/2 (EPS (w - 1)^2 + exp(x) w^2): L_g = EPS + exp(x) falls 50x from x0 = 0 to
#: x* = log(EPS), where y*(x*) = B = 1/2 (f = 1/2 (w - B)^2)
EPS = 0.01


def _falling():
    def inner(x, w, _):
        return 0.5 * jnp.sum(EPS * (w - 1.0) ** 2 + jnp.exp(x) * w**2)

    def outer(x, w, _):
        return 0.5 * jnp.sum((w - 0.5) ** 2)

    return bl.BilevelProblem(outer=outer, inner=inner, x0=jnp.zeros(1), y0=jnp.zeros(1))


def test_auto_inner_step_follows_falling_curvature():
    """SOBA's single y and v steps per x step: with the start's ``1/L_g(x0)`` they contract
    y and v by only 1 - mu_g/L_g(x0) = 0.98 per step near x*, the lagging estimates make x
    overshoot, and the run diverges (the control); rescaled as L_g falls (50x at x*: the
    step rises by whole powers of RISE = 4 below that, to 16x the start's), the same run
    converges to x* to rounding (a deterministic problem)."""
    problem = _falling()
    x_star = np.log(EPS)
    at_start = bl.solvers.make("soba", lr_outer=3.0).resolve(problem).lr_inner
    assert at_start == pytest.approx(1.0 / (EPS + 1.0), rel=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", bl.DivergenceWarning)
        fixed = bl.solve(
            problem, bl.solvers.make("soba", lr_outer=3.0, lr_inner=at_start), 600, progress=False
        )
    assert not fixed.ok
    res = bl.solve(problem, bl.solvers.make("soba", lr_outer=3.0), 600, progress=False)
    assert res.ok
    assert res.solver.lr_inner == pytest.approx(16 * at_start)  # 16 <= L_g(x0)/L_g(x*) < 64
    assert float(res.x[0]) == pytest.approx(x_star, abs=1e-8)


def test_with_minibatches_the_curvature_followed_is_the_batches():
    """Sample weights sigmoid(x_i) of which one stays at 1/2 while the others vanish: the full
    data's L_g falls 16x, but a step on a minibatch holding that row meets the curvature of
    that batch, which falls only 4x (16 rows, batches of 4 that cover them)."""
    from types import SimpleNamespace

    from bilevel.drivers.curvature import InnerCurvature

    rng = np.random.default_rng(0)
    A = jnp.asarray(rng.normal(size=(16, 3)))

    def inner(x, w, b):
        weights = jax.nn.sigmoid(x[b["i"]])
        return jnp.mean(weights * 0.5 * (b["A"] @ w - 1.0) ** 2) + 0.005 * jnp.sum(w**2)

    problem = bl.BilevelProblem(
        outer=lambda x, w, b: jnp.sum(w**2),
        inner=inner,
        x0=jnp.zeros(16),
        y0=jnp.zeros(3),
        inner_data={"A": A, "i": jnp.arange(16)},
    )
    solver = bl.solvers.make("soba", batch_size=4, lr_outer=1.0).resolve(problem)
    x_now = jnp.full(16, -40.0).at[0].set(0.0)
    one = SimpleNamespace(x=x_now[None], y=jnp.zeros((1, 3)))
    start = SimpleNamespace(x=jnp.zeros((1, 16)), y=jnp.zeros((1, 3)))
    follow = InnerCurvature(solver, ["lr_inner"], problem, start)
    row0 = float(A[0] @ A[0])
    # the batch holding row 0: 1/4 * 1/2 ||a_0||^2 + 0.01 (the others' weights are e^-40)
    assert follow.largest(problem, solver, one) == pytest.approx(row0 / 8 + 0.01, rel=1e-6)
    full = InnerCurvature(bl.solvers.make("soba", lr_outer=1.0).resolve(problem), ["lr_inner"],
                          problem, start)  # fmt: skip
    assert full.largest(problem, solver, one) == pytest.approx(row0 / 32 + 0.01, rel=1e-6)


def _digits_cleaning(n=60):
    """Hyper-cleaning of n digits (sample weights sigmoid(x_i), softmax regression from zero
    weights, where its Hessian is 1/10 of its largest), on the box [-3, 3]^n."""
    from sklearn.datasets import load_digits

    X, labels = load_digits(return_X_y=True)
    std = X.std(0)
    X = (X - X.mean(0)) / np.where(std > 0, std, 1.0)
    order = np.random.default_rng(0).permutation(len(X))
    train, val = order[:n], order[n : 2 * n]

    def ce(W, b):
        logits = b["X"] @ W
        return jax.nn.logsumexp(logits, 1) - jnp.take_along_axis(logits, b["Y"][:, None], 1)[:, 0]

    def inner(x, W, b):
        return jnp.mean(jax.nn.sigmoid(x[b["i"]]) * ce(W, b)) + 1e-3 * jnp.sum(W**2)

    return bl.BilevelProblem(
        outer=lambda x, W, b: jnp.mean(ce(W, b)),
        inner=inner,
        x0=jnp.zeros(n),
        y0=jnp.zeros((64, 10)),
        inner_data={
            "X": jnp.asarray(X[train]),
            "Y": jnp.asarray(labels[train]),
            "i": jnp.arange(n),
        },  # fmt: skip
        outer_data={"X": jnp.asarray(X[val]), "Y": jnp.asarray(labels[val])},
        x_set=bl.sets.Box(-3.0, 3.0),
    )


def test_a_flat_start_is_looked_past_before_the_first_re_estimate(monkeypatch):
    """From zero softmax weights one plain inner step meets a far larger curvature than the
    start's, so the "auto" steps start at c / L_g there (``InnerCurvature.at_start``). The
    control: SBFW (a 50-term Neumann series at the inner step) with minibatches of 16 diverges
    within its first 25 steps (before any re-estimate) when the steps are sized at (x0, y0),
    and completes with the look-ahead."""
    from bilevel.drivers.curvature import InnerCurvature

    problem = _digits_cleaning()
    solver = bl.solvers.make("sbfw", batch_size=16)
    resolved = solver.resolve(problem)
    state = resolved.init(problem, jax.random.PRNGKey(0))
    state = jax.tree.map(lambda a: a[None], state)  # one seed
    follow = InnerCurvature(resolved, ["lr_inner", "neumann_lr"], problem, state)
    looked = follow.at_start(problem, resolved, state)
    x0, y0 = problem.x0[None], problem.y0[None]
    grad = jax.vmap(jax.grad(problem.inner, argnums=1), in_axes=(0, 0, None))
    ahead = follow._largest_at(x0, y0 - grad(x0, y0, problem.inner_data) / follow.start)
    assert ahead > 2 * follow.start  # the first step's curvature, well above the start's
    for name in ("lr_inner", "neumann_lr"):
        scaled = getattr(looked, name) / getattr(resolved, name)
        assert scaled == pytest.approx(follow.start / ahead, rel=1e-9)

    def run():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", bl.DivergenceWarning)
            return bl.solve(problem, solver, steps=25, eval_every=25, progress=False)

    assert run().ok
    monkeypatch.setattr(InnerCurvature, "at_start", lambda self, problem, solver, state: solver)
    assert not run().ok  # the control: the start's steps diverge before the first re-estimate

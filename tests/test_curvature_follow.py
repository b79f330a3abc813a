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

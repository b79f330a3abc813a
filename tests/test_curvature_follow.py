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

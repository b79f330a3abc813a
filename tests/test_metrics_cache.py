"""The exact metrics compile once per problem structure (issue #33).

``bl.metrics.hypergradient`` and its kin used to be traced and compiled again on every call
(0.5 s a call, 5 s the first, on a 10-variable problem). They now run a program cached by the
problem's structure, with the problem's arrays as its arguments. What must hold: a second call
traces nothing, its values are the closed form's, a problem of the same structure with other
data gets its own answer from the same program, and under jit / vmap / grad the metrics are
traced into the caller's program as before (a cached program must not keep their tracers).

Traces are counted by a wrapper around ``inner`` that counts its Python calls: after the
problem is built, ``inner`` runs only while a program that calls it is traced.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bilevel as bl
from bilevel.analysis import metrics

DX, DY, N = 3, 4, 6
RHO = 0.1
RADIUS = 0.5  # the ball of the constrained problem; the points below lie on both sides of it
RTOL = 1e-12  # a dense solve of a well-conditioned 4 x 4 system: float64 rounding only


def _data(seed):
    rng = np.random.default_rng(seed)
    inner = {"c": rng.standard_normal((N, DY)), "s": rng.uniform(0.5, 1.5, N)}
    return inner, {"t": rng.standard_normal((N, DY))}


MATRIX = np.random.default_rng(7).standard_normal((DY, DX))


def _problem(calls, seed=0):
    """g = (1 + mean s)/2 ||y||^2 - <y, M x + mean c>, f = ||y - mean t||^2 / 2 + RHO/2 ||x||^2:
    y*(x) = (M x + mean c) / (1 + mean s), and ``calls`` grows by one per call of g."""

    def inner(x, y, batch):
        calls.append(None)
        scale = 1.0 + jnp.mean(batch["s"])
        return 0.5 * scale * jnp.sum(y**2) - y @ (MATRIX @ x + jnp.mean(batch["c"], axis=0))

    def outer(x, y, batch):
        return 0.5 * jnp.sum((y - jnp.mean(batch["t"], axis=0)) ** 2) + 0.5 * RHO * jnp.sum(x**2)

    inner_data, outer_data = _data(seed)
    return bl.BilevelProblem(
        outer=outer,
        inner=inner,
        x0=np.zeros(DX),
        y0=np.zeros(DY),
        outer_data=outer_data,
        inner_data=inner_data,
    )


def _closed_form(problem, x):
    """``(y*(x), grad F(x))`` of :func:`_problem`."""
    scale = 1.0 + np.mean(problem.inner_data["s"])
    y_star = (MATRIX @ x + np.mean(problem.inner_data["c"], axis=0)) / scale
    target = np.mean(problem.outer_data["t"], axis=0)
    return y_star, MATRIX.T @ (y_star - target) / scale + RHO * x


POINTS = [np.array([0.3, -0.2, 0.1]), np.array([1.0, 2.0, -1.5])]


def test_hypergradient_compiles_once_and_matches_the_closed_form():
    calls = []
    problem = _problem(calls)
    built = len(calls)
    grads = []
    for i, x in enumerate(POINTS):
        grads.append(metrics.hypergradient(problem, x))
        if i == 0:
            traced = len(calls)
            assert traced > built  # the first call traced g ...
    assert len(calls) == traced  # ... the second, at another x, did not
    # the dense formula itself, never cached (one jit for both points: op by op is slow)
    plain = jax.jit(
        lambda x: metrics.dense_hypergradient(
            problem.outer, problem.inner, x, problem.y0, problem.outer_data, problem.inner_data
        )
    )
    for x, grad in zip(POINTS, grads, strict=True):
        np.testing.assert_allclose(grad, _closed_form(problem, x)[1], rtol=RTOL)
        np.testing.assert_allclose(grad, plain(x), rtol=RTOL)
    # inner_solution: cached the same way
    y_star = metrics.inner_solution(problem, POINTS[0])
    traced = len(calls)
    np.testing.assert_allclose(
        metrics.inner_solution(problem, POINTS[1]), _closed_form(problem, POINTS[1])[0], rtol=RTOL
    )
    np.testing.assert_allclose(y_star, _closed_form(problem, POINTS[0])[0], rtol=RTOL)
    assert len(calls) == traced


def test_same_structure_other_data_reuses_the_program_with_its_own_data():
    calls = []
    first = _problem(calls, seed=0)
    inner_data, outer_data = _data(seed=1)
    second = first.replace(inner_data=inner_data, outer_data=outer_data)
    x = POINTS[0]
    metrics.hypergradient(first, x)
    traced = len(calls)
    grad = metrics.hypergradient(second, x)
    assert len(calls) == traced  # the data are the program's arguments, not its constants
    np.testing.assert_allclose(grad, _closed_form(second, x)[1], rtol=RTOL)
    assert not np.allclose(grad, _closed_form(first, x)[1])


def test_other_settings_compile_their_own_program():
    calls = []
    problem = _problem(calls)
    metrics.hypergradient(problem, POINTS[0], newton_steps=1)
    traced = len(calls)
    # one Newton step solves a quadratic g exactly: both settings give the closed form
    for steps in (1, 2):
        grad = metrics.hypergradient(problem, POINTS[1], newton_steps=steps)
        np.testing.assert_allclose(grad, _closed_form(problem, POINTS[1])[1], rtol=RTOL)
    assert len(calls) > traced  # newton_steps=2 is another program ...
    traced = len(calls)
    metrics.clear_cache()
    metrics.hypergradient(problem, POINTS[0], newton_steps=1)
    assert len(calls) > traced  # ... and clear_cache drops them


def test_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(metrics, "MAX_COMPILED", 2)
    metrics.clear_cache()
    problems = [_problem([]) for _ in range(3)]  # three problems: three sets of functions
    for problem in problems:
        metrics.hypergradient(problem, POINTS[0])
    assert len(metrics._COMPILED) == 2


def test_fw_gap_and_grad_mapping_are_cached():
    calls = []
    problem = _problem(calls).replace(x_set=bl.sets.L2Ball(RADIUS))
    traced = None
    for x in POINTS:
        gap, mapping = metrics.fw_gap(problem, x), metrics.grad_mapping(problem, x, step=0.5)
        if traced is None:
            traced = len(calls)
        assert len(calls) == traced
        grad = _closed_form(problem, x)[1]
        # the ball's LMO is -RADIUS grad / ||grad||, so G(x) = <grad, x> + RADIUS ||grad||
        np.testing.assert_allclose(gap, grad @ x + RADIUS * np.linalg.norm(grad), rtol=RTOL)
        moved = x - 0.5 * grad
        projected = moved * min(1.0, RADIUS / np.linalg.norm(moved))
        np.testing.assert_allclose(mapping, np.linalg.norm(x - projected) / 0.5, rtol=RTOL)
    # default_metrics, which computes both from one hypergradient, is cached too
    out = metrics.default_metrics(problem, POINTS[0], problem.y0)
    traced = len(calls)
    again = metrics.default_metrics(problem, POINTS[1], problem.y0)
    assert len(calls) == traced
    assert {"outer_loss", "inner_grad_norm", "grad_mapping", "fw_gap"} <= set(out)
    np.testing.assert_allclose(again["fw_gap"], metrics.fw_gap(problem, POINTS[1]), rtol=RTOL)


def test_under_jit_vmap_and_grad():
    """Traced calls run into the caller's program: inside jit (problem closed over or as an
    argument), vmap, and grad, also when the problem's functions close over a tracer (a
    cached program must not keep it). One jit around all of them: one compilation."""
    problem = _problem([])
    constrained = problem.replace(x_set=bl.sets.L2Ball(RADIUS))
    x = POINTS[1]

    def weighted(lam):  # f closing over a traced weight
        with_lam = bl.BilevelProblem(
            outer=lambda x, y, b: lam * problem.outer(x, y, b),
            inner=problem.inner,
            x0=problem.x0,
            y0=problem.y0,
            outer_data=problem.outer_data,
            inner_data=problem.inner_data,
        )
        return jnp.sum(metrics.hypergradient(with_lam, x))

    @jax.jit
    def traced(constrained, x, xs):
        return (
            metrics.hypergradient(problem, x),
            metrics.fw_gap(constrained, x),
            jax.vmap(lambda x: metrics.hypergradient(problem, x))(xs),
            jax.grad(lambda x: jnp.sum(metrics.hypergradient(problem, x)))(x),
            jax.grad(weighted)(2.0),
            jax.vmap(weighted)(jnp.array([1.0, 3.0])),
        )

    grad, gap, batched, total, d_lam, per_lam = traced(constrained, x, np.stack(POINTS))
    assert not metrics._COMPILED  # the traced calls cached nothing
    expected = _closed_form(problem, x)[1]
    np.testing.assert_allclose(grad, expected, rtol=RTOL)
    np.testing.assert_allclose(gap, metrics.fw_gap(constrained, x), rtol=RTOL)
    for row, x_i in zip(batched, POINTS, strict=True):
        np.testing.assert_allclose(row, _closed_form(problem, x_i)[1], rtol=RTOL)
    # grad F is affine in x: the gradient of its sum is the Hessian's column sums
    scale = 1.0 + np.mean(problem.inner_data["s"])
    hessian = MATRIX.T @ MATRIX / scale**2 + RHO * np.eye(DX)
    np.testing.assert_allclose(total, hessian.sum(axis=0), rtol=1e-10)
    # f is linear in the weight, and so is grad F (y* does not depend on f)
    np.testing.assert_allclose(d_lam, np.sum(expected), rtol=RTOL)
    np.testing.assert_allclose(per_lam, np.array([1.0, 3.0]) * np.sum(expected), rtol=RTOL)


def test_stochastic_quadratic_matches_its_closed_form():
    """Its cross derivative is a float64 mean over 2000 rows, which jaxlib 0.10.2's XLA:CPU
    fusions get 0.02 wrong (jax-ml/jax#39103); the cached programs compile without them."""
    problem = bl.problems.quadratic(stochastic=True)
    for shift in (0.3, -0.7):
        x = problem.x0 + shift
        np.testing.assert_allclose(
            metrics.hypergradient(problem, x), problem.reference.grad_F(x), rtol=1e-10
        )


def test_a_model_as_x():
    """The parameters of an equinox model go through the cache; its functions stay outside."""
    mlp = eqx.nn.MLP(2, 2, 3, 1, key=jax.random.key(0))
    mlp = jax.tree.map(lambda a: jnp.asarray(a, float) if eqx.is_inexact_array(a) else a, mlp)
    rng = np.random.default_rng(3)
    data = {"a": rng.standard_normal((N, 2)), "t": rng.standard_normal(N)}

    def loss(x, y, batch):
        return 0.5 * jnp.mean((jax.vmap(x)(batch["a"]) @ y - batch["t"]) ** 2)

    calls = []

    def inner(x, y, batch):
        calls.append(None)
        return loss(x, y, batch) + 0.5 * jnp.sum(y**2)

    problem = bl.BilevelProblem(
        outer=loss, inner=inner, x0=mlp, y0=np.zeros(2), outer_data=data, inner_data=data
    )
    grad = metrics.hypergradient(problem, mlp)
    traced = len(calls)
    shifted = jax.tree.map(lambda a: a + 0.1 if eqx.is_inexact_array(a) else a, mlp)
    metrics.hypergradient(problem, shifted)
    assert len(calls) == traced
    assert grad.activation is None and isinstance(grad.layers[0].weight, jax.Array)
    params = problem.parameters(mlp, problem.y0)[0]
    plain = jax.jit(metrics.dense_hypergradient, static_argnums=(0, 1))(
        problem.outer, problem.inner, params, problem.y0, data, data
    )
    for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(plain), strict=True):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=1e-15)


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Each test starts from an empty cache, so its trace counts do not depend on the order."""
    metrics.clear_cache()
    yield
    metrics.clear_cache()

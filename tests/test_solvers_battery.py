"""One battery over every registered solver: each later solver gets these checks for free.

Convergence on the closed-form quadratic, no recompilation on a second solve, seeds as one
vmapped program equal to separate runs, pytree (nested dict) variables, exact call accounting,
and a clear stop when a run diverges. Frank-Wolfe methods get the same problems inside a ball
that contains x* (``solver_settings.problem_for``).
"""

import logging

import jax
import numpy as np
import pytest
from solver_settings import diverging, drop, frank_wolfe, problem_for, settings

import bilevel as bl

NAMES = bl.solvers.names()


@pytest.fixture(scope="module")
def quad():
    return bl.problems.quadratic()


@pytest.fixture(scope="module")
def quad_tree():
    return bl.problems.quadratic(pytree=True)


@pytest.fixture(scope="module")
def quad_sto():
    return bl.problems.quadratic(stochastic=True, n_samples=500)


def _final(res, col="grad_norm"):
    h = res.history
    return h[h.step == h.step.max()][col].to_numpy()


@pytest.mark.parametrize("name", NAMES)
def test_converges_on_quadratic(name, quad):
    quad = problem_for(name, quad)
    res = bl.solve(
        quad, bl.solvers.make(name, **settings(name)), steps=200, eval_every=50, progress=False
    )
    g0 = res.history.grad_norm.iloc[0]
    assert _final(res)[0] <= g0 / drop(name), res.history[["step", "grad_norm"]]


@pytest.mark.parametrize("name", NAMES)
def test_no_recompilation_on_second_solve(name, quad, caplog):
    quad = problem_for(name, quad)
    solver = bl.solvers.make(name, **settings(name))
    with jax.log_compiles(True), caplog.at_level(logging.WARNING):
        bl.solve(quad, solver, steps=20, eval_every=10, progress=False)
        first = [r for r in caplog.records if "Compiling" in r.getMessage()]
        caplog.clear()
        bl.solve(
            quad, bl.solvers.make(name, **settings(name)), steps=20, eval_every=10, progress=False
        )
        second = [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]
    assert first or name in _ALREADY_COMPILED, "the log capture saw no compilation at all"
    assert not second, second


_ALREADY_COMPILED = set()  # a previous test may have compiled this exact program already


@pytest.mark.parametrize(
    "name, fields",
    [
        ("stocbio", {"outer_optimizer": "adam-b1"}),
        ("pzobo", {"outer_optimizer": "adam-b1", "inner_optimizer": "trace"}),
    ],
)
def test_a_transformation_valued_field_does_not_recompile(name, fields, quad, caplog):
    """An optax transformation in a field is static (part of the compiled program): a second
    solve with the same transformation object, in a new solver, reuses the compilation."""
    import optax

    made = {"adam-b1": optax.scale_by_adam(b1=0.5), "trace": optax.trace(decay=0.5)}
    options = settings(name) | {field: made[value] for field, value in fields.items()}
    first = bl.solve(
        quad, bl.solvers.make(name, **options), steps=20, eval_every=10, progress=False
    )
    with jax.log_compiles(True), caplog.at_level(logging.WARNING):
        again = bl.solve(
            quad, bl.solvers.make(name, **options), steps=20, eval_every=10, progress=False
        )
        compiles = [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]
    assert not compiles, compiles
    np.testing.assert_array_equal(jax.tree.leaves(first.x)[0], jax.tree.leaves(again.x)[0])


@pytest.mark.parametrize("name", NAMES)
def test_other_step_sizes_reuse_the_compilation(name, quad, caplog):
    """Numeric step sizes are arguments of the compiled program (a grid compiles once), and the
    values passed in are the ones used: halving them changes the trajectory."""
    quad = problem_for(name, quad)
    base = settings(name)
    halved = {
        k: v / 2
        for k, v in base.items()
        if k in ("lr_outer", "lr_inner") and isinstance(v, int | float)
    }
    # every setting must leave something to vary: a schedule-only one would test nothing here
    assert halved, f"the battery setting of {name} has no numeric step size to halve"
    first = bl.solve(quad, bl.solvers.make(name, **base), steps=20, eval_every=10, progress=False)
    with jax.log_compiles(True), caplog.at_level(logging.WARNING):
        second = bl.solve(
            quad, bl.solvers.make(name, **base | halved), steps=20, eval_every=10, progress=False
        )
        compiles = [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]
    assert not compiles, compiles
    assert not np.allclose(jax.tree.leaves(first.x)[0], jax.tree.leaves(second.x)[0])


@pytest.mark.parametrize("name", NAMES)
def test_seeds_vmap_equals_separate_runs(name, quad_sto):
    quad_sto = problem_for(name, quad_sto)
    solver = bl.solvers.make(name, **settings(name) | {"batch_size": 16})
    many = bl.solve(quad_sto, solver, steps=30, seeds=[3, 5], eval_every=10, progress=False)
    x_many = jax.tree.leaves(many.x)[0]
    assert x_many.shape[0] == 2
    for i, s in enumerate([3, 5]):
        one = bl.solve(quad_sto, solver, steps=30, seed=s, eval_every=10, progress=False)
        # float64 vmapped vs unbatched kernels may sum in another order: 1e-9 relative
        np.testing.assert_allclose(x_many[i], jax.tree.leaves(one.x)[0], rtol=1e-9, atol=1e-12)
    assert not np.allclose(x_many[0], x_many[1])  # different seeds, different minibatches
    assert sorted(many.history.seed.unique()) == [3, 5]


@pytest.mark.parametrize("name", NAMES)
def test_pytree_variables(name, quad, quad_tree):
    quad, quad_tree = problem_for(name, quad), problem_for(name, quad_tree)
    solver = bl.solvers.make(name, **settings(name))
    flat = bl.solve(quad, solver, steps=50, eval_every=25, progress=False)
    tree = bl.solve(quad_tree, solver, steps=50, eval_every=25, progress=False)
    assert isinstance(tree.x, dict) and isinstance(tree.y, dict)
    assert set(tree.x) == {"a", "b"} and set(tree.x["b"]) == {"c"}
    np.testing.assert_allclose(_final(tree), _final(flat), rtol=1e-8)


@pytest.mark.parametrize("name", NAMES)
def test_counts_are_per_step_constant(name, quad_sto):
    quad_sto = problem_for(name, quad_sto)
    solver = bl.solvers.make(name, **settings(name) | {"batch_size": 8})
    res = bl.solve(quad_sto, solver, steps=20, eval_every=5, progress=False)
    h = res.history.set_index("step")
    for col in ("oracle_calls", "samples_inner", "samples_outer"):
        assert h.loc[20, col] == 4 * h.loc[5, col], col
    assert h.loc[5, "oracle_calls"] > 0 and h.loc[5, "samples"] > 0
    assert h.loc[5, "samples"] % 8 == 0  # whole minibatches of size 8


@pytest.mark.parametrize("name", NAMES)
def test_divergence_is_reported_and_history_kept(name, quad):
    quad = problem_for(name, quad)
    solver = bl.solvers.make(name, **settings(name) | diverging(name))
    with pytest.warns(bl.DivergenceWarning, match=rf"{name} diverged.*step sizes"):
        res = bl.solve(quad, solver, steps=400, eval_every=5, progress=False)
    assert res.diverged == [0] and not res.ok
    assert len(res.history) >= 1 and np.isfinite(res.history.grad_norm).all()
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(res.x))
    with pytest.raises(bl.DivergenceError) as err:
        bl.solve(quad, solver, steps=400, eval_every=5, progress=False, on_divergence="raise")
    assert err.value.result.diverged == [0]


@pytest.mark.parametrize("name", NAMES)
def test_records_the_norm_of_its_hypergradient_estimate(name, quad):
    """``hypergrad_estimate_norm`` is the norm of the direction of the last outer step: with
    plain steps on an unconstrained problem, x_1 = x_0 - lr_0 * direction, so it must equal
    ||x_1 - x_0|| / lr_0 (and be 0 at step 0, before any direction exists).

    A Frank-Wolfe method moves x_1 = x_0 + gamma (s_0 - x_0) instead, with s_0 = -R F/||F|| the
    LMO of the ball around x_0 = 0: ||x_1 - x_0|| = gamma R carries no norm, but its recorded FW
    gap <F, x_0 - s_0> = R ||F|| must be R times the recorded norm."""
    from jax.flatten_util import ravel_pytree

    from bilevel.core.schedules import as_schedule

    quad = problem_for(name, quad)
    solver = bl.solvers.make(name, **dict(settings(name), outer_optimizer="sgd"))
    res = bl.solve(quad, solver, steps=1, eval_every=1, progress=False)
    norms = res.history.hypergrad_estimate_norm.to_numpy()
    moved = np.linalg.norm(ravel_pytree(res.x)[0] - ravel_pytree(quad.x0)[0])
    lr0 = float(as_schedule(solver.lr_outer)(0))
    assert norms[0] == 0.0 and moved > 0
    if frank_wolfe(name):
        radius = quad.x_set.radius
        np.testing.assert_allclose(moved, lr0 * radius, rtol=1e-10)
        gaps = res.history.fw_gap_estimate.to_numpy()
        np.testing.assert_allclose(gaps[-1], radius * norms[-1], rtol=1e-10)
    else:
        np.testing.assert_allclose(norms[-1], moved / lr0, rtol=1e-10)

"""``bl.iterate``: the pure loop ``bl.solve`` compiles, under ``jax.grad``, ``jax.vmap`` and
``jax.jit``, and the same states as ``bl.solve``."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bilevel as bl

STEPS = 20


@pytest.fixture
def float64():
    """float64 for this test only (the finite difference needs it), restored afterwards."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", previous)


def _setup(name: str, **hyperparameters):
    problem = bl.problems.quadratic(dx=3, dy=5, cond=4.0)  # closed form, deterministic
    solver = bl.solvers.make(name, **hyperparameters).resolve(problem)
    return problem, solver, solver.init(problem, jax.random.PRNGKey(0))


@pytest.mark.parametrize(
    "name, settings",
    [("f2sa", dict(lr_outer=0.05, lr_inner=0.1)), ("stocbio", dict(lr_outer=0.05, lr_inner=0.1))],
)
def test_grad_of_the_outer_loss_by_lr_outer_matches_a_finite_difference(float64, name, settings):
    """d f(x_K, y_K) / d lr_outer through K = 20 unrolled steps (reverse-mode iterative
    differentiation), against a central difference with h = 1e-5: its truncation error is
    O(h^2) ~ 1e-10 and its rounding ~ 1e-16 / h ~ 1e-11 relative, so rtol 1e-6 is loose
    while any dropped term of the chain rule would be O(1) off."""
    problem, solver, state = _setup(name, **settings)

    @jax.jit
    def outer_loss(lr_outer):
        final = bl.iterate(dataclasses.replace(solver, lr_outer=lr_outer), problem, state, STEPS)
        x, y = solver.output(final)
        return problem.outer(x, y, problem.outer_data)

    lr, h = settings["lr_outer"], 1e-5
    grad = jax.grad(outer_loss)(jnp.asarray(lr))
    difference = (outer_loss(jnp.asarray(lr + h)) - outer_loss(jnp.asarray(lr - h))) / (2 * h)
    assert abs(float(grad)) > 1e-3  # the loss does depend on the step size
    np.testing.assert_allclose(float(grad), float(difference), rtol=1e-6)


def test_vmap_over_stacked_solvers_gives_the_separate_runs():
    """Three F2SA solvers differing in lr_outer, stacked into one pytree: the vmapped loop
    ends in the states of three separate calls (to float rounding of the batched products)."""
    problem, solver, state = _setup("f2sa", lr_outer=0.05, lr_inner=0.1)
    solvers = [dataclasses.replace(solver, lr_outer=lr) for lr in (0.01, 0.05, 0.1)]
    stacked = jax.tree.map(lambda *v: jnp.stack([jnp.asarray(a) for a in v]), *solvers)
    batched = jax.jit(jax.vmap(lambda s: bl.iterate(s, problem, state, STEPS)))(stacked)
    loop = jax.jit(bl.iterate, static_argnums=3)
    for i, one in enumerate(solvers):
        alone = loop(one, problem, state, STEPS)
        for got, want in zip(jax.tree.leaves(batched), jax.tree.leaves(alone), strict=True):
            np.testing.assert_allclose(np.asarray(got)[i], np.asarray(want), rtol=1e-12, atol=1e-14)
    x = np.asarray(batched.x)
    assert not np.allclose(x[0], x[2])  # the step sizes did differ


@pytest.mark.parametrize("seed", [0, 3])
def test_iterate_is_the_loop_solve_compiles(seed):
    """``bl.solve(...).state`` is ``iterate`` from ``solver.init(problem, PRNGKey(seed))``, bit
    for bit (no CPU rewrites: they may change the summation order), also over several chunks."""
    problem = bl.problems.quadratic(dx=3, dy=5, stochastic=True, n_samples=64)
    solver = bl.solvers.make("f2sa", lr_outer=0.05, lr_inner=0.1, batch_size=8)
    state = solver.init(problem, jax.random.PRNGKey(seed))
    want = jax.jit(bl.iterate, static_argnums=3)(solver, problem, state, STEPS)
    for every in (None, 7):
        res = bl.solve(
            problem,
            solver,
            STEPS,
            seed=seed,
            eval_every=every,
            progress=False,
            cpu_rewrites=False,
        )
        for got, expected in zip(jax.tree.leaves(res.state), jax.tree.leaves(want), strict=True):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))

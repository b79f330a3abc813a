"""bl.diagnose: Lanczos estimates of mu_g and L_g, the not-strongly-convex warning, "auto"."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bilevel as bl


def test_exact_on_the_quadratic():
    p = bl.problems.quadratic(dx=10, dy=50, cond=10.0)
    d = bl.diagnose(p)
    # full reorthogonalised Lanczos on a 50-dim space: the extreme eigenvalues to rounding
    assert d.mu_g == pytest.approx(1.0, rel=1e-8) and d.L_g == pytest.approx(10.0, rel=1e-8)
    assert d.condition_number == pytest.approx(10.0, rel=1e-7) and d.strongly_convex


def test_stochastic_problem_averages_minibatches():
    p = bl.problems.quadratic(dx=3, dy=20, cond=5.0, stochastic=True, n_samples=300)
    full = bl.diagnose(p)  # n <= batch_size: the full-data Hessian, equal to A
    assert full.mu_g == pytest.approx(1.0, rel=1e-8) and full.L_g == pytest.approx(5.0, rel=1e-8)
    sub = bl.diagnose(p, batch_size=100, num_batches=20)
    # 2000 of 300 samples drawn with replacement: a noisy average, within 20% here
    assert sub.L_g == pytest.approx(5.0, rel=0.2) and sub.mu_g > 0.5


def test_warns_when_not_strongly_convex():
    def g(x, y, batch):  # flat along y[2]: Hessian diag(1, 2, 0)
        return 0.5 * y[0] ** 2 + y[1] ** 2 + 0.0 * y[2] - x @ y

    p = bl.BilevelProblem(
        outer=lambda x, y, b: jnp.sum(y**2), inner=g, x0=jnp.ones(3), y0=jnp.zeros(3)
    )
    with pytest.warns(bl.NotStronglyConvexWarning, match="not strongly convex.*ridge"):
        d = bl.diagnose(p)
    assert abs(d.mu_g) < 1e-8 and d.L_g == pytest.approx(2.0)


def test_auto_inner_step_is_one_over_L():
    p = bl.problems.quadratic(dx=4, dy=8, cond=4.0)
    res = bl.solve(p, bl.solvers.make("stocbio", lr_outer=0.05), steps=5, progress=False)
    assert res.solver.lr_inner == pytest.approx(0.25, rel=1e-8)
    assert bl.solvers.make("f2sa").lr_inner == "auto"
    with pytest.raises(ValueError, match="lr_inner"):
        bl.solvers.make("f2sa", lr_inner="fast")


def test_nonquadratic_matches_dense_hessian():
    rng = np.random.default_rng(0)
    Z = jnp.asarray(rng.standard_normal((30, 6)))

    def g(x, y, batch):
        return jnp.mean(jnp.logaddexp(0.0, Z @ y)) + 0.05 * jnp.sum(y**2) + x @ y

    p = bl.BilevelProblem(
        outer=lambda x, y, b: jnp.sum(y**2),
        inner=g,
        x0=jnp.zeros(6),
        y0=jnp.asarray(rng.standard_normal(6)),
    )
    d = bl.diagnose(p)
    eig = np.linalg.eigvalsh(np.asarray(bl.oracles.hessian_yy(g, p.x0, p.y0, None)))
    assert d.mu_g == pytest.approx(eig[0], rel=1e-8) and d.L_g == pytest.approx(eig[-1], rel=1e-8)


# ---- minibatch curvature: the "auto" steps of runs that draw minibatches ---------------------
def _least_squares(n=120, d=20, ridge=0.1, seed=0):
    """g(y; rows) = mean_i (a_i^T y - b_i)^2 / 2 + ridge/2 ||y||^2: a batch B's Hessian is
    A_B^T A_B / |B| + ridge I, in closed form."""
    rng = np.random.default_rng(seed)
    A, b = rng.normal(size=(n, d)), rng.normal(size=n)

    def inner(x, y, batch):
        r = batch["A"] @ y - batch["b"]
        return 0.5 * jnp.mean(r**2) + 0.5 * ridge * jnp.sum(y**2) + x @ y[:2]

    problem = bl.BilevelProblem(
        outer=lambda x, y, batch: jnp.sum(y**2),
        inner=inner,
        x0=jnp.zeros(2),
        y0=jnp.zeros(d),
        outer_data={"A": jnp.asarray(A), "b": jnp.asarray(b)},
        inner_data={"A": jnp.asarray(A), "b": jnp.asarray(b)},
    )
    return problem, A, ridge


def test_batch_smoothness_sees_a_single_outlier_row():
    """One row of 300 with 30x the norm of the others decides the curvature of every batch
    that holds it (a standardised pixel that is nonzero in one image: 3.36 against 1.51 on
    the digits); random batches can miss it, the covering ones cannot, whatever the seed."""
    from bilevel.analysis.diagnose import batch_smoothness

    rng = np.random.default_rng(3)
    A = rng.normal(size=(300, 20))
    A[123] *= 30.0
    b = rng.normal(size=300)
    ridge = 1e-3
    problem = bl.BilevelProblem(
        outer=lambda x, y, d: 0.5 * jnp.sum((y - x) ** 2),
        inner=lambda x, y, d: (
            0.5 * jnp.mean((d["A"] @ y - d["b"]) ** 2) + 0.5 * ridge * jnp.sum(y**2)
        ),
        x0=jnp.zeros(20),
        y0=jnp.zeros(20),
        inner_data={"A": jnp.asarray(A), "b": jnp.asarray(b)},
    )
    outlier_alone = np.dot(A[123], A[123]) / 32  # the outlier's share of a batch of 32
    for seed in range(4):
        assert batch_smoothness(problem, 32, seed=seed) > outlier_alone


def test_batch_smoothness_is_the_largest_curvature_of_drawn_and_covering_batches():
    """8 batches drawn as the solvers draw theirs (sampling.minibatches, iid rows) and batches
    cutting a permutation of the rows (the last topped up from the first), each Hessian exact
    by Lanczos on dim y = 20 <= 30 steps; with 8 rows of 20 features a batch's curvature is
    several times the full data's, and inner_smoothness takes the larger."""
    from bilevel.analysis.diagnose import (
        BATCH_DRAWS,
        batch_smoothness,
        covering_batches,
        inner_smoothness,
    )
    from bilevel.core import sampling

    problem, A, ridge = _least_squares()
    key = jax.random.PRNGKey(0)
    cover = np.asarray(covering_batches(problem.inner_data, 8, key)["A"])
    assert cover.shape == (-(-len(A) // 8), 8, 20)
    assert {tuple(r) for r in cover.reshape(-1, 20)} == {tuple(r) for r in np.asarray(A)}
    mb = sampling.minibatches(key, None, problem.inner_data, 8, outer=0, inner=BATCH_DRAWS)
    drawn = [np.asarray(mb.inner(i)["A"]) for i in range(BATCH_DRAWS)]
    tops = []
    for rows in [*drawn, *cover]:
        tops.append(np.linalg.eigvalsh(rows.T @ rows / 8 + ridge * np.eye(20))[-1])
    full = np.linalg.eigvalsh(A.T @ A / len(A) + ridge * np.eye(20))[-1]
    assert batch_smoothness(problem, 8) == pytest.approx(max(tops), rel=1e-8)
    assert max(tops) > 2 * full
    assert inner_smoothness(problem) == pytest.approx(full, rel=1e-8)
    assert inner_smoothness(problem, 8) == pytest.approx(max(tops), rel=1e-8)
    dataless = bl.problems.quadratic(dx=3, dy=4)  # no minibatches to draw: the full L_g
    assert inner_smoothness(dataless, 8) == bl.diagnose(dataless).L_g


def test_auto_steps_of_a_minibatch_run_use_the_batches_curvature():
    """lr_inner='auto' = factor / L_g with L_g the batches' for a run that draws minibatches,
    the full data's otherwise; IBCG's 2/(mu_g + L_g) also halves (its recursions see a new
    Hessian every step)."""
    from bilevel.analysis.diagnose import inner_smoothness

    problem, _, _ = _least_squares()
    L_full, L_batch = inner_smoothness(problem), inner_smoothness(problem, 8)
    for name in ("aid-cg", "soba"):
        factor = bl.solvers.get(name).auto_inner_factor
        full = bl.solvers.make(name).resolve(problem)
        mini = bl.solvers.make(name, batch_size=8).resolve(problem)
        assert full.lr_inner == pytest.approx(factor / L_full, rel=1e-12)
        assert mini.lr_inner == pytest.approx(factor / L_batch, rel=1e-12)
    mu = bl.diagnose(problem).mu_g
    box = problem.replace(x_set=bl.sets.Box(-1.0, 1.0))
    full = bl.solvers.make("ibcg", horizon=100).resolve(box)
    mini = bl.solvers.make("ibcg", horizon=100, batch_size=8).resolve(box)
    assert full.lr_inner == pytest.approx(2 / (mu + L_full), rel=1e-12)
    assert mini.lr_inner == pytest.approx(1 / (mu + L_batch), rel=1e-12)
    assert mini.lr_adjoint == pytest.approx(0.99 / (mu + L_batch), rel=1e-12)

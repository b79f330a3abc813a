"""The minibatch sampler: uniform, independent across draws/keys, unbiased, right counts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bilevel.core import sampling


def test_uniform_indices_chi_square():
    n, draws = 13, 200_000
    idx = np.asarray(sampling.uniform_indices(jax.random.PRNGKey(0), (draws,), n))
    assert idx.min() == 0 and idx.max() == n - 1
    counts = np.bincount(idx, minlength=n)
    chi2 = np.sum((counts - draws / n) ** 2 / (draws / n))
    # chi-square with 12 dof: P(chi2 > 32.9) = 0.001; a fixed key makes this deterministic.
    assert chi2 < 32.9


def test_draws_keys_and_neighbours_are_independent():
    n = 1000
    a = np.asarray(sampling.uniform_indices(jax.random.PRNGKey(1), (50_000,), n)) / n
    b = np.asarray(sampling.uniform_indices(jax.random.PRNGKey(2), (50_000,), n)) / n
    # correlation of independent uniforms has sd 1/sqrt(N) = 0.0045; 5 sd bound
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.023
    assert abs(np.corrcoef(a[:-1], a[1:])[0, 1]) < 0.023  # consecutive entries
    # rows of a (num, batch) draw are different batches
    rows = np.asarray(sampling.uniform_indices(jax.random.PRNGKey(3), (4, 64), n))
    assert len({tuple(r) for r in rows}) == 4


def test_uniform_indices_rejects_bad_n():
    with pytest.raises(ValueError, match="0 < n < 2\\^31"):
        sampling.uniform_indices(jax.random.PRNGKey(0), (3,), 0)


def test_minibatches_shapes_counts_and_full_batch():
    data = {"a": jnp.arange(100.0), "b": jnp.arange(200.0).reshape(100, 2)}
    mb = sampling.minibatches(jax.random.PRNGKey(0), data, None, 8, outer=3, inner=5)
    assert mb.outer(2)["a"].shape == (8,) and mb.outer(2)["b"].shape == (8, 2)
    np.testing.assert_array_equal(mb.outer(1)["b"][:, 0], 2 * mb.outer(1)["a"])  # rows aligned
    assert mb.inner(0) is None
    assert mb.samples_outer == 24 and mb.samples_inner == 0
    full = sampling.minibatches(jax.random.PRNGKey(0), data, data, None, outer=2, inner=1)
    assert full.outer(0) is data and full.samples_outer == 200 and full.samples_inner == 100


def test_minibatch_mean_is_unbiased():
    """Average of many minibatch means equals the data mean within 5 standard errors."""
    rng = np.random.default_rng(0)
    data = {"v": jnp.asarray(rng.standard_normal(500) * 3 + 1)}
    mb = sampling.minibatches(jax.random.PRNGKey(7), data, None, 16, outer=4000, inner=0)
    means = jax.vmap(lambda i: jnp.mean(mb.outer(i)["v"]))(jnp.arange(4000))
    se = np.std(np.asarray(data["v"])) / np.sqrt(16 * 4000)
    assert abs(float(jnp.mean(means)) - float(jnp.mean(data["v"]))) < 5 * se


def test_vmap_over_keys():
    data = {"v": jnp.arange(50.0)}
    keys = jnp.stack([jax.random.PRNGKey(s) for s in range(4)])
    batches = jax.vmap(
        lambda k: sampling.minibatches(k, data, None, 5, outer=1, inner=0).outer(0)["v"]
    )(keys)
    assert batches.shape == (4, 5)
    assert len({tuple(np.asarray(b)) for b in batches}) == 4


# ---- scheme "window" -------------------------------------------------------------------------
def _window_rows(start: int, n: int, size: int) -> np.ndarray:
    data = {"row": jnp.arange(n), "twice": 2 * jnp.arange(n)[:, None] * jnp.ones((1, 3))}
    starts = jnp.full((1, 1, size), start)
    mb = sampling.Minibatches(data, None, starts, None, size, 0)
    batch = mb.outer(0)
    np.testing.assert_array_equal(batch["twice"], 2 * batch["row"][:, None] * np.ones((1, 3)))
    np.testing.assert_array_equal(mb.outer_rows(0), batch["row"])  # the rows, in batch order
    return np.asarray(batch["row"])


def test_window_is_the_cyclic_window_and_every_row_is_equally_likely():
    n, size = 11, 4
    counts = np.zeros(n, int)
    for start in range(n):  # the starts are uniform, so this is the exact inclusion law
        rows = _window_rows(start, n, size)
        assert sorted(rows) == sorted((start + np.arange(size)) % n)  # wraps around the end
        counts[rows] += 1
    np.testing.assert_array_equal(counts, size)  # each row in exactly b of the n windows
    assert len(set(_window_rows(n - 1, n, n))) == n  # a window as large as the data is all of it


def test_rows_are_the_batch_rows_in_order():
    """``outer_rows`` / ``inner_rows``: the sample indices of a draw, row k of the batch being
    sample ``rows[k]`` (SABA's per-sample tables rely on it), for both schemes."""
    n = 13
    data = {"row": jnp.arange(n) * 10}
    for scheme in sampling.SCHEMES:
        for seed in range(6):  # window starts 0..12: some of the 4-row windows wrap around
            mb = sampling.minibatches(
                jax.random.key(seed), data, data, 4, outer=2, inner=3, scheme=scheme
            )
            for i in range(3):
                np.testing.assert_array_equal(mb.inner(i)["row"], 10 * mb.inner_rows(i))
            np.testing.assert_array_equal(mb.outer(1)["row"], 10 * mb.outer_rows(1))
    full = sampling.minibatches(jax.random.key(0), data, None, None, outer=1, inner=0)
    assert full.outer_rows(0) is None and full.inner_rows(0) is None


def test_window_draws_and_errors():
    data = {"a": jnp.arange(50.0)}
    mb = sampling.minibatches(jax.random.key(0), data, data, 8, outer=3, inner=2, scheme="window")
    assert mb.outer_idx.shape == (3, 1, 8) and mb.inner_idx.shape == (2, 1, 8)
    assert mb.samples_outer == 24 and mb.samples_inner == 16
    assert mb.inner(1)["a"].shape == (8,)
    with pytest.raises(ValueError, match="batch_size <= the number of samples"):
        sampling.minibatches(jax.random.key(0), data, None, 51, outer=1, inner=0, scheme="window")
    with pytest.raises(ValueError, match="unknown sampling scheme"):
        sampling.minibatches(jax.random.key(0), data, None, 5, outer=1, inner=0, scheme="blocks")


def test_problem_sampling_option_reaches_the_solution():
    import bilevel as bl

    problem = bl.problems.quadratic(dx=3, dy=5, stochastic=True, n_samples=256)
    with pytest.raises(ValueError, match="sampling='blocks'"):
        problem.replace(sampling="blocks")
    start = float(problem.metrics(problem.x0, problem.y0)["grad_norm"])  # 2.14
    ends = {}
    for scheme in sampling.SCHEMES:
        solver = bl.solvers.make("f2sa", batch_size=32, lr_outer=0.2)
        res = bl.solve(
            problem.replace(sampling=scheme), solver, steps=1500, seeds=range(3), progress=False
        )
        ends[scheme] = float(res.history.groupby("seed")["grad_norm"].last().mean())
    # Both schemes are unbiased, so both fall to batch 32's noise floor: measured mean over the 3
    # seeds 0.25 (iid) and 0.38 (window), from 2.14; a biased or stuck sampler stays near 2.
    assert max(ends.values()) < 0.2 * start, (start, ends)
    assert ends["iid"] != ends["window"]  # the option is used


def test_a_static_draw_past_the_step_draws_is_refused():
    """JAX clamps an out-of-range index to the last draw: a solver reading draw 2 of two draws
    would silently reuse draw 1 (a mutant of F3SA's step did exactly that and passed every
    test). A static index outside the draws is an error naming the level and the count."""
    data = {"a": jnp.arange(10.0)}
    mb = sampling.minibatches(jax.random.PRNGKey(0), data, data, 4, outer=1, inner=2)
    mb.inner(1), mb.inner_rows(np.int32(1)), mb.outer(0)  # in range: fine
    with pytest.raises(IndexError, match="inner draw 2 requested, but this step drew 2 inner"):
        mb.inner(2)
    with pytest.raises(IndexError, match="outer draw -1"):
        mb.outer_rows(-1)
    with pytest.raises(IndexError, match="outer draw 1 requested"):
        mb.outer(1)
    # a traced index (an inner loop's counter) is not checked here
    assert jax.jit(lambda i: mb.inner(i)["a"])(1).shape == (4,)

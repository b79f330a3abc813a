"""``BilevelProblem(batch_chunks=k)``: minibatches evaluated as the row-weighted mean over k
consecutive parts (``bilevel.core.sampling.Chunks`` / ``ChunkMean``).

Exact answers: for a loss that is a mean over rows, the value and every derivative on the parts
equal the whole batch's (float64: up to summation order, so rtol 1e-12 for one evaluation and
1e-10 after whole solver runs, where the rounding differences of each step feed the next);
the parts of every draw are exactly the rows of the whole draw, in order.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bilevel as bl
from bilevel import oracles
from bilevel.core import sampling


def _mean_loss(x, y, batch):  # a mean over rows plus a term that does not read the batch
    residual = batch["A"] @ y - batch["b"] * x[0]
    tilt = x[1] * jnp.sum(batch["A"] * y[None, :], axis=1)
    return 0.5 * jnp.mean(residual**2 + tilt) + 0.1 * y @ y


def _batch(rows, seed=0):
    rng = np.random.default_rng(seed)
    return {"A": jnp.asarray(rng.standard_normal((rows, 4))), "b": jnp.asarray(rng.random(rows))}


@pytest.mark.parametrize("rows,chunks", [(10, 1), (10, 2), (10, 3), (10, 10), (7, 16)])
def test_values_and_derivatives_on_parts_equal_the_whole_batch(rows, chunks):
    fn = sampling.ChunkMean(_mean_loss)
    batch = _batch(rows)
    parts = sampling.split_rows(batch, chunks)
    assert isinstance(parts, sampling.Chunks) == (min(rows, chunks) > 1)
    if chunks > 1:  # near-equal parts, at most one per row, covering the batch in order
        assert sum(parts.sizes) == rows and max(parts.sizes) - min(parts.sizes) <= 1
        assert len(parts.sizes) == min(rows, chunks)
        np.testing.assert_array_equal(jnp.concatenate([p["A"] for p in parts.parts]), batch["A"])
    x, y, v = jnp.array([0.7, -0.3]), jnp.array([0.5, -1.0, 2.0, 0.1]), jnp.arange(4.0)
    pairs = [
        (fn(x, y, parts), _mean_loss(x, y, batch)),
        (oracles.grads(fn, x, y, parts), oracles.grads(_mean_loss, x, y, batch)),
        (oracles.hvp_yy(fn, x, y, parts, v), oracles.hvp_yy(_mean_loss, x, y, batch, v)),
        (oracles.cross_xy(fn, x, y, parts, v), oracles.cross_xy(_mean_loss, x, y, batch, v)),
    ]
    for got, want in pairs:
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("scheme", sampling.SCHEMES)
def test_the_parts_of_a_draw_are_its_rows_in_order(scheme):
    """Every draw, split into 3 parts, holds the rows of the whole draw (window starts near the
    end wrap around within and across parts), and ``inner_rows`` names them in the parts' order."""
    n, size = 13, 8
    data = {"row": jnp.arange(n) * 10, "wide": jnp.arange(n)[:, None] * jnp.ones((1, 3))}
    for seed in range(8):
        key = jax.random.key(seed)
        whole = sampling.minibatches(key, None, data, size, outer=0, inner=3, scheme=scheme)
        split = sampling.minibatches(
            key, None, data, size, outer=0, inner=3, scheme=scheme, chunks=3
        )
        for i in range(3):
            parts = split.inner(i)
            assert isinstance(parts, sampling.Chunks) and parts.sizes == (3, 3, 2)
            rows = jnp.concatenate([p["row"] for p in parts.parts])
            np.testing.assert_array_equal(rows, 10 * split.inner_rows(i))
            for p in parts.parts:
                np.testing.assert_array_equal(p["wide"], p["row"][:, None] / 10 * np.ones((1, 3)))
            if scheme == "iid":  # the same rows in the same order
                np.testing.assert_array_equal(rows, whole.inner(i)["row"])
            else:  # the same cyclic window of 8 rows
                start = int(whole.inner_idx[i, 0, 0])
                np.testing.assert_array_equal(
                    np.sort(rows), np.sort(10 * ((start + np.arange(size)) % n))
                )


def test_minibatches_keep_their_parts_through_jit():  # the part count is static pytree data
    data = {"row": jnp.arange(20.0)}
    mb = sampling.minibatches(jax.random.key(1), None, data, 8, outer=0, inner=2, chunks=3)
    parts = jax.jit(lambda m: m.inner(1))(mb)
    assert isinstance(parts, sampling.Chunks) and parts.sizes == (3, 3, 2)
    rows = jnp.concatenate([p["row"] for p in parts.parts])
    np.testing.assert_array_equal(rows, mb.inner_rows(1))


def test_full_batches_and_one_chunk_stay_whole():
    data = {"row": jnp.arange(6.0)}
    full = sampling.minibatches(jax.random.key(0), data, None, None, outer=1, inner=0, chunks=4)
    assert full.outer(0) is data
    one = sampling.minibatches(jax.random.key(0), data, None, 4, outer=1, inner=0, chunks=1)
    assert not isinstance(one.outer(0), sampling.Chunks)


def _stochastic(**changes):
    """A finite-sum quadratic whose f and g are means over rows (``bl.problems.quadratic``'s
    stochastic f is a function of the batch's mean e, which ``batch_chunks`` refuses)."""
    rng = np.random.default_rng(5)
    n, dx, dy = 96, 3, 6
    A0, B, D = np.eye(dy), rng.standard_normal((dy, dx)) / 3, rng.standard_normal((dy, dx)) / 3
    inner_data = {"w": rng.standard_normal((n, dy)) / 2, "b": rng.standard_normal((n, dy))}
    outer_data = {"e": rng.standard_normal((n, dy))}

    def inner(x, y, batch):
        fit = 0.5 * jnp.mean((batch["w"] @ y) ** 2) - jnp.mean(batch["b"], axis=0) @ y
        return 0.5 * y @ A0 @ y + fit - y @ (B @ x) + 0.05 * x @ x

    def outer(x, y, batch):
        residual = y[None, :] - (D @ x)[None, :] - batch["e"]
        return 0.5 * jnp.mean(jnp.sum(residual**2, axis=1)) + 0.05 * x @ x

    problem = bl.BilevelProblem(
        outer, inner, jnp.zeros(dx), jnp.zeros(dy), outer_data, inner_data, name="row means"
    )
    return problem.replace(**changes)


def test_the_library_quadratic_is_refused():  # its f is not a mean over rows (see _stochastic)
    problem = bl.problems.quadratic(dx=3, dy=6, stochastic=True, n_samples=96)
    with pytest.raises(ValueError, match="needs outer to be a mean over the batch's rows"):
        problem.replace(batch_chunks=2)


#: every solver on one scheme, every scheme under two solvers: a solver reads its parts the
#: same way whatever rows a draw holds, and that each scheme's draws split into their own rows
#: in order is checked above for every scheme (the full product compiled 16 programs for
#: what these 8 check)
SOLVER_SCHEMES = [("f2sa", "window"), ("stocbio", "iid"), ("pzobo", "window"), ("saba", "iid")]


def test_the_solver_runs_cover_every_scheme():
    assert {scheme for _, scheme in SOLVER_SCHEMES} == set(sampling.SCHEMES)


@pytest.mark.parametrize(("name", "scheme"), SOLVER_SCHEMES)
def test_solver_runs_match_whole_batches(name, scheme):
    """The same iterates as with whole batches: the same draws, each evaluated in 3 parts (20
    rows: parts of 7, 7, 6; windows wrap around the 96 samples). SABA reads its batches row by
    row, so it keeps them whole: bit-identical."""
    solver = bl.solvers.make(name, lr_outer=0.01, batch_size=20)
    runs = [
        bl.solve(
            _stochastic(sampling=scheme, batch_chunks=k), solver, steps=40, seed=3, progress=False
        )
        for k in (1, 3)
    ]
    whole, split = (np.concatenate([np.ravel(r.x), np.ravel(r.y)]) for r in runs)
    if name == "saba":
        np.testing.assert_array_equal(split, whole)
    else:
        np.testing.assert_allclose(split, whole, rtol=1e-10, atol=1e-12)
    assert runs[0].state.counts == runs[1].state.counts  # the same samples and oracle calls


def test_problem_option_is_checked_and_kept_across_copies():
    base = _stochastic()
    problem = base.replace(batch_chunks=4)
    assert isinstance(problem.inner, sampling.ChunkMean) and problem.batch_chunks == 4
    copy = problem.replace(name="renamed")  # no new wrapper: the compiled programs are reused
    assert copy.inner is problem.inner and copy.outer is problem.outer
    bare = problem.replace(batch_chunks=1)
    assert not isinstance(bare.inner, sampling.ChunkMean)
    assert bare.inner is base.inner
    for bad in (0, -2, 1.5, True, "4"):
        with pytest.raises(ValueError, match=f"batch_chunks={bad!r}"):
            problem.replace(batch_chunks=bad)


def test_a_loss_that_is_not_a_row_mean_is_refused():
    data = _batch(12)

    def summed(x, y, batch):  # a sum over rows: halves would give half the value
        return jnp.sum((batch["A"] @ y - batch["b"] * x[0]) ** 2)

    with pytest.raises(ValueError, match="needs outer to be a mean over the batch's rows"):
        bl.BilevelProblem(summed, _mean_loss, jnp.ones(2), jnp.ones(4), data, data, batch_chunks=2)
    bl.BilevelProblem(summed, _mean_loss, jnp.ones(2), jnp.ones(4), data, data)  # whole: fine


def test_checkpoint_fingerprint_sees_the_parts_and_the_users_function(tmp_path):
    """A resumed run with parts ends as the uninterrupted one; the fingerprint names the part
    count and hashes the user's own functions (not the ChunkMean view around them)."""
    from bilevel.core.problem import users_function
    from bilevel.drivers.checkpoints import signature as _signature

    problem = _stochastic(batch_chunks=2)
    solver = bl.solvers.make("f2sa", lr_outer=0.01, batch_size=20)
    args = dict(seed=0, progress=False, eval_every=5)
    straight = bl.solve(problem, solver, steps=10, **args)
    keep = dict(checkpoint=tmp_path, checkpoint_interval=0)
    bl.solve(problem, solver, steps=5, **keep, **args)
    resumed = bl.solve(problem, solver, steps=10, **keep, **args)
    np.testing.assert_array_equal(resumed.x, straight.x)
    signature = functools.partial(_signature, solver=solver, seeds=[0], batched=False, eval_every=5)
    assert signature(problem) != signature(problem.replace(batch_chunks=3))
    assert signature(problem) != signature(problem.replace(batch_chunks=1))

    def other_outer(x, y, batch):  # another row-mean loss: another trajectory
        return 2.0 * users_function(problem.outer)(x, y, batch)

    assert signature(problem) != signature(problem.replace(outer=other_outer))

"""Timing pieces shared by the benchmarks: alternated paired timing, a solver's compiled chunk,
its per-step oracle calls, and the raw oracle floor (a bare scan of the same calls)."""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp

from bilevel import oracles
from bilevel.core import sampling
from bilevel.core import sharding as parallel
from bilevel.core.tree import tree_axpy
from bilevel.drivers import _xla_cpu, programs
from bilevel.drivers.cpu_rewrites import CpuRewrites


def best_time(fn, *args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # warm up (compiled already; first-touch of buffers)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return min(times)


def paired_times(a, b, repeats: int) -> tuple[float, float, float]:
    """Time the thunks ``a`` and ``b`` alternately; (best a, best b, median of the a/b ratios).

    This machine is shared and its speed drifts by up to 2x over seconds, so two programs
    timed one after the other can disagree for reasons that have nothing to do with them.
    Alternating them and taking the median of the per-pair ratios cancels the drift.
    """
    jax.block_until_ready(a())
    jax.block_until_ready(b())
    ta, tb = [], []
    for _ in range(repeats):
        for thunk, out in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            jax.block_until_ready(thunk())
            out.append(time.perf_counter() - t0)
    return min(ta), min(tb), statistics.median(x / y for x, y in zip(ta, tb, strict=True))


def solver_chunk(problem, solver, steps, seeds, mesh=None):
    """The compiled chunk ``bl.solve`` runs, as a zero-argument thunk running it once, and its
    starting state; with ``mesh``, as ``bl.solve(mesh=...)`` runs it (data on the mesh)."""
    problem = parallel.replicate(problem, mesh)
    state = programs.init_states(solver, problem, list(range(seeds)), mesh=mesh)
    chunk = programs.compile_chunk(solver, problem, state, steps, mesh=mesh)
    start = state if seeds > 1 else jax.tree.map(lambda a: a[0], state)  # one seed: no axis
    return (lambda: chunk(problem, state)), start


def per_step_calls(problem, solver, state):
    """Oracle calls and minibatch draws of one step, read off the solver's counters."""
    one = jax.tree.map(lambda a: a, state)
    after = jax.jit(solver.step)(problem, one)
    c0, c1 = state.counts, after.counts
    calls = {k: int(getattr(c1, k)) - int(getattr(c0, k)) for k in c0.oracle_kinds}
    bs = solver.batch_size or 1  # deterministic problems draw nothing
    draws_in = (int(c1.samples_inner) - int(c0.samples_inner)) // bs
    draws_out = (int(c1.samples_outer) - int(c0.samples_outer)) // bs
    return calls, draws_out, draws_in


def floor_program(problem, calls, draws_out, draws_in, batch_size, steps, seeds=1):
    """A bare scan making ``calls`` oracle calls per step on fresh minibatches; with
    ``seeds > 1`` vmapped over that many (x, y, key), each argument with a leading seed axis,
    before the rewrite, as ``bl.solve`` compiles a run of several seeds."""
    f, g = problem.outer, problem.inner
    n_out = max(draws_out, calls["grad_f"] + calls["value_f"], 1)
    n_in = max(draws_in, 1)

    def step(carry, _):
        x, y, key = carry
        key, sub = jax.random.split(key)
        mb = sampling.minibatches(
            sub,
            problem.outer_data,
            problem.inner_data,
            batch_size,
            outer=n_out,
            inner=n_in,
            scheme=problem.sampling,  # the solver's batches: same scheme, same kind of copy
            chunks=problem.batch_chunks,  # and the same parts
        )

        def loop(n, fn, carry_xy, offset):
            def body(c, i):  # feed the result back so no call is hoisted out of the loop;
                xx, yy = c  # only into the variable it lives in (no dense work on the other)
                gx, gy = fn(xx, yy, i + offset)
                xx = xx if gx is None else tree_axpy(1e-12, gx, xx)
                yy = yy if gy is None else tree_axpy(1e-12, gy, yy)
                return (xx, yy), None

            return jax.lax.scan(body, carry_xy, jnp.arange(n))[0] if n else carry_xy

        # the cheapest oracle of each kind: one partial gradient, one HVP, one cross product.
        # The HVP and cross product take the direction y + 1, not y: along v = y XLA shares the
        # tangent's product X v with the forward pass's X y, one matrix product fewer than any
        # solver's HVP (whose v is never its y) pays (stocBiO on data cleaning: 20 of 67 us)
        def direction(b):
            return jax.tree.map(lambda leaf: leaf + 1.0, b)

        def grad_f(a, b, i):
            return None, oracles.grad_y(f, a, b, mb.outer(i % n_out))

        def grad_g(a, b, i):
            return None, oracles.grad_y(g, a, b, mb.inner(i % n_in))

        def hvp(a, b, i):
            return None, oracles.hvp_yy(g, a, b, mb.inner(i % n_in), direction(b))

        def cross(a, b, i):
            return oracles.cross_xy(g, a, b, mb.inner(i % n_in), direction(b)), None

        xy = (x, y)
        xy = loop(calls["grad_f"], grad_f, xy, 0)
        xy = loop(calls["grad_g"], grad_g, xy, 0)
        xy = loop(calls["hvp"], hvp, xy, calls["grad_g"])
        xy = loop(calls["cross"], cross, xy, calls["grad_g"] + calls["hvp"])

        def dense(a, b, i):  # a dense Hessian (STABLE's matrices), reduced to a y-vector
            return None, jnp.sum(oracles.hessian_yy(g, a, b, mb.inner(i % n_in)), axis=1)

        xy = loop(calls["dense"], dense, xy, 0)
        return (*xy, key), None

    def run(x, y, key):
        return jax.lax.scan(step, (x, y, key), None, length=steps)[0]

    if seeds > 1:
        run = jax.vmap(run)
    # compiled as bl.solve compiles a chunk, so the ratio compares the same kernels
    options = CpuRewrites.default()
    return jax.jit(_xla_cpu.rewrite(run, options) if _xla_cpu.applies(options) else run)


def floor_seed_ratio(problem, solver, state, batch_size, steps, seeds, repeats):
    """The raw oracle floor of ``solver`` with ``seeds`` vmapped seeds over one seed (median
    per-pair ratio): what the oracle calls alone cost for more seeds, beside the solver's own."""
    calls, draws_out, draws_in = per_step_calls(problem, solver, state)
    one = floor_program(problem, calls, draws_out, draws_in, batch_size, steps)
    many = floor_program(problem, calls, draws_out, draws_in, batch_size, steps, seeds)
    keys = jax.random.split(jax.random.PRNGKey(0), seeds)

    def stacked(tree):
        return jax.tree.map(lambda a: jnp.broadcast_to(a, (seeds, *jnp.shape(a))), tree)

    xs, ys = stacked(problem.x0), stacked(problem.y0)
    return paired_times(
        lambda: many(xs, ys, keys), lambda: one(problem.x0, problem.y0, keys[0]), repeats
    )[2]


def versus_floor(problem, solver, run, state, batch_size, steps, repeats):
    """The solver's chunk ``run`` (from :func:`solver_chunk`, one seed, ``steps`` steps) against
    its raw oracle floor: ``(best solver time, best floor time, median per-pair ratio, calls)``
    with ``calls`` the oracle calls of one step by kind."""
    calls, draws_out, draws_in = per_step_calls(problem, solver, state)
    floor = floor_program(problem, calls, draws_out, draws_in, batch_size, steps)
    key = jax.random.PRNGKey(0)
    t_solver, t_floor, ratio = paired_times(
        run, lambda: floor(problem.x0, problem.y0, key), repeats
    )
    return t_solver, t_floor, ratio, calls

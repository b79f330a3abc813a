"""The compile cache of the drivers (``bilevel.drivers.programs``): keyed on the program spec
(the CPU rewrite options included) and the avals of solver, problem and state."""

import jax
import numpy as np
import pytest

import bilevel as bl
from bilevel.drivers import programs


@pytest.fixture
def small():
    problem = bl.problems.quadratic(dx=2, dy=3, stochastic=True, n_samples=32)
    return problem, bl.solvers.make("f2sa", lr_outer=0.05, lr_inner=0.1, batch_size=4)


def _chunks():
    return programs.cached_programs("chunk")


def test_other_rewrite_options_compile_another_program(small):
    problem, solver = small
    run = dict(steps=6, eval_every=6, seed=0, progress=False)
    programs.clear_cache()
    first = bl.solve(problem, solver, **run, cpu_rewrites=bl.CpuRewrites())
    assert [spec.cpu_rewrites for spec, _ in _chunks()] == [bl.CpuRewrites()]
    other = bl.CpuRewrites(small_dots=False)
    bl.solve(problem, solver, **run, cpu_rewrites=other)
    specs = [spec for spec, _ in _chunks()]
    assert [spec.cpu_rewrites for spec in specs] == [bl.CpuRewrites(), other]  # it compiled
    # the evaluation and init programs are compiled without rewrites: one of each serves both
    assert len(programs.cached_programs("eval")) == len(programs.cached_programs("init")) == 1
    compiled = [c for _, c in _chunks()]
    again = bl.solve(problem, solver, **run, cpu_rewrites=bl.CpuRewrites())
    assert [c for _, c in _chunks()] == compiled  # the first program, reused
    np.testing.assert_array_equal(np.asarray(again.x), np.asarray(first.x))


def test_a_single_seed_and_a_batch_of_one_share_their_programs(small):
    """The engine always carries a seed axis: ``seed=0`` and ``seeds=[0]`` run one program
    and only the result's shapes differ."""
    problem, solver = small
    run = dict(steps=6, eval_every=3, progress=False, cpu_rewrites=False)
    programs.clear_cache()
    one = bl.solve(problem, solver, seed=0, **run)
    count = len(programs.cached_programs())
    batch = bl.solve(problem, solver, seeds=[0], **run)
    assert len(programs.cached_programs()) == count
    assert np.shape(one.x) == (2,) and np.shape(batch.x) == (1, 2)
    for a, b in zip(jax.tree.leaves(one.state), jax.tree.leaves(batch.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b)[0])


def test_compile_chunk_and_init_states_are_the_solve_programs(small):
    problem, solver = small
    solver = solver.with_horizon(5)  # what bl.solve runs: F2SA's k0="auto" is the horizon
    programs.clear_cache()
    state = programs.init_states(solver, problem, [0, 1])
    assert np.shape(state.x) == (2, 2)
    chunk = programs.compile_chunk(solver, problem, state, 5, cpu_rewrites=False)
    ((spec, _),) = _chunks()
    assert (spec.kind, spec.length, spec.rewritten) == ("chunk", 5, False)
    after = chunk(problem, state)
    res = bl.solve(problem, solver, 5, seeds=[0, 1], progress=False, cpu_rewrites=False)
    assert len(_chunks()) == 1  # solve found the chunk compiled
    for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(res.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the rewrites apply on CPU only")
def test_a_checkpoint_of_other_rewrite_options_is_not_resumed(small, tmp_path):
    problem, solver = small
    run = dict(steps=4, eval_every=2, progress=False, checkpoint=tmp_path, checkpoint_interval=0)
    bl.solve(problem, solver, **run, cpu_rewrites=bl.CpuRewrites())
    with pytest.raises(ValueError, match="other CPU rewrite options"):
        bl.solve(problem, solver, **run, cpu_rewrites=bl.CpuRewrites(merge_dots=False))
    resumed = bl.solve(problem, solver, **run, cpu_rewrites=bl.CpuRewrites())
    assert resumed.message.startswith("resumed")

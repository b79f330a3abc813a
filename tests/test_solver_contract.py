"""Solver contract v2 (issue #12): a solver is a frozen dataclass AND a pytree.

Numeric hyperparameters are leaves, so a solver goes through ``jax.jit`` and ``jax.vmap`` as an
argument: another step size reuses the compiled program (and is really used), and a batch of
step sizes is one vmapped program (what ``bl.sweep`` builds on). What sets shapes or code paths
is static. Every registered solver is checked on a small stochastic quadratic.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from solver_settings import problem_for

import bilevel as bl
from bilevel.solvers.base import Solver, _is_leaf

NAMES = bl.solvers.names()


@pytest.fixture(scope="module")
def problem():
    return bl.problems.quadratic(dx=3, dy=4, stochastic=True, n_samples=64)


def _make(name: str, **kwargs) -> Solver:
    """``make(name, ...)`` with ``batch_size=32`` where the solver has that field."""
    if "batch_size" in {f.name for f in dataclasses.fields(bl.solvers.get(name))}:
        kwargs.setdefault("batch_size", 32)
    return bl.solvers.make(name, **kwargs)


def _assert_trees_equal(a, b) -> None:
    def raw(leaf):  # typed PRNG keys compare by their bits
        is_key = jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)
        return np.asarray(jax.random.key_data(leaf) if is_key else leaf)

    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(raw(u), raw(v))


@pytest.mark.parametrize("name", NAMES)
def test_solver_is_a_jit_argument_and_new_step_sizes_reuse_the_program(name, problem):
    """The contract snippet: the second call (lr_outer replaced) traces nothing new, and it
    used the new value: bit-identical to a solver built with lr_outer=0.02 from the start."""
    problem = problem_for(name, problem)
    traces = []

    def step_fn(s, st):
        traces.append(1)  # a Python side effect: runs once per trace
        return s.step(problem, st)

    solver = _make(name, lr_outer=0.05).resolve(problem)
    state = solver.init(problem, jax.random.key(0))
    step = jax.jit(step_fn)
    state = step(solver, state)
    new = step(dataclasses.replace(solver, lr_outer=0.02), state)
    assert len(traces) == 1 and step._cache_size() == 1
    x, y = solver.output(new)
    assert all(np.all(np.isfinite(leaf)) for leaf in jax.tree.leaves((x, y)))

    _assert_trees_equal(new, step(_make(name, lr_outer=0.02).resolve(problem), state))
    old_x, _ = solver.output(step(solver, state))
    assert not np.array_equal(np.asarray(old_x), np.asarray(x)), "lr_outer was not used"
    assert len(traces) == 1


@pytest.mark.parametrize("name", [n for n in NAMES if bl.solvers.get(n)().lr_inner == "auto"])
def test_unresolved_solver_is_refused_with_a_clear_message(name, problem):
    problem = problem_for(name, problem)
    # lr_outer given: an "auto" lr_outer is tuned by bl.solve (tests/test_tuning.py)
    lr_outer = {} if bl.solvers.get(name).tuned_step_sizes == () else {"lr_outer": 0.01}
    solver = _make(name, **lr_outer).with_horizon(100)  # as bl.solve does (IBCG needs K)
    message = r"lr_inner='auto'.* not resolved: call solver = solver\.resolve\(problem\)"
    with pytest.raises(ValueError, match=message):
        solver.init(problem, jax.random.key(0))
    state = solver.resolve(problem).init(problem, jax.random.key(0))
    with pytest.raises(ValueError, match=message):
        solver.step(problem, state)


def test_resolve_without_auto_settings_returns_the_solver(problem):
    solver = bl.solvers.make(
        "stocbio", lr_inner=0.1, batch_size=32, inner_steps=10, neumann_steps=5
    )
    assert solver.resolve(problem) is solver


def test_an_auto_count_resolves_to_its_start_and_needs_no_resolve(problem):
    """An ``"auto"`` truncation count is the number it starts at (``auto_counts``): filled in
    by ``resolve``, and taken as that number by ``init``/``step`` of a solver whose steps are
    numbers (it follows only the ``"auto"`` steps of ``bl.solve``)."""
    counts = [("itd", "inner_steps", 20), ("stocbio", "neumann_steps", 5),
              ("stocbio", "inner_steps", 10),
              ("pzobo", "inner_steps", 20), ("hozog", "inner_steps", 20)]  # fmt: skip
    for name, field, start in counts:
        auto = bl.solvers.make(name, lr_outer=0.01, lr_inner=0.1)
        assert getattr(auto, field) == "auto" and auto.unresolved() == []
        assert getattr(auto.resolve(problem), field) == start
        given = dataclasses.replace(auto, **{field: start})
        key = jax.random.key(0)
        stepped = jax.jit(auto.step)(problem, auto.init(problem, key))
        expected = jax.jit(given.step)(problem, given.init(problem, key))
        np.testing.assert_array_equal(np.asarray(stepped.x), np.asarray(expected.x))
    assert bl.solvers.make("stocbio", neumann_steps=0).neumann_steps == 0  # Q = 0 stays valid


def test_leaves_are_the_numeric_hyperparameters():
    """Floats (and ints given to float fields) are leaves; ints, strings, bools, None and
    schedules are static aux data."""
    solver = bl.solvers.make("f2sa", lr_outer=0.05, lr_inner=0.25, batch_size=32, lam0=3)
    paths = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(solver)}
    assert paths == {".lr_outer": 0.05, ".lr_inner": 0.25, ".lam0": 3.0}  # k0="auto": static
    told = jax.tree_util.tree_leaves_with_path(solver.with_horizon(3000))
    assert {jax.tree_util.keystr(p): v for p, v in told}[".k0"] == 3000.0  # the horizon: a leaf
    assert 0.05 in jax.tree.leaves(solver)
    # an int step size is a float leaf: the same structure as a float one
    ints = bl.solvers.make("stocbio", lr_outer=1, lr_inner=0.1)
    floats = bl.solvers.make("stocbio", lr_outer=0.5, lr_inner=0.1)
    assert jax.tree.structure(ints) == jax.tree.structure(floats)
    assert ints.lr_outer == 1  # the solver itself keeps what the user typed
    # a schedule is static: another schedule is another program
    sched = bl.solvers.make("stocbio", lr_outer=lambda k: 0.1 / (k + 1), lr_inner=0.1)
    assert jax.tree.leaves(sched) == [0.1]
    # an optax transformation (a NamedTuple of functions) is static, like a schedule
    transformed = bl.solvers.make(
        "pzobo", lr_inner=0.1, inner_optimizer=optax.trace(decay=0.9), outer_optimizer="adam"
    )
    assert jax.tree.leaves(transformed) == [0.1, 0.01]  # lr_inner, smoothing ("auto" is static)
    # while a tuple of floats (no solver has one now) is numeric: one leaf per float
    (betas,) = dataclasses.fields(dataclasses.make_dataclass("Betas", [("betas", tuple)]))
    assert _is_leaf(betas, (0.9, 0.999)) and not _is_leaf(betas, optax.trace(decay=0.9))


def test_rebuilt_solvers_keep_their_structure(problem):
    """JAX rebuilds pytrees with placeholder leaves (vmap in_axes, ``object()``); the rebuilt
    solver skips validation and flattens to the same structure as the original."""
    solver = bl.solvers.make("f2sa", lr_outer=0.05, lr_inner=0.1)
    treedef = jax.tree.structure(solver)
    for placeholder in (None, object(), 0):
        rebuilt = jax.tree.map(lambda _, p=placeholder: p, solver)
        assert jax.tree.structure(rebuilt, is_leaf=lambda v: v is None) == treedef


def test_static_metadata_keeps_a_float_out_of_the_leaves():
    """``metadata={"static": True}`` marks a float that sets a code path."""

    @dataclasses.dataclass(frozen=True)
    class Toy(Solver):
        lr_outer: Any = 0.1
        threshold: float = dataclasses.field(default=0.5, metadata={"static": True})

        def init(self, problem, key):
            return self.initial_state(problem, key)

        def step(self, problem, state):
            return state if self.threshold > 1 else state._replace(k=state.k + 1)

    toy = Toy()
    assert jax.tree.leaves(toy) == [0.1]
    assert jax.tree.structure(Toy(threshold=0.7)) != jax.tree.structure(toy)
    assert jax.tree.structure(Toy(lr_outer=0.3)) == jax.tree.structure(toy)


def test_a_solver_built_under_jit_from_a_traced_value(problem):
    """``dataclasses.replace`` inside ``jit`` gets a tracer: it cannot be validated (it was
    when the outer solver was built) and must not fail."""
    solver = bl.solvers.make("stocbio", lr_outer=0.05, lr_inner=0.1, batch_size=32)
    state = solver.init(problem, jax.random.key(0))

    @jax.jit
    def step_with(lr):
        return dataclasses.replace(solver, lr_outer=lr).step(problem, state)

    expected = jax.jit(lambda s: s.step(problem, state))(dataclasses.replace(solver, lr_outer=0.02))
    np.testing.assert_allclose(step_with(0.02).x, expected.x, rtol=1e-14)
    with pytest.raises(ValueError, match="lr_outer"):
        dataclasses.replace(solver, lr_outer=-0.02)  # concrete values still are checked


@pytest.mark.parametrize("name", NAMES)
def test_vmap_over_a_batch_of_lr_outer(name, problem):
    """A stack of solvers that differ in lr_outer is one vmapped step, equal to the separate
    steps (float64 batched kernels may sum in another order: 1e-12 relative)."""
    problem = problem_for(name, problem)
    solver = _make(name, lr_outer=0.05).resolve(problem)
    solvers = [dataclasses.replace(solver, lr_outer=lr) for lr in (0.01, 0.02, 0.05)]
    batch = jax.tree.map(lambda *v: jnp.stack([jnp.asarray(a) for a in v]), *solvers)
    state = solver.init(problem, jax.random.key(1))
    step = jax.jit(lambda s: s.step(problem, state))
    stepped = jax.vmap(step)(batch)
    xs = [solver.output(step(s))[0] for s in solvers]
    for i, x in enumerate(xs):
        got = jax.tree.map(lambda a, i=i: a[i], solver.output(stepped)[0])
        np.testing.assert_allclose(np.asarray(got), np.asarray(x), rtol=1e-12, atol=1e-14)
    assert not np.allclose(np.asarray(xs[0]), np.asarray(xs[2]))


@pytest.mark.parametrize("name", NAMES)
def test_a_float32_start_gives_a_float32_state(name, problem):
    """A problem started in float32 (``jax_enable_x64`` on, as in every test) gets a state whose
    floating leaves are all float32: an estimate built from a default-dtype constant (STABLE's
    ``H_yy = mu_g I`` without the start's dtype, a surviving mutant) would be float64 and turn
    every step float64."""
    problem = problem_for(name, problem)
    problem = problem.replace(
        x0=jnp.asarray(problem.x0, jnp.float32), y0=jnp.asarray(problem.y0, jnp.float32)
    )
    solver = _make(name, lr_outer=0.01).resolve(problem)
    state = solver.init(problem, jax.random.key(0))
    wide = {
        jax.tree_util.keystr(path): leaf.dtype
        for path, leaf in jax.tree_util.tree_leaves_with_path(state)
        if jnp.issubdtype(leaf.dtype, jnp.floating) and leaf.dtype != jnp.float32
    }
    assert not wide, wide


@pytest.mark.parametrize("outer", ["sgd", "adam"])
def test_outer_step_records_the_norm_of_the_direction_it_was_given(problem, outer):
    """``outer_state.direction_norm`` (the history's ``hypergrad_estimate_norm``, PZOBO's Fig.
    2(e)) is ||direction||, the estimate itself, not the optimiser's update; with SGD the step
    is ``x - lr * direction``."""
    solver = _make("f2sa", outer_optimizer=outer)
    x = problem.x0
    direction = jnp.array([3.0, -4.0, 12.0], dtype=x.dtype)
    x_new, state = solver.outer_step(problem, x, direction, solver.outer_init(x), 0.1)
    np.testing.assert_allclose(state.direction_norm, 13.0, rtol=1e-12)
    if outer == "sgd":
        np.testing.assert_allclose(x_new, x - 0.1 * direction, rtol=1e-12)

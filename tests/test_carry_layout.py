"""``_xla_cpu.carry_layout`` (through ``_xla_cpu.rewrite``): loops carry narrow weight matrices
transposed where their updates are elementwise in the transposed gradient; values unchanged;
carries that would need a transpose every step, or that a loop condition reads, stay as they
are."""

import jax
import jax.numpy as jnp
import numpy as np
from test_wide_dots import _cleaning_like_problem, _cross_entropy, keep
from test_wide_dots import _data as linear_layer_data

import bilevel as bl
from bilevel.drivers._xla_cpu import carry_layout, carry_loops
from bilevel.drivers.cpu_rewrites import CpuRewrites

D, C, B = 256, 8, 16  # a narrow (D, C) weight matrix: C <= 16 columns, D >= 8 C, D C >= 2048


def _data(seed=0):
    return linear_layer_data(seed, batch=B, dim=D, classes=C)


def _loss(W, X, labels):  # W: the (D, C) matrix, or the same numbers as a vector
    return _cross_entropy(W.reshape(D, C), X, labels)


def _loop_carries(fn, *args) -> list[list[tuple[int, ...]]]:
    """The carry shapes of every scan and while loop of ``fn``'s jaxpr (nested ones too)."""
    found = []

    def visit(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "scan":
                body, first = eqn.params["jaxpr"].jaxpr, eqn.params["num_consts"]
                carries = body.invars[first : first + eqn.params["num_carry"]]
                found.append([v.aval.shape for v in carries])
            elif eqn.primitive.name == "while":
                body = eqn.params["body_jaxpr"].jaxpr
                found.append([v.aval.shape for v in body.invars[eqn.params["body_nconsts"] :]])
            for value in eqn.params.values():
                for sub in value if isinstance(value, tuple) else (value,):
                    if hasattr(sub, "jaxpr") and hasattr(sub, "consts"):
                        visit(sub.jaxpr)

    visit(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


def _same(rewritten, program, *args):
    for got, want in zip(jax.jit(rewritten)(*args), jax.jit(program)(*args), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_a_narrow_weight_matrix_is_carried_transposed_by_gradient_steps():
    X, labels, W = _data()
    grad = jax.grad(_loss)

    def program(W):
        W = jax.lax.fori_loop(0, 3, lambda i, W: W - 0.1 * grad(W, X, labels), W)
        return (W,)

    rewritten = keep(program)
    assert _loop_carries(program, W) == [[(), (D, C)]]
    assert _loop_carries(rewritten, W) == [[(), (C, D)]]  # (counter, W^T)
    _same(rewritten, program, W)


def test_vectors_sums_nested_loops_and_calls():
    """benchopt's layout: y a vector the loss reshapes; a Neumann-like loop with a running sum
    (carried transposed because its next value is, once the iterate is); the loops inside a
    jitted call inside an outer scan, which then carries y transposed too."""
    X, labels, W = _data()
    y0 = W.reshape(-1)
    grad = jax.grad(_loss)

    @jax.jit
    def inner_steps(y):
        y = jax.lax.fori_loop(0, 2, lambda i, y: y - 0.1 * grad(y, X, labels), y)

        def term(carry, _):
            v, total = carry
            v = v - 0.01 * grad(v, X, labels)
            return (v, total + v), None

        (v, total), _ = jax.lax.scan(term, (y, jnp.zeros_like(y)), None, length=3)
        return y - 0.001 * total

    def program(y):
        y, _ = jax.lax.scan(lambda y, _: (inner_steps(y), None), y, None, length=2)
        return (y,)

    flat = [(D * C,)]
    assert _loop_carries(program, y0) == [flat, [(), *flat], flat * 2]
    transposed = [(C, D)]
    assert _loop_carries(keep(program), y0) == [
        transposed,
        [(), *transposed],
        transposed * 2,
    ]
    _same(keep(program), program, y0)


def test_what_would_need_a_transpose_each_step_stays():
    X, labels, W = _data()
    grad = jax.grad(_loss)
    mix = jnp.eye(C) + 0.01

    def right_product(W):  # next W = (W - lr g) A: a product's narrow output, not a transpose
        return (jax.lax.fori_loop(0, 2, lambda i, W: (W - 0.1 * grad(W, X, labels)) @ mix, W),)

    def read_by_condition(W):  # the loop condition reads W
        def body(carry):
            return carry[0] - 0.1 * grad(carry[0], X, labels), carry[1] + 1

        return jax.lax.while_loop(lambda c: (jnp.sum(c[0] ** 2) > 1e-3) & (c[1] < 3), body, (W, 0))

    def small(W):  # (48, 3): too small to matter
        w = W[:48, :3]
        loss = lambda w: jnp.sum((X[:, :48] @ w) ** 2)  # noqa: E731
        return (jax.lax.fori_loop(0, 2, lambda i, w: w - 0.1 * jax.grad(loss)(w), w),)

    for program in (right_product, read_by_condition, small):
        rewritten = keep(program)
        assert _loop_carries(rewritten, W) == _loop_carries(program, W), program.__name__
        _same(rewritten, program, W)
    plain = lambda W: (jax.lax.fori_loop(0, 2, lambda i, W: W - grad(W, X, labels), W),)  # noqa: E731
    assert _loop_carries(keep(plain), W) == [[(), (C, D)]]
    assert _loop_carries(keep(plain, carry_layout=False), W) == [[(), (D, C)]]


def test_rule_covers_the_update_of_benchopts_inner_step():
    """Representations flow through a reshape, a scalar broadcast, elementwise operations and a
    full reduction, and out of a transposed wide product (the weight gradient)."""
    X, labels, W = _data()
    y = W.reshape(-1)

    def step(y):
        g = jax.grad(_loss)(y, X, labels) + 0.2 * 2.0 * y
        return y - jnp.float64(0.1) * g, jnp.sum(y**2)

    jaxpr = jax.make_jaxpr(step)(y).jaxpr
    out = carry_layout.flow(jaxpr, {0: (D, C)})
    assert out == {0: (D, C)}  # the next y; the sum is a value, not represented
    assert carry_layout.flow(jaxpr, {}) == {}  # y itself not represented: its update is not


def test_stocbio_runs_the_same_with_and_without(monkeypatch):
    """A whole stocBiO run on a cleaning-like problem with a (256, 8) weight matrix: its inner
    loop, Neumann loop and chunk carry W transposed, with the same iterates (float64)."""
    from bilevel.drivers import programs

    problem = _cleaning_like_problem(dim=D, classes=C)
    # a fixed lr_outer: the layout is what is compared, not the tuning run's choice
    solver = bl.solvers.make("stocbio", batch_size=8, inner_steps=2, neumann_steps=3, lr_outer=0.01)
    loops = []
    bind_loop = carry_loops.bind_loop
    monkeypatch.setattr(
        carry_loops,
        "bind_loop",
        lambda eqn, carried, *a: loops.append(carried) or bind_loop(eqn, carried, *a),
    )
    results = {}
    for transpose in (True, False):
        programs.clear_cache()
        options = CpuRewrites(carry_layout=transpose)
        results[transpose] = bl.solve(
            problem, solver, steps=15, seed=2, progress=False, cpu_rewrites=options
        )
        if transpose:
            assert len(loops) >= 3 and all((D, C) in carried.values() for carried in loops)
            loops.clear()
    assert not loops  # off: no loop carried transposed
    np.testing.assert_allclose(results[True].y, results[False].y, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(results[True].x, results[False].x, rtol=1e-9, atol=1e-12)

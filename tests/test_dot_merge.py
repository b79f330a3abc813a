"""``_xla_cpu.dot_merge`` (through ``_xla_cpu.rewrite``): products that share an operand run as
one, values unchanged; duplicates shared, dead code dropped; what must not merge does not."""

import jax
import jax.numpy as jnp
import numpy as np
from test_wide_dots import _cleaning_like_problem, keep

import bilevel as bl
from bilevel.drivers._xla_cpu import dot_merge
from bilevel.drivers.cpu_rewrites import CpuRewrites

B, D, C = 32, 40, 3  # the batch (B, D) holds at least MIN_SHARED_RATIO times the weights' numbers


def _data(seed=0):
    rng = np.random.default_rng(seed)
    X = jnp.asarray(rng.standard_normal((B, D)))
    labels = jnp.asarray(rng.integers(0, C, B))
    W = jnp.asarray(0.1 * rng.standard_normal((D, C)))
    V = jnp.asarray(rng.standard_normal((D, C)))
    return X, labels, W, V


def _loss(W, X, labels):
    z = X @ W
    return jnp.mean(jax.nn.logsumexp(z, axis=1) - jnp.sum(z * jax.nn.one_hot(labels, C), 1))


def _hvp(W, V, X, labels):  # forward over reverse: X W (primal) and X V (tangent) on one X
    return jax.jvp(lambda W_: jax.grad(_loss)(W_, X, labels), (W,), (V,))[1]


def _products(fn, *args) -> int:
    """dot_general equations of ``fn``'s jaxpr (nested jaxprs included)."""
    return str(jax.make_jaxpr(fn)(*args)).count("dot_general[")


def test_an_hvp_makes_its_two_forward_products_as_one():
    X, labels, W, V = _data()
    # the jaxpr: X W and X V forward, the tangent's backward product, and the primal gradient's
    # backward product, which is dead code (only the tangent is returned)
    assert _products(_hvp, W, V, X, labels) == 4
    rewritten = keep(_hvp)
    assert _products(rewritten, W, V, X, labels) == 2  # X [W, V], and the live backward one
    np.testing.assert_allclose(
        jax.jit(rewritten)(W, V, X, labels), _hvp(W, V, X, labels), rtol=1e-12, atol=1e-15
    )


def test_off_with_the_option():
    X, labels, W, V = _data()
    assert _products(keep(_hvp, merge_dots=False), W, V, X, labels) == 4


def test_shared_right_operand_and_batch_dimensions():
    """Backward products D_k^T X (the shared operand on the right) and vmapped (batched)
    products merge too, with the stacked axis put where each member's output expects it."""
    X, _, W, V = _data()
    D1, D2 = X @ W, X @ V  # (B, C) "cotangents"

    def backward(D1, D2, X):  # D^T X with D contracted on its leading axis, as reverse mode does
        dims = (((0,), (0,)), ((), ()))
        return jax.lax.dot_general(D1, X, dims) * 2.0, jax.lax.dot_general(D2, X, dims)

    rewritten = keep(backward)
    assert _products(rewritten, D1, D2, X) == 1
    for got, want in zip(jax.jit(rewritten)(D1, D2, X), backward(D1, D2, X), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)

    Xs, Ws, Vs = jnp.stack([X, 2 * X]), jnp.stack([W, -W]), jnp.stack([V, V + 1])  # two seeds
    pair = jax.vmap(lambda X, W, V: (X @ W, X @ V))  # batched products
    rewritten = keep(pair)
    assert _products(rewritten, Xs, Ws, Vs) == 1
    for got, want in zip(jax.jit(rewritten)(Xs, Ws, Vs), pair(Xs, Ws, Vs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_what_must_not_merge_does_not():
    X, _, W, V = _data()
    # the second product needs the first: they cannot run as one
    assert _products(keep(lambda X, W: X @ (W + (X @ W).sum())), X, W) == 2
    # matrix-vector products: stacked into an n = 2 matrix product they measured slower
    assert _products(keep(lambda X, u, v: (X @ u, X @ v)), X, W[:, 0], V[:, 0]) == 2
    # the shared operand is not the larger one: stacking the others would cost more
    big = jnp.ones((D, 4 * B))
    assert _products(keep(lambda X, P, Q: (X @ P, X @ Q)), X, big, big + 1) == 2
    # a product with a transposed partner (V^T X^T), which XLA may share with X V
    partner = lambda X, W, V: (X @ W, X @ V, jax.lax.dot_general(V.T, X, (((1,), (1,)), ((), ()))))  # noqa: E731
    assert _products(keep(partner), X, W, V) == 3


def test_a_loop_invariant_product_is_not_tied_to_one_that_changes():
    """In a loop whose W is constant, XLA hoists X W out of the loop; merged with X V_t it
    would run every iteration (AID's conjugate gradient)."""
    X, _, W, V = _data()

    def loop(X, W, V):
        def body(V, _):
            return V - 0.01 * (X.T @ ((X @ W) * (X @ V))), None

        return jax.lax.scan(body, V, None, length=3)[0]

    rewritten = keep(loop)
    assert _products(rewritten, X, W, V) == 3
    np.testing.assert_allclose(jax.jit(rewritten)(X, W, V), loop(X, W, V), rtol=1e-12)

    def loop_over_w(X, W, V):  # both change every iteration: merged
        def body(carry, _):
            W, V = carry
            return (0.9 * W, V - 0.01 * (X.T @ ((X @ W) * (X @ V)))), None

        return jax.lax.scan(body, (W, V), None, length=3)[0][1]

    rewritten = keep(loop_over_w)
    assert _products(rewritten, X, W, V) == 2
    np.testing.assert_allclose(jax.jit(rewritten)(X, W, V), loop_over_w(X, W, V), rtol=1e-12)


def test_simplify_shares_duplicates_drops_dead_code_keeps_effects():
    X, _, W, _ = _data()
    seen = []

    def program(X, W):
        unused = jnp.sin(X @ W)  # noqa: F841  (dead)
        a, b = jnp.exp(X) @ W, jnp.exp(X) @ W  # the same computation twice
        jax.debug.callback(lambda v: seen.append(float(v)), jnp.sum(a))
        return a + b

    jaxpr = jax.make_jaxpr(program)(X, W).jaxpr
    simple = dot_merge.simplify(jaxpr)
    names = [e.primitive.name for e in simple.eqns]
    assert names.count("exp") == 1 and names.count("dot_general") == 1 and "sin" not in names
    assert "debug_callback" in names
    out = jax.jit(keep(program))(X, W)
    np.testing.assert_allclose(out, program(X, W), rtol=1e-12)
    assert len(seen) == 2  # the eager call and the rewritten one: the callback still runs


def test_simplify_writes_products_as_xla_would_see_them():
    """A product by the literal 1, a ravel-unravel round trip and a transposed product
    ``(V^T X^T)^T`` (SOBA's cross derivative) all become ``X V``, shared with the one already
    there; the transposed weight gradient ``(D^T X)^T`` keeps its form (wide_dots keeps it
    wide)."""
    X, _, W, V = _data()

    def program(X, W, V, D):
        times_one = jax.lax.dot_general(1.0, V, (((), ()), ((), ())))
        unraveled = V.reshape(-1).reshape(V.shape)
        return X @ W, X @ V, (unraveled.T @ X.T).T, X @ times_one, (D.T @ X).T

    D = X @ W
    closed = jax.make_jaxpr(program)(X, W, V, D)
    simple = dot_merge.simplify(closed.jaxpr)
    dots = [e for e in simple.eqns if e.primitive.name == "dot_general"]
    assert [e.params["dimension_numbers"][0] for e in dots] == [((1,), (0,))] * 2 + [((0,), (0,))]
    assert simple.outvars[1] is simple.outvars[2] is simple.outvars[3]
    assert simple.eqns[-1].primitive.name == "transpose"  # (D^T X)^T: product, then transpose
    simplified = jax.core.eval_jaxpr(simple, closed.consts, X, W, V, D)
    for got, want in zip(simplified, program(X, W, V, D), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-13)


def test_sobas_forward_products_merge_on_data_cleaning():
    """SOBA's step on one minibatch: ``X W`` (gradient), ``X V`` (HVP tangent) and the cross
    derivative's ``(V^T X^T)^T``, which is ``X V`` again, run as one product ``X [W, V]``."""
    problem = _cleaning_like_problem()
    solver = bl.solvers.make("soba", lr_outer=0.01, batch_size=16).resolve(problem)
    state = solver.init(problem, jax.random.key(0))
    rewritten = keep(lambda s: solver.step(problem, s))
    hlo = jax.jit(rewritten).lower(state).compile().as_text()
    assert hlo.count(f"[16,{2 * C}]{{1,0}} dot(") == 1


def test_schedule_falls_back_when_groups_would_make_a_cycle():
    def program(X, W, V):
        a = X @ W  # group 1: a and d
        b = (X @ V).sum()  # group 2: b and c
        c = X @ (V * a.sum())  # c needs a
        d = X @ (W * b)  # d needs b: merging {a, d} and {b, c} would be a cycle
        return c, d

    X, _, W, V = _data()
    jaxpr = dot_merge.simplify(jax.make_jaxpr(program)(X, W, V).jaxpr)
    dots = [i for i, e in enumerate(jaxpr.eqns) if e.primitive.name == "dot_general"]
    a, b, c, d = dots
    order = dot_merge.schedule(jaxpr, [(a, d), (b, c)])
    assert order == [(i,) for i in range(len(jaxpr.eqns))]
    merged = dot_merge.schedule(jaxpr, [(a, d)])  # one group alone is fine
    assert (a, d) in merged and len(merged) == len(jaxpr.eqns) - 1


def test_stocbio_runs_the_same_with_and_without_merging():
    """A whole stocBiO run (its Neumann HVPs merge) with and without: the same iterates up to
    summation order (float64)."""
    from bilevel.drivers import programs

    problem = _cleaning_like_problem()  # 16 rows of 48 pixels, 3 classes
    solver = bl.solvers.make(
        "stocbio", lr_outer=0.01, batch_size=16, inner_steps=2, neumann_steps=3
    )
    results, products = {}, {}
    for merge in (True, False):
        programs.clear_cache()
        options = CpuRewrites(merge_dots=merge)
        results[merge] = bl.solve(
            problem, solver, steps=15, seed=2, progress=False, cpu_rewrites=options
        )
        ((_, chunk),) = programs.cached_programs("chunk")
        products[merge] = chunk.as_text().count(f"[16,{2 * C}]{{1,0}} dot(")
    # X [W, V], (16, 2 x 3): the Neumann HVP's, and the cross derivative's at the outer step
    assert products == {True: 2, False: 0}
    np.testing.assert_allclose(results[True].y, results[False].y, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(results[True].x, results[False].x, rtol=1e-9, atol=1e-12)


def test_a_transposed_product_used_elsewhere_too_is_not_computed_twice():
    X, _, _, V = _data()

    def program(X, V):
        product = V.T @ X.T  # P^T Q^T with P = V, Q = X
        return product, product.T

    simple = dot_merge.simplify(jax.make_jaxpr(program)(X, V).jaxpr)
    names = [e.primitive.name for e in simple.eqns]
    assert names.count("dot_general") == 1 and names.count("transpose") == 1

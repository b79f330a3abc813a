"""bilevel.drivers._xla_cpu.wide_dots: the barrier after wide, transposed products (values unchanged, barrier
where it belongs, every higher-order primitive rewritten, solve uses it on CPU)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bilevel as bl
from bilevel.drivers import run
from bilevel.drivers._xla_cpu import wide_dots

D, C, B = 48, 3, 16  # a linear layer with few outputs: its weight gradient is a wide product


def _data(seed=0, batch=B, dim=D, classes=C):
    """A minibatch ``X`` (batch, dim), its labels and weights ``W`` (dim, classes)."""
    rng = np.random.default_rng(seed)
    X = jnp.asarray(rng.standard_normal((batch, dim)))
    labels = jnp.asarray(rng.integers(0, classes, batch))
    W = jnp.asarray(0.1 * rng.standard_normal((dim, classes)))
    return X, labels, W


def _cross_entropies(W, X, labels):
    z = X @ W
    return jax.nn.logsumexp(z, axis=1) - jnp.sum(z * jax.nn.one_hot(labels, W.shape[1]), 1)


def _cross_entropy(W, X, labels):
    return jnp.mean(_cross_entropies(W, X, labels))


def _barriers(fn, *args) -> int:
    return str(jax.make_jaxpr(fn)(*args)).count("optimization_barrier")


def test_gradient_of_a_linear_layer_gets_one_barrier_and_same_values():
    X, labels, W = _data()
    grad = jax.grad(_cross_entropy)
    assert _barriers(grad, W, X, labels) == 0
    assert _barriers(wide_dots.keep_wide_dots(grad), W, X, labels) == 1
    np.testing.assert_allclose(
        jax.jit(wide_dots.keep_wide_dots(grad))(W, X, labels), grad(W, X, labels), rtol=1e-12
    )


def test_narrow_or_untransposed_products_are_left_alone():
    X, _, W = _data()
    assert _barriers(wide_dots.keep_wide_dots(lambda W, X: X @ W), W, X) == 0  # narrow output
    # wide but not transposed afterwards: nothing for XLA to fold
    assert _barriers(wide_dots.keep_wide_dots(lambda W, X: W.T @ X.T), W, X) == 0
    # wide and transposed, but its fold is the fast forward product X W: left to XLA
    cross = lambda W, X: jax.lax.dot_general(W.T, X, (((1,), (1,)), ((), ()))).T  # noqa: E731
    assert _barriers(wide_dots.keep_wide_dots(cross), W, X) == 0
    # batched products (vmapped seeds) are a different kernel: left alone
    Ws = jnp.stack([W, W])
    grads = jax.vmap(jax.grad(_cross_entropy), in_axes=(0, None, None))
    assert _barriers(wide_dots.keep_wide_dots(grads), Ws, X, jnp.zeros(B, int)) == 0


def test_rewrites_inside_scan_while_cond_and_custom_derivatives():
    X, labels, W = _data()
    grad = jax.grad(_cross_entropy)  # logsumexp: a custom_jvp call inside

    def program(W, flag):
        def body(W, _):
            return W - 0.1 * grad(W, X, labels), None

        W = jax.lax.scan(body, W, None, length=3)[0]
        W = jax.lax.fori_loop(0, 2, lambda i, W: W - 0.1 * grad(W, X, labels), W)
        W = jax.lax.cond(flag, lambda W: W - grad(W, X, labels), lambda W: W, W)
        return jax.jit(grad)(W, X, labels)

    rewritten = wide_dots.keep_wide_dots(program)
    assert _barriers(rewritten, W, True) == 4  # scan, while, cond's true branch, jit
    for flag in (True, False):
        np.testing.assert_allclose(
            jax.jit(rewritten)(W, flag), jax.jit(program)(W, flag), rtol=1e-10, atol=1e-14
        )


def test_callbacks_still_run():
    X, labels, W = _data()
    seen = []

    def program(W):
        g = jax.grad(_cross_entropy)(W, X, labels)
        jax.debug.callback(lambda v: seen.append(float(v)), jnp.sum(g))
        return g

    jax.block_until_ready(jax.jit(wide_dots.keep_wide_dots(program))(W))
    assert seen == pytest.approx([float(jnp.sum(jax.grad(_cross_entropy)(W, X, labels)))])


def test_falls_back_to_the_original_program_when_the_rewrite_fails(monkeypatch):
    X, labels, W = _data()
    grad = jax.grad(_cross_entropy)

    def broken(*args):
        raise NotImplementedError("a primitive the rewrite cannot re-bind")

    monkeypatch.setattr(wide_dots, "_evaluate", broken)
    rewritten = wide_dots.keep_wide_dots(grad)
    assert _barriers(rewritten, W, X, labels) == 0
    np.testing.assert_array_equal(jax.jit(rewritten)(W, X, labels), jax.jit(grad)(W, X, labels))


def _cleaning_like_problem(dim=D, classes=C):
    """Data hyper-cleaning on B random rows of ``dim`` pixels: y the (dim, classes) weights."""
    X, labels, _ = _data(1, dim=dim, classes=classes)
    n = X.shape[0]

    def inner(x, y, batch):
        weights = jax.nn.sigmoid(x[batch["index"]])
        ce = _cross_entropies(y, batch["X"], batch["label"])
        return jnp.mean(weights * ce) + 0.1 * jnp.sum(y**2)

    def outer(x, y, batch):
        return _cross_entropy(y, batch["X"], batch["label"])

    data = {"X": X, "label": labels, "index": jnp.arange(n)}
    return bl.BilevelProblem(
        outer=outer,
        inner=inner,
        x0=jnp.zeros(n),
        y0=jnp.zeros((dim, classes)),
        outer_data={"X": X, "label": labels},
        inner_data=data,
    )


def test_solve_compiles_its_chunk_through_the_rewrite_on_cpu(monkeypatch):
    problem = _cleaning_like_problem()
    solver = bl.solvers.make("f2sa", batch_size=8, inner_steps=2)
    results, narrow = {}, {}
    for setting in ("1", "0"):
        monkeypatch.setenv("BILEVEL_WIDE_DOTS", setting)
        assert wide_dots.enabled() == (setting == "1")
        run._COMPILED.clear()
        results[setting] = bl.solve(problem, solver, steps=20, seed=3, progress=False)
        chunks = [fn for key, fn in run._COMPILED.items() if key[0] == "chunk"]
        assert len(chunks) == 1
        # products with the weight's narrow (D, C) output, the shape XLA:CPU runs slowly
        narrow[setting] = chunks[0].as_text().count(f"[{D},{C}]{{1,0}} dot(")
    assert narrow == {"1": 0, "0": 3}  # F2SA's grad_y g at y and z, grad_y f at z
    assert not wide_dots.enabled(mesh=object())  # sharded programs are compiled as they are
    # the same run up to summation order
    np.testing.assert_allclose(results["1"].y, results["0"].y, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(results["1"].x, results["0"].x, rtol=1e-9, atol=1e-12)


def test_solve_online_compiles_its_rounds_through_the_rewrite():
    """solve_online's rounds program is one of the step programs rewritten on CPU (its cache key
    records whether it was)."""
    problem = bl.problems.drifting_quadratic(dx=2, dy=3, horizon=4)
    run._COMPILED.clear()
    bl.solve_online(problem, bl.solvers.make("f2obo"), eval_every=4, progress=False)
    rewritten = [key[-1] for key in run._COMPILED if key[0] == run.ONLINE_ROUNDS]
    assert rewritten == [True]

"""``_xla_cpu.wide_dots``: the barrier after wide, transposed products (values unchanged,
barrier where it belongs, every higher-order primitive rewritten, solve uses it on CPU)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bilevel as bl
from bilevel.drivers import _xla_cpu, cpu_rewrites
from bilevel.drivers._xla_cpu import evaluate
from bilevel.drivers.cpu_rewrites import CpuRewrites

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


def keep(fn, **options):
    """``fn`` through the CPU rewrites (all on, unless ``options`` turn some off)."""
    return _xla_cpu.rewrite(fn, CpuRewrites(**options))


def test_gradient_of_a_linear_layer_gets_one_barrier_and_same_values():
    X, labels, W = _data()
    grad = jax.grad(_cross_entropy)
    assert _barriers(grad, W, X, labels) == 0
    assert _barriers(keep(grad), W, X, labels) == 1
    np.testing.assert_allclose(jax.jit(keep(grad))(W, X, labels), grad(W, X, labels), rtol=1e-12)


def test_narrow_or_untransposed_products_are_left_alone():
    X, _, W = _data()
    assert _barriers(keep(lambda W, X: X @ W), W, X) == 0  # narrow output
    # wide but not transposed afterwards: nothing for XLA to fold
    assert _barriers(keep(lambda W, X: W.T @ X.T), W, X) == 0
    # wide and transposed, but its fold is the fast forward product X W: left to XLA
    cross = lambda W, X: jax.lax.dot_general(W.T, X, (((1,), (1,)), ((), ()))).T  # noqa: E731
    assert _barriers(keep(cross), W, X) == 0
    # batched products (vmapped seeds) are a different kernel: left alone
    Ws = jnp.stack([W, W])
    grads = jax.vmap(jax.grad(_cross_entropy), in_axes=(0, None, None))
    assert _barriers(keep(grads), Ws, X, jnp.zeros(B, int)) == 0


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

    rewritten = keep(program)
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

    jax.block_until_ready(jax.jit(keep(program))(W))
    assert seen == pytest.approx([float(jnp.sum(jax.grad(_cross_entropy)(W, X, labels)))])


def test_falls_back_to_the_original_program_when_the_rewrite_fails(monkeypatch):
    X, labels, W = _data()
    grad = jax.grad(_cross_entropy)

    def broken(*args, **kwargs):
        raise NotImplementedError("a primitive the rewrite cannot re-bind")

    monkeypatch.setattr(cpu_rewrites, "_WARNED", set())
    monkeypatch.setattr(evaluate.Rewriter, "evaluate", broken)
    rewritten = keep(grad)
    with pytest.warns(cpu_rewrites.CpuRewriteWarning, match="compiled as traced"):
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


def test_solve_compiles_its_chunk_through_the_rewrite_on_cpu():
    from bilevel.drivers import programs

    problem = _cleaning_like_problem()
    solver = bl.solvers.make("f2sa", lr_outer=0.01, batch_size=8, inner_steps=2)
    results, narrow = {}, {}
    for name, options in (("on", CpuRewrites()), ("off", CpuRewrites.none())):
        programs.clear_cache()
        results[name] = bl.solve(
            problem, solver, steps=20, seed=3, progress=False, cpu_rewrites=options
        )
        ((spec, chunk),) = programs.cached_programs("chunk")
        assert spec.cpu_rewrites == options and spec.rewritten == (name == "on")
        # products with the weight's narrow (D, C) output, the shape XLA:CPU runs slowly
        narrow[name] = chunk.as_text().count(f"[{D},{C}]{{1,0}} dot(")
    assert narrow == {"on": 0, "off": 3}  # F2SA's grad_y g at y and z, grad_y f at z
    assert not _xla_cpu.applies(CpuRewrites(), mesh=object())  # sharded: compiled as they are
    assert not _xla_cpu.applies(CpuRewrites.none())
    # the same run up to summation order
    np.testing.assert_allclose(results["on"].y, results["off"].y, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(results["on"].x, results["off"].x, rtol=1e-9, atol=1e-12)


def test_solve_online_compiles_its_rounds_through_the_rewrite():
    """solve_online's rounds program is one of the step programs rewritten on CPU (its cache
    entry records whether it was)."""
    from bilevel.drivers import programs

    problem = bl.problems.drifting_quadratic(dx=2, dy=3, horizon=4)
    programs.clear_cache()
    bl.solve_online(problem, bl.solvers.make("f2obo"), eval_every=4, progress=False)
    rounds = programs.cached_programs(programs.ONLINE_ROUNDS)
    assert [spec.rewritten for spec, _ in rounds] == [True]

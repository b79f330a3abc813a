"""The CPU rewrites as options (``bl.CpuRewrites``): what each option applies, the tested JAX
window and the environment's defaults, and every fallback -- a rewrite that raises is dropped
alone (one warning), a program that fails to compile or changes its output types is compiled
as traced -- with the values of the unrewritten program."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_carry_layout import _loop_carries
from test_wide_dots import _cross_entropy, keep

from bilevel.drivers import _xla_cpu, cpu_rewrites
from bilevel.drivers._xla_cpu import carry_layout, dot_merge, small_dots, unrolled_keys, wide_dots
from bilevel.drivers.cpu_rewrites import CpuRewrites, CpuRewriteWarning

D, C, B = 256, 8, 64  # a narrow (D, C) weight matrix; the batch holds 8 times its numbers
NAMES = ("wide_dots", "merge_dots", "carry_layout", "small_dots", "unrolled_keys")


def _data():
    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.standard_normal((B, D)))
    labels = jnp.asarray(rng.integers(0, C, B))
    W = jnp.asarray(0.1 * rng.standard_normal((D, C)))
    V = jnp.asarray(rng.standard_normal((D, C)))
    A, u = jnp.asarray(rng.standard_normal((4, 4))), jnp.asarray(rng.standard_normal((3, 4)))
    return X, labels, W, V, A, u


def _program():
    """A program with something for each rewrite, and its arguments: gradient steps on a
    narrow weight matrix in a loop (carried transposed; its weight gradients wide products
    behind barriers), an HVP (its two forward products merged), small vmapped products and a
    key split."""
    X, labels, W, V, A, u = _data()
    grad = jax.grad(_cross_entropy)

    def program(W, V, u, key):
        hvp = jax.jvp(lambda W_: grad(W_, X, labels), (W,), (V,))[1]
        W = jax.lax.fori_loop(0, 2, lambda i, W: W - 0.1 * grad(W, X, labels), W)
        small = jax.vmap(lambda v: A @ v)(u)
        return W, hvp, small, jax.random.key_data(jax.random.split(key, 3))

    return program, (W, V, u, jax.random.key(0))


def _applied(fn, args) -> set[str]:
    """The rewrites that show in ``fn``'s jaxpr (for :func:`_program`)."""
    text = str(jax.make_jaxpr(fn)(*args))
    shown = {
        "wide_dots": "optimization_barrier" in text,
        "merge_dots": f"f64[{B},2,{C}] = dot_general" in text,  # X [W, V]
        "carry_layout": [(), (C, D)] in _loop_carries(fn, *args),  # (counter, W^T)
        "small_dots": "f64[4,3] = dot_general" not in text,  # the vmapped A @ v
        "unrolled_keys": "random_split" not in text,
    }
    return {name for name, on in shown.items() if on}


def _same_values(fn, program, args):
    for got, want in zip(jax.jit(fn)(*args), jax.jit(program)(*args), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Warnings not yet given in this process (they are given once each)."""
    monkeypatch.setattr(cpu_rewrites, "_WARNED", set())


def test_each_option_selects_its_rewrite():
    program, args = _program()
    assert _applied(program, args) == set()
    assert _applied(keep(program), args) == set(NAMES)
    assert _applied(_xla_cpu.rewrite(program, CpuRewrites.none()), args) == set()
    for name in NAMES:
        assert _applied(keep(program, **{name: False}), args) == set(NAMES) - {name}, name
        alone = CpuRewrites(**{other: other == name for other in NAMES})
        assert _applied(_xla_cpu.rewrite(program, alone), args) == {name}, name
    _same_values(keep(program), program, args)


def test_small_dots_off_leaves_small_products_as_dot_general():
    A, u = _data()[4:]
    fn = jax.vmap(lambda v: A @ v)
    assert "dot_general" in str(jax.make_jaxpr(keep(fn, small_dots=False))(u))
    assert "dot_general" not in str(jax.make_jaxpr(keep(fn))(u))


#: for each rewrite, a function of its module that only it calls
BREAK = {
    "wide_dots": (wide_dots, "transposed_vars"),
    "merge_dots": (dot_merge, "simplify"),
    "carry_layout": (carry_layout, "loop_carries"),
    "small_dots": (small_dots, "multiply_reduce"),
    "unrolled_keys": (unrolled_keys, "evaluate"),
}


@pytest.mark.parametrize("name", NAMES)
def test_a_failing_rewrite_is_left_off_alone_with_one_warning(monkeypatch, fresh_warnings, name):
    program, args = _program()
    without = str(jax.make_jaxpr(keep(program, **{name: False}))(*args))

    def broken(*_, **__):
        raise NotImplementedError("a primitive this rewrite does not know")

    monkeypatch.setattr(*BREAK[name], broken)
    with pytest.warns(CpuRewriteWarning, match=f"{name!r} failed") as record:
        rewritten = keep(program)
        assert str(jax.make_jaxpr(rewritten)(*args)) == without  # the others all applied
        assert _applied(rewritten, args) == set(NAMES) - {name}
        _same_values(rewritten, program, args)  # compiled: traced once more
    assert len(record) == 1  # once per process, not on every program
    assert "NotImplementedError" in str(record[0].message)


def test_a_warning_filter_that_raises_does_not_fail_the_program(monkeypatch, fresh_warnings):
    """The suite turns warnings into errors; a fallback still runs (its warning dropped)."""
    program, args = _program()
    monkeypatch.setattr(small_dots, "multiply_reduce", lambda *a, **k: 1 / 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rewritten = keep(program)
        assert _applied(rewritten, args) == set(NAMES) - {"small_dots"}
    _same_values(rewritten, program, args)


def test_a_checkpointed_model_gets_the_barrier():
    """``jax.checkpoint`` puts the backward pass in a ``remat`` equation's jaxpr: rewritten
    like any other jaxpr parameter."""
    X, labels, W = _data()[:3]
    grad = jax.grad(jax.checkpoint(_cross_entropy))
    jaxpr = jax.make_jaxpr(keep(grad))(W, X, labels).jaxpr
    (remat,) = [e for e in jaxpr.eqns if e.primitive.name.startswith("remat")]
    assert "optimization_barrier" in str(remat.params["jaxpr"])
    assert "optimization_barrier" not in str(jax.make_jaxpr(grad)(W, X, labels))
    np.testing.assert_allclose(
        jax.jit(keep(grad))(W, X, labels), grad(W, X, labels), rtol=1e-12, atol=1e-15
    )


def _linear_layer_step():
    X, labels, W = _data()[:3]
    return jax.grad(_cross_entropy), (W, X, labels)


def _narrow_products(compiled) -> int:
    """Products with the weight's narrow output in compiled code: the barrier keeps the weight
    gradient's product wide (``test_wide_dots``)."""
    return compiled.as_text().count(f"f64[{D},{C}]{{1,0}} dot(")


def test_a_rewritten_program_that_fails_to_compile_is_compiled_as_traced(
    monkeypatch, fresh_warnings
):
    raw, args = _linear_layer_step()
    assert _narrow_products(_xla_cpu.compile_step(raw, CpuRewrites(), args)) == 0
    compile_ = jax.stages.Lowered.compile
    calls = []

    def first_fails(self, *a, **k):  # the rewritten program is compiled first
        calls.append(self)
        if len(calls) == 1:
            raise RuntimeError("XLA:CPU could not compile it")
        return compile_(self, *a, **k)

    monkeypatch.setattr(jax.stages.Lowered, "compile", first_fails)
    with pytest.warns(CpuRewriteWarning, match="failed to lower or compile") as record:
        compiled = _xla_cpu.compile_step(raw, CpuRewrites(), args)
    assert len(record) == 1 and len(calls) == 2
    assert _narrow_products(compiled) == 1  # compiled as traced
    np.testing.assert_array_equal(compiled(*args), jax.jit(raw)(*args))


def test_a_rewritten_program_that_fails_to_lower_is_compiled_as_traced(monkeypatch, fresh_warnings):
    raw, args = _linear_layer_step()

    def failing(fn, options):
        def traced(*args):
            raise RuntimeError("cannot lower")

        return traced

    monkeypatch.setattr(_xla_cpu, "rewrite", failing)
    with pytest.warns(CpuRewriteWarning, match="failed to lower or compile"):
        compiled = _xla_cpu.compile_step(raw, CpuRewrites(), args)
    np.testing.assert_array_equal(compiled(*args), jax.jit(raw)(*args))


@pytest.mark.parametrize(
    "change",
    [lambda x: x[None], lambda x: x.astype(jnp.float32), lambda x: (x, x)],
    ids=["shape", "dtype", "structure"],
)
def test_a_rewritten_program_with_other_output_types_is_compiled_as_traced(
    monkeypatch, fresh_warnings, change
):
    raw, args = _linear_layer_step()
    monkeypatch.setattr(_xla_cpu, "rewrite", lambda fn, options: lambda *a: change(fn(*a)))
    with pytest.warns(CpuRewriteWarning, match="changed its output shapes or dtypes"):
        compiled = _xla_cpu.compile_step(raw, CpuRewrites(), args)
    out = compiled(*args)
    assert out.dtype == jnp.float64 and out.shape == (D, C)
    np.testing.assert_array_equal(out, jax.jit(raw)(*args))


def test_options_are_hashable_and_resolved():
    assert len({CpuRewrites(), CpuRewrites(), CpuRewrites(small_dots=False)}) == 2
    assert CpuRewrites().any and not CpuRewrites.none().any
    assert CpuRewrites().without("merge_dots") == CpuRewrites(merge_dots=False)
    assert cpu_rewrites.resolve(False) == CpuRewrites.none()
    assert cpu_rewrites.resolve(True) == cpu_rewrites.resolve(None) == CpuRewrites.default()
    options = CpuRewrites(carry_layout=False)
    assert cpu_rewrites.resolve(options) is options
    with pytest.raises(TypeError, match="cpu_rewrites must be"):
        cpu_rewrites.resolve("on")


@pytest.mark.parametrize(
    "version, inside",
    [("0.10.0", True), ("0.10.2", True), ("0.10.9rc1", True), ("0.10.3.dev20260101", True)]
    + [("0.9.9", False), ("0.11", False), ("0.11.0", False), ("1.0.0", False)],
)
def test_the_tested_jax_window(version, inside):
    assert cpu_rewrites.in_tested_window(version) == inside


@pytest.fixture
def environment(monkeypatch, fresh_warnings):
    """No ``BILEVEL_*`` switch set, and the defaults computed anew (``monkeypatch`` sets them
    and the version the module reads)."""
    for variable in cpu_rewrites.ENVIRONMENT.values():
        monkeypatch.delenv(variable, raising=False)
    cpu_rewrites._defaults.cache_clear()
    yield monkeypatch
    cpu_rewrites._defaults.cache_clear()  # then monkeypatch restores the environment


def test_outside_the_jax_window_all_off_with_one_warning(environment):
    environment.setattr(cpu_rewrites, "JAX_VERSION", "0.11.1")
    match = r"JAX 0\.11\.1 is outside .* cpu_rewrites=bl\.CpuRewrites\(\)"
    with pytest.warns(CpuRewriteWarning, match=match) as record:
        assert CpuRewrites.default() == CpuRewrites.none()
        assert cpu_rewrites.resolve(None) == CpuRewrites.none()
        cpu_rewrites._defaults.cache_clear()
        assert CpuRewrites.default() == CpuRewrites.none()  # computed again: no new warning
    assert len(record) == 1
    assert "BILEVEL_WIDE_DOTS=1" in str(record[0].message)
    assert not _xla_cpu.applies(CpuRewrites.default())
    assert cpu_rewrites.resolve(CpuRewrites()) == CpuRewrites()  # asked for: on


def test_the_environment_sets_the_defaults_once(environment):
    outside, inside = "0.12.0", "0.10.2"
    cases = [
        (inside, {}, CpuRewrites()),
        (inside, {"BILEVEL_WIDE_DOTS": "0"}, CpuRewrites.none()),
        (inside, {"BILEVEL_WIDE_DOTS": "0", "BILEVEL_SMALL_DOTS": "1"}, CpuRewrites.none()),
        (inside, {"BILEVEL_MERGE_DOTS": "0"}, CpuRewrites(merge_dots=False)),
        (inside, {"BILEVEL_UNROLLED_KEYS": "0"}, CpuRewrites(unrolled_keys=False)),
        (outside, {"BILEVEL_WIDE_DOTS": "1"}, CpuRewrites()),
        (outside, {"BILEVEL_WIDE_DOTS": "1", "BILEVEL_CARRY_LAYOUT": "0"},
         CpuRewrites(carry_layout=False)),
        (outside, {"BILEVEL_SMALL_DOTS": "1"}, CpuRewrites(*[n == "small_dots" for n in NAMES])),
    ]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an explicit switch: no warning
        for version, switches, expected in cases:
            environment.setattr(cpu_rewrites, "JAX_VERSION", version)
            for variable in cpu_rewrites.ENVIRONMENT.values():
                environment.delenv(variable, raising=False)
            for variable, value in switches.items():
                environment.setenv(variable, value)
            cpu_rewrites._defaults.cache_clear()
            assert CpuRewrites.default() == expected, (version, switches)
    environment.setenv("BILEVEL_WIDE_DOTS", "0")
    assert CpuRewrites.default() == expected  # read once: later changes do not count

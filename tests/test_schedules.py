"""One step-size dialect: :func:`bl.schedules.step_size` on floats, on the papers' regimes,
on Python and optax schedules (under jit, with the int32 count), and end to end in solvers."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import bilevel as bl
from bilevel.core.schedules import as_schedule, constant, inverse_power, step_size
from bilevel.solvers.hypergradient.bsa import BSA_REGIMES
from bilevel.solvers.hypergradient.ttsa import TTSA_REGIMES
from bilevel.solvers.penalty.f2sa import F2SA_REGIMES

FLOAT = jnp.result_type(float)  # float64: conftest turns x64 on


def test_a_float_is_a_constant_float_array():
    for k in (0, 7, jnp.int32(7), 7.0):
        value = step_size(0.1, k)
        assert isinstance(value, jax.Array) and value.dtype == FLOAT and value.shape == ()
        assert float(value) == 0.1
    assert float(step_size(3, 5)) == 3.0  # an int step size is a float too
    # power 0 is constant whatever k0 is
    assert float(step_size(0.1, 1000, 0.0, 7.0)) == 0.1


@pytest.mark.parametrize(
    "power",
    # the papers' orders: TTSA/BSA/STABLE 1 and 2/3, F2SA/F3SA's a and c
    sorted(
        {
            p
            for table in (TTSA_REGIMES, BSA_REGIMES, F2SA_REGIMES)
            for ab in table.values()
            for p in ab
        }
        | {1.0}
    ),
)
def test_the_power_law_regimes(power):
    """value_k = value (k0 / (k + k0))^power: value at k = 0, order k^-power for k >> k0."""
    k, k0, value = np.arange(0, 5000, 7), 100.0, 0.3
    got = np.broadcast_to(step_size(value, jnp.asarray(k, jnp.int32), power, k0), k.shape)
    np.testing.assert_allclose(got, value * (k0 / (k + k0)) ** power, rtol=1e-14)
    assert got[0] == value
    assert np.all(np.diff(got) <= 0)
    # the same numbers as the schedule object of the family
    schedule = inverse_power(value, power, k0)
    np.testing.assert_array_equal(
        np.broadcast_to(schedule(jnp.asarray(k, jnp.int32)), k.shape), got
    )


def test_floats_power_and_k0_may_be_traced():
    """Solvers pass their float fields (step sizes, F2SA's a and c, k0) as jit arguments: the
    helper does traced arithmetic only (no Python ``if`` or ``float()`` on them)."""
    fn = jax.jit(step_size)
    for k in range(0, 50, 7):
        want = 0.2 * (10.0 / (k + 10.0)) ** 0.5
        np.testing.assert_allclose(fn(0.2, jnp.int32(k), 0.5, 10.0), want, rtol=1e-15)
    # traced power 0 (F2SA's c = 0.0) is constant, too
    assert float(fn(0.2, jnp.int32(40), 0.0, 10.0)) == 0.2


def test_a_python_schedule_is_called_with_k():
    seen = []

    def schedule(k):
        seen.append(k)
        return 1.0 / (k + 1.0)

    assert float(step_size(schedule, 3)) == 0.25
    assert seen == [3]  # called with k as given, once; power and k0 do not apply to it
    assert float(step_size(schedule, 3, 1.0, 5.0)) == 0.25


@pytest.mark.parametrize(
    "schedule",
    [
        optax.exponential_decay(init_value=0.1, transition_steps=10, decay_rate=0.5),
        optax.exponential_decay(0.1, 10, 0.5, staircase=True),
        optax.cosine_decay_schedule(init_value=0.1, decay_steps=100),
        optax.piecewise_constant_schedule(0.1, {20: 0.5, 60: 0.2}),
    ],
)
def test_an_optax_schedule_under_jit_with_a_traced_int32_count(schedule):
    fn = jax.jit(lambda k: step_size(schedule, k))
    for k in (0, 1, 9, 10, 11, 55, 150):
        got = fn(jnp.asarray(k, jnp.int32))
        assert jnp.issubdtype(got.dtype, jnp.floating)
        # the helper passes the schedule's value through unchanged (an int32 count may give
        # float32 values under x64, since optax divides it by an int: hence rtol 1e-6 below)
        np.testing.assert_array_equal(got, jax.jit(schedule)(jnp.asarray(k, jnp.int32)))
        np.testing.assert_allclose(got, schedule(k), rtol=1e-6)


def test_constant_and_as_schedule_go_through_the_helper():
    assert float(constant(0.5)(jnp.int32(9))) == 0.5
    assert float(as_schedule(0.5)(3)) == 0.5
    fn = lambda k: 2.0 * k  # noqa: E731
    assert as_schedule(fn) is fn
    with pytest.raises(ValueError, match="k0"):
        inverse_power(0.1, 1.0, 0.0)


# ---- end to end: an optax schedule in a solver is the Python function it computes ------------
def _exponential(k):  # optax.exponential_decay(0.05, 10, 0.5), written out
    return jnp.where(k - 0 <= 0, 0.05, 0.05 * jnp.power(0.5, (k - 0) / 10))


def _cosine(k):  # optax.cosine_decay_schedule(0.1, 100), written out
    k = jnp.minimum(k, 100.0)
    return 0.1 * ((1 - 0.0) * (0.5 * (1 + jnp.cos(jnp.pi * k / 100.0))) ** 1.0 + 0.0)


@pytest.mark.parametrize("name", ["stocbio", "f2sa", "ttsa"])
def test_solvers_take_optax_schedules_bit_for_bit(name):
    """stocBiO calls a schedule with the int32 count, F2SA and TTSA with it as a float: an optax
    schedule and the same schedule as a Python function give the same run, to the last bit."""
    quad = bl.problems.quadratic(dx=3, dy=4)

    def run(lr_outer, lr_inner, **options):
        extra = {"stocbio": {"neumann_lr": 0.1}, "ttsa": {"neumann_lr": 0.1}}.get(name, {})
        solver = bl.solvers.make(name, lr_outer=lr_outer, lr_inner=lr_inner, **extra | options)
        res = bl.solve(quad, solver, steps=30, eval_every=10, progress=False)
        return np.asarray(res.x), res.history.grad_norm.to_numpy()

    optax_run = run(optax.exponential_decay(0.05, 10, 0.5), optax.cosine_decay_schedule(0.1, 100))
    python_run = run(_exponential, _cosine)
    np.testing.assert_array_equal(optax_run[0], python_run[0])
    np.testing.assert_array_equal(optax_run[1], python_run[1])
    # and a constant schedule is a float that does not decay (F2SA's floats decay by its
    # regime unless a = c = 0; stocBiO's and TTSA's default regime is constant)
    fixed = {"a": 0.0, "c": 0.0} if name == "f2sa" else {}
    const = run(optax.constant_schedule(0.05), optax.constant_schedule(0.1), **fixed)
    np.testing.assert_array_equal(const[0], run(0.05, 0.1, **fixed)[0])

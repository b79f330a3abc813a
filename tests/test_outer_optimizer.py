"""``outer_optimizer``: the names, any optax transformation without a learning rate, and a
checkpoint signature that does not depend on where a function object lives in memory."""

import numpy as np
import optax
import pytest

import bilevel as bl
from bilevel.drivers.checkpoints import signature as _signature


@pytest.fixture(scope="module")
def quad():
    return bl.problems.quadratic(dx=3, dy=4)


def _run(problem, outer_optimizer):
    solver = bl.solvers.make("f2sa", lr_outer=0.05, lr_inner=0.1, outer_optimizer=outer_optimizer)
    return np.asarray(bl.solve(problem, solver, steps=50, progress=False).x)


def test_an_optax_transformation_is_an_outer_optimizer(quad):
    adam = _run(quad, "adam")
    np.testing.assert_array_equal(_run(quad, optax.scale_by_adam()), adam)  # "adam" is this
    assert not np.array_equal(_run(quad, optax.scale_by_adam(b1=0.5)), adam)  # and it is used
    np.testing.assert_array_equal(_run(quad, optax.trace(decay=0.9)), _run(quad, "momentum"))


def test_an_unknown_outer_optimizer_names_the_choices():
    with pytest.raises(ValueError, match=r"outer_optimizer='rmsprop'\) is unknown.*optax"):
        bl.solvers.make("f2sa", outer_optimizer="rmsprop")


def _schedule():
    return lambda k: 0.05 / (1.0 + k) ** 0.5


def test_checkpoint_signature_ignores_function_addresses(quad):
    """Two equal schedules are two function objects (as in two processes): same run."""
    first, second = (bl.solvers.make("f2sa", lr_outer=_schedule()) for _ in range(2))
    assert repr(first) != repr(second)  # the reprs hold the addresses
    assert _signature(quad, first, [0], False, 10) == _signature(quad, second, [0], False, 10)
    other = bl.solvers.make("f2sa", lr_outer=_schedule(), lam0=3.0)
    assert _signature(quad, first, [0], False, 10) != _signature(quad, other, [0], False, 10)


def test_checkpoint_signature_sees_what_a_function_closed_over(quad):
    """Functions print alike whatever they closed over: optax.trace(decay=0.5) and (decay=0.9),
    or two exponential decays, must still be two runs."""

    def sig(**fields):
        return _signature(quad, bl.solvers.make("pzobo", lr_inner=0.1, **fields), [0], False, 10)

    assert sig(outer_optimizer=optax.trace(decay=0.5)) != sig(
        outer_optimizer=optax.trace(decay=0.9)
    )
    assert sig(inner_optimizer=optax.scale_by_adam(b1=0.5)) != sig(
        inner_optimizer=optax.scale_by_adam()
    )
    assert sig(lr_outer=optax.exponential_decay(0.1, 10, 0.5)) != sig(
        lr_outer=optax.exponential_decay(0.1, 10, 0.9)
    )
    # equal ones (two objects, as in two processes) are one run
    assert sig(outer_optimizer=optax.trace(decay=0.5)) == sig(
        outer_optimizer=optax.trace(decay=0.5)
    )
    assert sig(lr_outer=optax.exponential_decay(0.1, 10, 0.5)) == sig(
        lr_outer=optax.exponential_decay(0.1, 10, 0.5)
    )

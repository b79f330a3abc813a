"""Step-size schedules: a schedule is any function ``k -> step`` of the (traced) iteration count.

Floats mean constant steps. Optax schedules (``optax.exponential_decay(...)``) are plain
functions of the step count too, so they can be passed wherever a step size is accepted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

Schedule = Callable[[Any], Any]

__all__ = ["Schedule", "constant", "inverse_power", "as_schedule", "check_step_size"]


def constant(value: Any) -> Schedule:
    """``k -> value`` (a number or a traced scalar: ``solve`` passes step sizes as arguments)."""
    return lambda k: jnp.asarray(value, dtype=jnp.result_type(float))


def inverse_power(init: float, power: float, k0: float) -> Schedule:
    """``k -> init * (k0 / (k + k0)) ** power``: the ``c / (k + k0)^a`` family of the papers.

    Written with ``init`` = the value at k = 0, so ``c = init * k0 ** power``.
    """
    if k0 <= 0:
        raise ValueError(f"inverse_power(k0=...) must be > 0, got {k0}.")
    return lambda k: init * (k0 / (k + k0)) ** power


def check_step_size(value: Any, name: str) -> None:
    """Raise a clear error for a zero, negative or non-finite step size (or a non-callable)."""
    if callable(value):
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(
            f"{name} must be a positive float or a schedule k -> step, got {type(value).__name__}."
        )
    if not (value > 0 and value < float("inf")):
        raise ValueError(f"{name} must be a positive finite step size, got {value}.")


def as_schedule(value: float | Schedule) -> Schedule:
    """A float becomes a constant schedule; a callable is returned as is."""
    return value if callable(value) else constant(value)

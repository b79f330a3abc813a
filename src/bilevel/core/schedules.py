"""Step sizes: one dialect for every solver.

A step-size field is a float or a *schedule* ``k -> value`` of the (traced) iteration count:
any Python function or optax schedule (``optax.exponential_decay(...)``,
``optax.cosine_decay_schedule(...)``; they take the int32 step count). Every solver turns such
a field into its value at iteration k with ONE helper, :func:`step_size`, which also carries
the papers' decaying regimes: a float is the k = 0 value of

    value_k = value * (k0 / (k + k0)) ** power,

the ``c / (k + k0)^a`` family of the stochastic-approximation analyses (``c = value k0^a``):

* Ghadimi & Wang, "Approximation Methods for Bilevel Programming" (arXiv:1802.02246, 2018),
  strongly convex case (BSA): alpha_k ~ 1/(k + k0), power 1 (the library's BSA also decays its
  inner step as 1/(k + k0) in place of the paper's growing inner loop);
* Hong, Wai, Wang, Yang, "A Two-Timescale Stochastic Algorithm Framework for Bilevel
  Optimization" (SIAM J. Optim. 2023), strongly convex case (TTSA): alpha_k ~ 1/(k + k0),
  beta_k ~ (k + k0)^(-2/3);
* Chen, Sun, Xiao, Yin, "A Single-Timescale Method for Stochastic Bilevel Optimization"
  (AISTATS 2022), Theorem 3, eq. (30a) (STABLE, strongly convex): alpha_k, beta_k, tau_k ~
  1/(K_0 + k);
* Kwon, Kwon, Wright, Nowak, "A Fully First-Order Method for Stochastic Bilevel Optimization"
  (ICML 2023), eqs. (5)-(7) with Corollary 4.2 (F2SA: alpha_k ~ k^-a, gamma_k ~ k^-c) and
  eq. (9a) with Corollary 4.4 (F3SA).

``power = 0`` is a constant step (the nonconvex theorems' K-dependent constants).

A float step size is a traced leaf of the solver pytree (a grid of step sizes compiles once),
so :func:`step_size` only does traced arithmetic on it: no Python ``if`` or ``float()``.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

Schedule = Callable[[Any], Any]

__all__ = [
    "Schedule",
    "step_size",
    "round_step_size",
    "constant",
    "inverse_power",
    "as_schedule",
    "check_step_size",
    "TracedSchedule",
    "TailDecay",
]


def step_size(value: Any, k: Any, power: Any = 0.0, k0: Any = 1.0) -> jax.Array:
    """The step size ``value`` at iteration ``k``: the one conversion every solver uses.

    Args:
        value: a schedule (any callable ``k -> step``: a Python function or an optax schedule),
            returned as ``value(k)``; or a float (a number, or a traced scalar: solvers pass
            their float fields as jit arguments), the value at k = 0 of
            ``value * (k0 / (k + k0)) ** power``.
        k: the iteration count, passed to a schedule as given (the solver's int32 ``state.k``,
            which optax schedules expect; a few solvers pass it as a float, as they always
            have); converted to a float for the power law.
        power: the decay order a of ``(k + k0)^-a``: 0 (default) is a constant step, 1 the
            ``1/(k + k0)`` of the strongly convex analyses (Ghadimi & Wang 2018; Hong et al.
            2023; Chen et al. 2022, eq. (30a)); 2/3, 5/7, ... the other orders of the module
            docstring. A number or a traced scalar (F2SA's ``a`` and ``c`` fields).
        k0: the offset k_0 > 0 (a number or a traced scalar); unused when ``power`` is 0.

    Returns:
        A float array of the default float dtype; for a schedule, ``value(k)`` as it returns it
        (converting it could change the dtype a user's schedule chose for its steps).
    """
    if isinstance(value, TailDecay):  # the tail factor times the method's own decay
        return value.factor_at(k) * step_size(value.value, k, power, k0)
    if callable(value):
        return value(k)
    if isinstance(power, int | float) and power == 0:  # a constant: no decay factor to compute
        return jnp.asarray(value, dtype=jnp.result_type(float))
    kf = jnp.asarray(k, dtype=jnp.result_type(float))
    return value * (k0 / (kf + k0)) ** power


def round_step_size(value: Any, t: Any, power: Any = 0.0) -> jax.Array:
    """The step size ``value`` at round ``t = 1, 2, ...`` of an online method.

    A schedule is called with the round ``t`` itself (the traced int32 of the solver's state);
    a float is ``value * t ** -power``, the ``gamma_t ~ t^-tau`` of the online analyses (Jia &
    Chen, arXiv:2602.11665, Theorem 3.2), which is :func:`step_size` at ``k = t - 1``, ``k0 = 1``
    (so ``value`` is the step of round 1).
    """
    if callable(value):
        return value(t)
    return step_size(value, jnp.asarray(t) - 1, power, 1.0)


def constant(value: Any) -> Schedule:
    """``k -> value`` (a number or a traced scalar: ``solve`` passes step sizes as arguments)."""
    return lambda k: step_size(value, k)


def inverse_power(init: float, power: float, k0: float) -> Schedule:
    """``k -> init * (k0 / (k + k0)) ** power``: the ``c / (k + k0)^a`` family of the papers
    (module docstring), as a schedule object; :func:`step_size`'s formula.

    Written with ``init`` = the value at k = 0, so ``c = init * k0 ** power``.
    """
    if k0 <= 0:
        raise ValueError(f"inverse_power(k0=...) must be > 0, got {k0}.")
    return lambda k: step_size(init, k, power, k0)


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


class TracedSchedule(abc.ABC):
    """A schedule object whose numbers are pytree leaves (subclasses register themselves with
    ``jax.tree_util.register_dataclass``).

    A solver carries a plain callable in its static treedef, so two solvers whose schedules
    differ only in numbers compile two programs; it carries a ``TracedSchedule`` as leaves, so
    they share one (e.g. IBCG's ``"last-iterate"`` gamma for every horizon K). ``__call__`` must
    then use traced arithmetic only (no ``float()`` or Python ``if`` on its fields).
    """

    @abc.abstractmethod
    def __call__(self, k: Any) -> jax.Array:
        """The step at iteration ``k``."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TailDecay(TracedSchedule):
    r"""An outer step ``value`` that drops to ``factor * value`` from iteration ``start`` on, on
    top of the method's own law: :func:`step_size` returns ``factor_at(k) * step_size(value, k,
    power, k0)``, so a decaying regime keeps its decay.

    ``bl.solve`` gives a tuned ``lr_outer`` this form on a run with minibatches
    (:mod:`bilevel.drivers.tuning`, ``Tuning.tail``). Why: with a constant step the last iterate
    of a stochastic method does not converge; it hovers around the solution at a distance that
    grows with the step (for SGD with step eta on a mu-strongly convex function with gradient
    noise sigma^2, E||x_k - x*||^2 -> O(eta sigma^2 / mu)), and the tuning, which picks the step
    that makes the most progress in a short run, picks one whose noise floor is high. Dividing
    the step by 10 for the second half lowers the floor (the classical "step decay" of SGD)
    while the first half makes the progress. Measured on the defaults benchmark's minibatch
    problems (``benchmarks/defaults.py``; docs/step_sizes.md). A traced leaf of the solver like
    the other schedules here (a grid of steps compiles once).
    """

    value: Any
    start: Any
    factor: Any

    def factor_at(self, k: Any) -> jax.Array:
        """1 before ``start``, ``factor`` from ``start`` on."""
        kf = jnp.asarray(k, dtype=jnp.result_type(float))
        return jnp.where(kf < self.start, 1.0, self.factor)

    def __call__(self, k: Any) -> jax.Array:
        """The step at ``k`` with a constant law (what :func:`step_size` gives at power 0)."""
        return step_size(self, k)

r"""Window averaging of hypergradients over the last w rounds, shared by the online baselines.

The early online bilevel methods move x along a weighted window average of hypergradients,

    x_{t+1} = Proj_X(x_t - gamma_t (1/W) sum_{i=0}^{w-1} eta^i h_{t-i}),   W = sum_{i<w} eta^i,

(Tarzanagh et al., AISTATS 2024, OAGD; Lin et al., NeurIPS 2023, SOBOW; Bohne et al., arXiv
2409.10470, SOBBO), in one of two forms:

* **stored**: h_{t-i} is the estimate made at round t - i (at x_{t-i}) and kept in memory
  (SOBOW, SOBBO): a :class:`Window` ring buffer of the last w estimates, slot ``(t - 1) mod w``
  holding round t's;
* **re-evaluated**: h_{t-i} is the hypergradient of the past round's f_{t-i}, g_{t-i} at the
  current x_t (OAGD): the solver evaluates ``problem.at_round(t - i)`` for every lag i.

Both weigh lag i by :func:`lag_weights`. Rounds before 1 do not exist: with ``start="zeros"``
(the papers' convention f_t = 0 for t <= 0, Hazan et al. 2017) they count as zero estimates and
W keeps all w terms, so the first rounds take shorter steps; with ``start="renormalize"`` (the
OAGD code, ``momentum_list`` over the batches present) W sums only the lags that exist.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

PyTree = Any

__all__ = ["Window", "WINDOW_STARTS", "lag_weights", "check_window"]

#: how the window is weighed before round w (module docstring)
WINDOW_STARTS = ("zeros", "renormalize")


def lag_weights(t, size: int, eta, start: str) -> jax.Array:
    """``(size,)`` weights of lags i = 0..size-1 at round t (traced): ``eta^i / W`` for the
    rounds t - i >= 1, 0 for the others (W by ``start``, module docstring)."""
    lags = jnp.arange(size)
    dtype = jnp.result_type(float)
    powers = jnp.asarray(eta, dtype) ** lags
    present = (jnp.asarray(t) - lags >= 1).astype(dtype)
    norm = jnp.sum(powers * present) if start == "renormalize" else jnp.sum(powers)
    return powers * present / norm


def weighted_sum(stacked: PyTree, weights: jax.Array) -> PyTree:
    """``sum_j weights[j] stacked[j]`` over the leading axis of every leaf."""
    return jax.tree.map(lambda a: jnp.tensordot(weights.astype(a.dtype), a, axes=1), stacked)


class Window(NamedTuple):
    """The last w hypergradient estimates (a ring buffer with static shapes)."""

    #: leaves (w, ...): slot s holds the estimate of the latest round r with (r - 1) mod w == s
    estimates: PyTree

    @classmethod
    def zeros(cls, template: PyTree, size: int) -> Window:
        return cls(jax.tree.map(lambda a: jnp.zeros((size, *jnp.shape(a)), a.dtype), template))

    @property
    def size(self) -> int:
        return jax.tree.leaves(self.estimates)[0].shape[0]

    def push(self, estimate: PyTree, t) -> Window:
        """The window with round t's estimate in slot ``(t - 1) mod w``."""
        slot = (jnp.asarray(t) - 1) % self.size
        return Window(jax.tree.map(lambda buf, e: buf.at[slot].set(e), self.estimates, estimate))

    def average(self, t, eta, start: str) -> PyTree:
        """``(1/W) sum_i eta^i h_{t-i}`` after round t's push (slot s: lag ``(t-1-s) mod w``)."""
        size = self.size
        lag_of_slot = (jnp.asarray(t) - 1 - jnp.arange(size)) % size
        weights = lag_weights(t, size, eta, start)[lag_of_slot]
        return weighted_sum(self.estimates, weights)


def check_window(solver) -> None:
    """``window`` a positive int, ``0 < eta <= 1``, ``window_start`` one of
    :data:`WINDOW_STARTS` (for a solver's ``validate``)."""
    cls, w, eta = type(solver).__name__, solver.window, solver.eta
    if isinstance(w, bool) or not isinstance(w, int) or w < 1:
        raise ValueError(f"{cls}(window=...) must be a positive int (rounds), got {w!r}.")
    if isinstance(eta, bool) or not isinstance(eta, int | float) or not 0 < eta <= 1:
        raise ValueError(
            f"{cls}(eta={eta!r}) must be in (0, 1]: lag i weighs eta^i (1 = a plain average)."
        )
    solver._check_choices(window_start=WINDOW_STARTS)

"""The divergence rules of the drivers: when a seed is diverged, and what it keeps.

A seed is diverged when its state or metrics stop being finite (the evaluation program says so)
or when its headline metric explodes (:func:`exploded`). A diverged seed stops adding history
rows and keeps its last finite state (:func:`keep_good`); the other seeds run on.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bilevel.drivers.grid import grid_axes
from bilevel.drivers.progress import HEADLINE

__all__ = ["EXPLOSION_FACTOR", "exploded", "keep_good"]

#: a run whose headline metric grows beyond this factor of its start (and of 1) is diverged
EXPLOSION_FACTOR = 1e12


def exploded(metrics: dict, step: int, seeds: list, rows: list[dict]) -> np.ndarray:
    """Seeds whose headline metric exploded: finite but beyond ``EXPLOSION_FACTOR`` x its start.

    Some runs blow up without ever producing inf (a zeroth-order method whose finite difference
    underflows to 0 stalls at |x| ~ 1e21); they are diverged all the same. ``rows`` are the
    history rows so far, whose first row per seed is its start (step 0 in ``solve``, round 1
    in ``solve_online``).
    """
    n_seeds = len(seeds)
    name = next((n for n in HEADLINE if n in metrics), None)
    if name is None or step == 0:
        return np.zeros(n_seeds, bool)
    values = np.broadcast_to(np.atleast_1d(np.asarray(metrics[name], float)), (n_seeds,))
    start = {}
    for r in rows:
        if name in r:
            start.setdefault(r["seed"], r[name])
    base = np.array([abs(start.get(s, np.inf)) for s in seeds])
    return np.abs(values) > EXPLOSION_FACTOR * np.maximum(base, 1.0)


def keep_good(new_state, old_state, alive: np.ndarray):
    """``new_state`` where ``alive``, ``old_state`` (the last finite one) elsewhere.

    ``alive`` has the state's leading axes: (seed,) or, in a sweep, (point, seed); there the
    PRNG key shared by the points (:func:`bilevel.drivers.grid.grid_axes`) moves on (it is not
    a point's result).
    """
    if alive.all():
        return new_state
    mask = jnp.asarray(alive)

    def pick(n, o):
        return jnp.where(mask.reshape(mask.shape + (1,) * (n.ndim - mask.ndim)), n, o)

    axes = grid_axes(new_state) if alive.ndim > 1 else 0
    if axes == 0:
        return jax.tree.map(pick, new_state, old_state)
    return type(new_state)(
        *(
            n if ax is None else jax.tree.map(pick, n, o)
            for n, o, ax in zip(new_state, old_state, axes, strict=True)
        )
    )

"""The divergence rules of the drivers: when a seed is diverged, and what it keeps.

A seed is diverged when

- its state or metrics stop being finite (the evaluation program says so, :class:`Health`);
- its headline metric explodes (:func:`exploded`);
- its iterates explode (:func:`grown`): ||x||, ||y|| or the norm of the method's own
  hypergradient estimate beyond ``EXPLOSION_FACTOR`` x its start norm (and 1), whatever the
  metrics say -- a run whose gradient vanished at |x| ~ 4e40 reported a tiny ``grad_norm`` and
  "completed"; IBCG's adjoint iterate w grew to 1e93 on a hyper-cleaning with minibatches while
  x stayed in its box, and only its estimate ``F_k = grad_x f - d2g/dxdy w`` showed it.

A diverged seed stops adding history rows and keeps its last finite state (:func:`keep_good`);
the other seeds run on. Why it diverged is one of :data:`REASONS`, kept per seed by the history.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bilevel.core.tree import tree_norm, tree_scale
from bilevel.drivers.grid import grid_axes
from bilevel.drivers.progress import HEADLINE

__all__ = [
    "EXPLOSION_FACTOR",
    "NON_FINITE",
    "HEADLINE_EXPLODED",
    "ITERATES_GREW",
    "REASONS",
    "Health",
    "iterate_norms",
    "exploded",
    "grown",
    "keep_good",
]

#: a run whose headline metric or iterate norm grows beyond this factor of its start (and of 1)
#: is diverged
EXPLOSION_FACTOR = 1e12

#: why a seed diverged, as the run's message says it
NON_FINITE = "non-finite iterates or metrics (NaN/inf)"
HEADLINE_EXPLODED = f"its headline metric grew beyond {EXPLOSION_FACTOR:.0e} x its start"
ITERATES_GREW = (
    f"its iterates (||x||, ||y|| or its hypergradient estimate) grew beyond "
    f"{EXPLOSION_FACTOR:.0e} x their start norm"
)
REASONS = (NON_FINITE, HEADLINE_EXPLODED, ITERATES_GREW)


class Health(NamedTuple):
    """What the evaluation of a state says besides its metrics and counters
    (:func:`bilevel.drivers.programs.evaluate`: the ``"eval"`` and ``"metrics"`` programs).

    A pytree, so a sweep's grid axis and a seed axis come with every field, and
    ``History.record`` takes it where a plain finiteness array also does (``bl.solve_online``
    passes one: its rounds are evaluated by a program of their own).

    Attributes:
        finite: whether every float leaf of the state and every metric is finite.
        norms: ``(||x||, ||y||, ||estimate||)`` of the solver's output and its last
            hypergradient estimate (:func:`iterate_norms`); the first evaluation's are the
            start norms :func:`grown` compares with.
    """

    finite: Any
    norms: Any


def _norm(tree) -> jax.Array:
    """||tree||, scaled by its largest entry first: the plain sum of squares overflows at
    ||x|| ~ 1.8e19 in float32, which would call a model that merely started large diverged."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return jnp.zeros(())
    top = jnp.max(jnp.stack([jnp.max(jnp.abs(leaf), initial=0) for leaf in leaves]))
    scale = jnp.where(top > 0, top, 1)  # inf/NaN pass through: the finiteness check has them
    return scale * tree_norm(tree_scale(1 / scale, tree))


def iterate_norms(x, y, estimate_norm=None) -> jax.Array:
    """``[||x||, ||y||, ||estimate||]`` (traced, inside the ``"eval"`` program).

    ``estimate_norm`` is the norm of the method's last hypergradient estimate (its
    ``hypergrad_estimate_norm``); the internal iterates a method keeps beside x and y (an
    adjoint w, a Neumann state, a momentum) all feed it, so a runaway one shows there. 0 for a
    method that records none."""
    nx, ny = _norm(x), _norm(y)
    ne = jnp.zeros(()) if estimate_norm is None else jnp.abs(jnp.asarray(estimate_norm))
    dtype = jnp.result_type(nx, ny, ne)
    return jnp.stack([nx.astype(dtype), ny.astype(dtype), ne.astype(dtype)])


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


def grown(norms, start) -> np.ndarray:
    """Seeds whose ||x||, ||y|| or estimate norm is beyond ``EXPLOSION_FACTOR`` x max(its
    start norm, 1).

    ``norms`` and ``start`` are ``(seeds, 3)`` arrays of :func:`iterate_norms`. The floor of 1
    keeps a start at 0 (y0 = 0 is common) from counting any step away from it as growth;
    iterates that start large (a model's weights) are measured against their own scale. A
    metric can say nothing is wrong while the iterates run away (a vanished or saturated
    gradient), so this rule reads the iterates themselves.
    """
    norms, start = np.asarray(norms, float), np.asarray(start, float)
    return (norms > EXPLOSION_FACTOR * np.maximum(start, 1.0)).any(axis=-1)


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

"""Per-round data of an online problem: round t's slice of held data, or a sampler's draws.

An :class:`~bilevel.OnlineProblem` holds each level's data either as a pytree whose leaves have
leading axes ``(rounds, samples)`` (round t, counted from 1, is index ``t - 1``), or as a
*sampler* ``data(t, key) -> batch`` for streams too large to hold. A solver asks for the draws
of one round at once (:func:`round_minibatches`), exactly as an offline step does with
``bilevel.core.sampling.minibatches``: for held data it *is* that function, applied to round t's
samples, so everything the offline solvers guarantee (i.i.d. uniform draws, one PRNG call per
level, the same draw index giving the same sample) holds per round.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from bilevel.core import sampling

PyTree = Any

__all__ = [
    "is_sampler",
    "round_slice",
    "evaluation_data",
    "samples_per_draw",
    "RoundBatches",
    "round_minibatches",
    "EVALUATION_KEY",
]

#: the sampler draw that stands for round t's "full data" in evaluations (metrics, regret):
#: ``data(t, jax.random.PRNGKey(EVALUATION_KEY))``, the same draw for every solver and seed
EVALUATION_KEY = 0


def is_sampler(data: Any) -> bool:
    """Whether a level's data is a sampler ``data(t, key) -> batch`` (not held arrays)."""
    return callable(data)


def round_slice(data: PyTree, t) -> PyTree:
    """Round t's samples of held data (leaves ``(rounds, samples, ...)`` -> ``(samples, ...)``);
    ``t`` counts from 1 and may be traced. ``None`` stays ``None``."""
    if data is None:
        return None
    index = jnp.asarray(t, jnp.int32) - 1
    return jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, index, 0, False), data)


def evaluation_data(data: Any, t) -> PyTree:
    """What evaluations of round t use as its full data: all of round t's held samples, or for
    a sampler its draw at the fixed key :data:`EVALUATION_KEY`."""
    if is_sampler(data):
        return data(jnp.asarray(t, jnp.int32), jax.random.PRNGKey(EVALUATION_KEY))
    return round_slice(data, t)


def samples_per_draw(data: Any) -> int | None:
    """Samples in round t's data (held: the second axis) or in one sampler draw; ``None``
    without data."""
    if data is None:
        return None
    if is_sampler(data):
        spec = jax.eval_shape(data, jnp.zeros((), jnp.int32), jax.random.PRNGKey(0))
        return int(jax.tree.leaves(spec)[0].shape[0])
    return int(jax.tree.leaves(data)[0].shape[1])


class RoundBatches(NamedTuple):
    """The draws of one round when a level is a sampler: ``outer(i)`` / ``inner(i)`` as in
    :class:`bilevel.core.sampling.Minibatches` (draw ``i``, possibly traced; the same ``i`` is the
    same batch)."""

    outer_draw: Callable[[Any], PyTree]
    inner_draw: Callable[[Any], PyTree]
    samples_outer: int  # samples of the outer level drawn this round (static)
    samples_inner: int

    def outer(self, i) -> PyTree:
        return self.outer_draw(i)

    def inner(self, i) -> PyTree:
        return self.inner_draw(i)


def round_minibatches(
    outer_data: Any,
    inner_data: Any,
    t,
    key: jax.Array,
    batch_size: int | None,
    *,
    outer: int,
    inner: int,
) -> sampling.Minibatches | RoundBatches:
    """The ``outer`` outer and ``inner`` inner draws of round ``t``.

    Held data: ``bilevel.core.sampling.minibatches(key, round t's outer samples, round t's inner
    samples, batch_size, ...)`` (``batch_size=None``: every draw is the whole round). A sampler
    level: draw i is ``data(t, fold_in(level_key, i))`` with the level's key split from ``key``
    (its batch size is the sampler's own).
    """
    if not (is_sampler(outer_data) or is_sampler(inner_data)):
        return sampling.minibatches(
            key,
            round_slice(outer_data, t),
            round_slice(inner_data, t),
            batch_size,
            outer=outer,
            inner=inner,
        )
    held_key, outer_key, inner_key = jax.random.split(key, 3)
    held = sampling.minibatches(
        held_key,
        None if is_sampler(outer_data) else round_slice(outer_data, t),
        None if is_sampler(inner_data) else round_slice(inner_data, t),
        batch_size,
        outer=outer,
        inner=inner,
    )
    outer_draw, samples_outer = _level(
        outer_data, t, outer_key, outer, held.outer, held.samples_outer
    )
    inner_draw, samples_inner = _level(
        inner_data, t, inner_key, inner, held.inner, held.samples_inner
    )
    return RoundBatches(outer_draw, inner_draw, samples_outer, samples_inner)


def _level(data, t, key, count: int, held_draw, held_samples: int) -> tuple[Callable, int]:
    """``(draw, samples drawn)`` of one level: a sampler's ``count`` keyed draws, or the held
    draws."""
    if not is_sampler(data):
        return held_draw, held_samples
    t = jnp.asarray(t, jnp.int32)
    return (lambda i: data(t, jax.random.fold_in(key, i))), count * samples_per_draw(data)

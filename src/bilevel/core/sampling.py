"""Minibatch sampling: a pure function of ``(key, data)``, so it vmaps over seeds.

Every stochastic method in the papers assumes i.i.d. unbiased minibatches. A solver step first
declares how many minibatches of each level it will use; :func:`minibatches` then draws *all*
their indices with one PRNG call per level (uniform, with replacement: i.i.d. and unbiased), and
each ``.outer(i)`` / ``.inner(i)`` gathers the rows of draw i when the oracle needs them.

Why this shape: on XLA:CPU the PRNG, not the gather, dominated a step (measured: drawing 32
indices with ``jax.random.randint`` cost 15 us, 5x a minibatch gradient of the quadratic test
problem, and 100 us under a 10-seed vmap). So the indices come from a keyed counter-based hash
(two rounds of the "lowbias32" integer mixer, keyed by the step's threefry subkey): about 0.2 us
for the same draw, vmap-friendly, and uniform up to a modulo bias of at most n / 2^32 in
relative probability (2e-4 for a million samples). ``tests/test_sampling.py`` checks
uniformity (chi-square) and the independence of draws, seeds and steps. Gathering each draw
separately keeps memory at one batch, where a per-step gather of all draws would not.

Two schemes (``BilevelProblem(sampling=...)``):

* ``"iid"`` (default): the above; what every paper's analysis assumes.
* ``"window"``: draw i is the cyclic window of ``batch_size`` consecutive rows starting at a
  uniform random row, ``{s, s+1, ..., s+b-1} mod n``. Each row lies in exactly b of the n
  windows, so every draw is an unbiased estimate of the mean (each sample included with
  probability b/n), but samples within a window are not independent of each other: the rows
  must be in random order (shuffle them once, as ``hyper_cleaning_dataset`` and benchopt's
  loaders do), and neighbours are always drawn together. Why offer it: XLA:CPU's gather copies
  entry by entry, so for wide rows the i.i.d. gather dominates a step (measured 2026-11-24 with
  ``benchmarks/vs_benchopt.py``: F2SA on data cleaning with 784-pixel rows, 5.2 -> 2.2 ms per
  step), while a window is one ``dynamic_slice`` (a memcpy) and a select for the rows that wrap
  around. It also changes the results (see docs/performance.md): use it for speed on large,
  shuffled data. Unlike benchopt's per-epoch permutation of fixed blocks, it needs no sampler
  state and every draw is uniform on its own.

Parts (``BilevelProblem(batch_chunks=k)``): each draw, of either scheme, is gathered as k
consecutive parts of near-equal size, a :class:`Chunks` batch, on which a level's loss is the
row-weighted mean over the parts (:class:`ChunkMean`): the same value and derivatives for a
loss that is a mean over rows, with each part's copy small enough to stay in cache for the
products that read it (large rows such as per-sample matrices; docs/performance.md item 13).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bilevel.core import sharding as parallel

PyTree = Any

__all__ = [
    "SCHEMES",
    "Chunks",
    "ChunkMean",
    "split_rows",
    "num_samples",
    "batch_count",
    "Minibatches",
    "minibatches",
    "uniform_indices",
]

#: the minibatch schemes (module docstring): i.i.d. rows, or a cyclic window at a random row
SCHEMES = ("iid", "window")


def num_samples(data: PyTree) -> int | None:
    """The common leading-axis length of the data leaves, or ``None`` for no data."""
    if data is None:
        return None
    leaves = jax.tree.leaves(data)
    return int(leaves[0].shape[0]) if leaves else None


def batch_count(data: PyTree, batch_size: int | None) -> int:
    """Samples in one minibatch (0 for a deterministic level; all of them for full batches)."""
    if data is None:
        return 0
    return num_samples(data) if batch_size is None else int(batch_size)


def _check_draw(idx: jax.Array, i, level: str) -> None:
    """Refuse a static draw index past the draws a step made. JAX clamps an out-of-range index
    to the last draw, so a solver that reads draw ``n`` of ``n`` draws would silently reuse
    draw ``n - 1``; a traced index (an inner-loop counter) cannot be checked here."""
    if isinstance(i, (int, np.integer)) and not 0 <= i < idx.shape[0]:
        raise IndexError(
            f"{level} draw {i} requested, but this step drew {idx.shape[0]} {level} "
            f"minibatch(es) (draws 0..{idx.shape[0] - 1}): the solver's draw count and the "
            "draws it reads disagree."
        )


def _gather(data: PyTree, idx: jax.Array | None, i, chunks: int = 1, level: str = "") -> PyTree:
    if data is None or idx is None:  # deterministic level, or full-batch oracle
        return data
    _check_draw(idx, i, level)
    rows = idx[i]
    spans = _chunk_spans(rows.shape[-1], chunks)
    parts = [_part(data, rows, offset, size, len(spans) == 1) for offset, size in spans]
    return parts[0] if len(parts) == 1 else Chunks(parts, [size for _, size in spans])


def split_rows(batch: PyTree, chunks: int) -> PyTree:
    """A materialised ``batch`` as the :class:`Chunks` the sampler would make of it with
    ``chunks`` parts (the batch itself for one part)."""
    spans = _chunk_spans(num_samples(batch), chunks)
    if len(spans) == 1:
        return batch
    parts = [jax.tree.map(lambda a, o=o, m=m: a[o : o + m], batch) for o, m in spans]
    return Chunks(parts, [m for _, m in spans])


def _chunk_spans(size: int, chunks: int) -> list[tuple[int, int]]:
    """``(offset, size)`` of each part of a draw of ``size`` rows split into ``chunks``
    near-equal parts (at most one per row): the first ``size % chunks`` get one row more."""
    chunks = min(chunks, size)
    sizes = [size // chunks + (c < size % chunks) for c in range(chunks)]
    offsets = [sum(sizes[:c]) for c in range(chunks)]
    return list(zip(offsets, sizes, strict=True))


def _part(data: PyTree, rows: jax.Array, offset: int, size: int, whole: bool) -> PyTree:
    """Rows ``offset, ..., offset + size - 1`` of a draw, as one materialised batch."""
    if rows.ndim == 2:  # scheme "window": (1, batch_size) copies of the window's first row
        start = _shifted(rows[0, 0], offset, num_samples(data))
        batch = _window(data, start, size, whole=whole)
    else:
        part = rows[offset : offset + size]
        batch = jax.tree.map(lambda a: jnp.take(a, part, axis=0, mode="clip"), data)
    batch = parallel.shard_batch(batch)  # split over the devices of solve(devices=...), if any
    # Materialise the batch once: without the barrier XLA fused the (elementwise, ~1.4 ns per
    # entry on CPU) gather into each consumer and paid for it several times per oracle call
    # (measured: F2SA 360 -> 280 us per step on the stochastic quadratic, batch 64).
    return jax.lax.optimization_barrier(batch)


def _shifted(start: jax.Array, offset: int, n: int) -> jax.Array:
    """``(start + offset) mod n`` for ``0 <= start < n`` and ``0 <= offset < n``."""
    if offset == 0:
        return start
    start = start + offset
    return jnp.where(start >= n, start - n, start)


def _rows(
    data: PyTree, idx: jax.Array | None, i, chunks: int = 1, level: str = ""
) -> jax.Array | None:
    """The data rows of draw i, in the order the batch holds them (None: full data)."""
    if data is None or idx is None:
        return None
    _check_draw(idx, i, level)
    rows = idx[i]
    if rows.ndim == 1:  # "iid"
        return rows
    n = num_samples(data)
    spans = _chunk_spans(rows.shape[-1], chunks)
    parts = [_window_rows(n, _shifted(rows[0, 0], o, n), m, rows.dtype) for o, m in spans]
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts)


def _window_rows(n: int, start: jax.Array, size: int, dtype) -> jax.Array:
    """The rows :func:`_window` returns for the window of ``size`` rows at ``start``, in order."""
    j = jnp.arange(size, dtype=dtype)
    wrapped = jnp.where(j < start + size - n, j, n - size + j)  # _window's order when it wraps
    return jnp.where(start <= n - size, start + j, wrapped)


def _window(data: PyTree, start: jax.Array, size: int, *, whole: bool = True) -> PyTree:
    """Rows ``start, ..., start + size - 1`` of every leaf of ``data``, cyclically (in another
    order when the window wraps around: the rows past the end come first, which a mean does
    not see; :func:`_window_rows`)."""
    n = num_samples(data)

    def selected():  # the window at min(start, n - size), its first rows replaced when it wraps
        head = jnp.arange(size) < start + size - n
        first = jnp.minimum(start, n - size)

        def leaf(a):
            block = jax.lax.dynamic_slice_in_dim(a, first, size)
            return jnp.where(head.reshape((size,) + (1,) * (a.ndim - 1)), a[:size], block)

        return jax.tree.map(leaf, data)

    if not whole:
        # A part of a draw (batch_chunks): the select, whose first rows are the same for every
        # draw and stay in cache, with no cond per part (measured on benchopt's quadratic,
        # 8 parts of 8 rows of (100 x 100): 135 us per gradient, against 164-188 with a cond
        # per part and 139-165 with no wrap-around at all).
        return selected()

    # A whole draw: a cond, not the select: the select made every window an elementwise fusion
    # (measured on 64 rows of 784 floats: 52 us per window and matmul, against 31 us for the
    # plain dynamic_slice the cond runs in all but (size - 1) of the n starts). One cond for
    # all the leaves of a draw: each cond is a kernel launch of its own.
    def inside():
        return jax.tree.map(lambda a: jax.lax.dynamic_slice_in_dim(a, start, size), data)

    return jax.lax.cond(start <= n - size, inside, selected)


class Chunks:
    """A minibatch held as consecutive parts (``BilevelProblem(batch_chunks=k)``): ``parts[c]``
    is a batch pytree of ``sizes[c]`` rows. A loss that is a mean over rows takes the value
    ``sum_c sizes[c] / b * loss(parts[c])`` on it (:class:`ChunkMean`), the same as on the whole
    batch; each part is its own buffer, small enough to stay in cache while the oracle reads it
    (why: docs/performance.md, item 13). The sizes are static (pytree aux data)."""

    def __init__(self, parts, sizes):
        self.parts, self.sizes = tuple(parts), tuple(int(m) for m in sizes)

    def tree_flatten(self):
        return self.parts, self.sizes

    @classmethod
    def tree_unflatten(cls, sizes, parts):
        return cls(parts, sizes)

    def __repr__(self) -> str:
        return f"Chunks(sizes={self.sizes})"


jax.tree_util.register_pytree_node_class(Chunks)


class ChunkMean:
    """``fn(..., batch)`` (a level's loss, the batch last) that also takes a :class:`Chunks`
    batch: there it is the row-weighted mean of ``fn`` over the parts, which equals ``fn`` on
    the whole batch when ``fn`` is a mean over rows (plus terms that do not read the batch).
    Every derivative the solvers take of it is then the same weighted mean of the parts'
    derivatives. Other batches go to ``fn`` unchanged. Compared by identity, as a function is."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def __call__(self, *args):
        *head, batch = args
        if not isinstance(batch, Chunks):
            return self.fn(*args)
        total = sum(batch.sizes)
        pairs = zip(batch.parts, batch.sizes, strict=True)
        terms = [m / total * self.fn(*head, part) for part, m in pairs]
        return sum(terms[1:], terms[0])

    def __repr__(self) -> str:
        return f"ChunkMean({self.fn!r})"


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=[
        "outer_data",
        "inner_data",
        "outer_idx",
        "inner_idx",
        "samples_outer",
        "samples_inner",
    ],
    meta_fields=["chunks"],
)
@dataclasses.dataclass(frozen=True)
class Minibatches:
    """The minibatches of one solver step: ``outer(i)`` and ``inner(i)`` for draw i.

    ``i`` may be traced (an inner-loop counter). Draws of one level are independent; calling
    ``inner(i)`` twice with the same i returns the *same* sample (that is how a method reuses a
    sample on purpose, e.g. STABLE's one inner sample for the Hessian and the y-gradient).
    A pytree: it may travel through jit/vmap/scan, ``chunks`` as static data.
    """

    outer_data: PyTree
    inner_data: PyTree
    # (num_outer, batch_size) int32 rows ("iid"); (num_outer, 1, batch_size) copies of each
    # window's first row ("window": the scheme and the size live in the static shape, since a
    # Minibatches may travel through jit/vmap/scan as a pytree); or None
    outer_idx: jax.Array | None
    inner_idx: jax.Array | None
    samples_outer: int  # samples drawn for the outer level in this step (static)
    samples_inner: int
    chunks: int = 1  # each draw as up to this many consecutive parts (a Chunks batch; static)

    def outer(self, i) -> PyTree:
        return _gather(self.outer_data, self.outer_idx, i, self.chunks, "outer")

    def inner(self, i) -> PyTree:
        return _gather(self.inner_data, self.inner_idx, i, self.chunks, "inner")

    def outer_rows(self, i) -> jax.Array | None:
        """The row indices of outer draw i, in the batch's order (None for full data): for a
        method that keeps a table per sample (SABA)."""
        return _rows(self.outer_data, self.outer_idx, i, self.chunks, "outer")

    def inner_rows(self, i) -> jax.Array | None:
        """The row indices of inner draw i, in the batch's order (None for full data)."""
        return _rows(self.inner_data, self.inner_idx, i, self.chunks, "inner")


def _mix32(h: jax.Array) -> jax.Array:
    """The "lowbias32" integer hash (C. Wellons, hash-prospector): a bijection of uint32."""
    h = (h ^ (h >> 16)) * jnp.uint32(0x7FEB352D)
    h = (h ^ (h >> 15)) * jnp.uint32(0x846CA68B)
    return h ^ (h >> 16)


def uniform_indices(key: jax.Array, shape: tuple[int, ...], n: int) -> jax.Array:
    """Indices uniform on {0, ..., n-1} (int32), i.i.d. across entries, from a PRNG key.

    Counter-based: entry c gets ``mix(mix(c * phi + k0) ^ k1) mod n`` with (k0, k1) the key's
    two words; see the module docstring for why not ``jax.random.randint``.
    """
    if not 0 < n < 2**31:
        raise ValueError(f"uniform_indices needs 0 < n < 2^31, got n={n}.")
    words = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    words = words.astype(jnp.uint32).reshape(-1)
    size = 1
    for d in shape:
        size *= d
    counter = jnp.arange(size, dtype=jnp.uint32) * jnp.uint32(0x9E3779B9)
    h = _mix32(_mix32(counter + words[0]) ^ words[-1])
    return (h % jnp.uint32(n)).astype(jnp.int32).reshape(shape)


def _indices(key, data, batch_size, num, scheme):
    if data is None or batch_size is None or num == 0:
        return None
    n = num_samples(data)
    if scheme == "iid":
        return uniform_indices(key, (num, batch_size), n)
    if batch_size > n:
        raise ValueError(
            f"sampling='window' needs batch_size <= the number of samples; got batch_size "
            f"{batch_size} for {n} samples. Use a smaller batch, or sampling='iid'."
        )
    starts = uniform_indices(key, (num, 1, 1), n)  # draw i: the window starting at row idx[i]
    return jnp.broadcast_to(starts, (num, 1, batch_size))


def minibatches(
    key: jax.Array,
    outer_data: PyTree,
    inner_data: PyTree,
    batch_size: int | None,
    *,
    outer: int,
    inner: int,
    scheme: str = "iid",
    chunks: int = 1,
) -> Minibatches:
    """Draw the indices of ``outer`` outer and ``inner`` inner minibatches of ``batch_size``.

    ``batch_size=None`` means full-batch (deterministic) oracles: no indices, no gather.
    ``scheme``: ``"iid"`` (rows uniform with replacement) or ``"window"`` (module docstring).
    ``chunks``: each draw is gathered as ``min(chunks, batch_size)`` consecutive parts, a
    :class:`Chunks` batch, when above 1 (``BilevelProblem(batch_chunks=...)``); full batches
    are never split.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown sampling scheme {scheme!r}; use one of {SCHEMES}.")
    k_out, k_in = jax.random.split(key)
    return Minibatches(
        outer_data=outer_data,
        inner_data=inner_data,
        outer_idx=_indices(k_out, outer_data, batch_size, outer, scheme),
        inner_idx=_indices(k_in, inner_data, batch_size, inner, scheme),
        samples_outer=outer * batch_count(outer_data, batch_size),
        samples_inner=inner * batch_count(inner_data, batch_size),
        chunks=chunks,
    )

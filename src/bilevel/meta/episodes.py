r"""N-way K-shot episodes: class-disjoint few-shot splits and a jit-able episode sampler.

Few-shot meta-learning (PZOBO, Sow, Ji, Liang, NeurIPS 2022, Sec. 4.3 and eq. 9; the protocol
of Vinyals et al., "Matching Networks for One Shot Learning", NeurIPS 2016) trains on tasks
drawn from the meta-train classes and is evaluated on tasks drawn from classes it never saw.
A task T_i (an *episode*) is drawn as:

1. ``ways`` distinct classes, uniformly among the split's classes;
2. for each, ``shots + queries`` distinct images of that class, uniformly without replacement;
   the first ``shots`` form the support set S_i, the other ``queries`` the query set D_i
   (so S_i and D_i are disjoint);
3. labels ``0..ways-1`` given to the chosen classes in a uniformly random order, so a label
   says nothing about which class it is.

:class:`EpisodeSampler` draws a meta-batch of such tasks with ``jax.random`` only, at fixed
shapes, so a meta-training step can sample inside ``jit``. The official code draws
``2 * shots`` images per class and alternates them between support and query; here
``queries`` is free and ``queries = shots`` gives the same distribution.

Splits are :class:`FewShotSplit`\ s: images already normalised, labels ``0..n_classes-1``.
:func:`split_by_classes` cuts a labelled image set into class-disjoint splits and
:func:`normalize_splits` normalises every split per channel with the META-TRAIN split's
statistics (or fixed ones such as miniImageNet's in the official code), so no held-out image
informs them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "Episodes",
    "FewShotSplit",
    "EpisodeSampler",
    "split_by_classes",
    "channel_stats",
    "normalize_splits",
    "distinct_indices",
]


class Episodes(NamedTuple):
    """A meta-batch of B few-shot tasks (leading axis = task).

    Within a task, examples are grouped by label: ``support_labels[b] == repeat(arange(ways),
    shots)`` and ``query_labels[b] == repeat(arange(ways), queries)`` (a prototype is then a
    reshape and a mean). Which class each label stands for is random per task.
    """

    support_images: jax.Array  # (B, ways * shots, C, H, W) float: the support sets S_i
    support_labels: jax.Array  # (B, ways * shots) int32 in [0, ways)
    query_images: jax.Array  # (B, ways * queries, C, H, W) float: the query sets D_i
    query_labels: jax.Array  # (B, ways * queries) int32 in [0, ways)


@dataclasses.dataclass(frozen=True, eq=False)
class FewShotSplit:
    """The images of some classes, for one of meta-train / meta-val / meta-test.

    Attributes:
        images: ``(n, C, H, W)`` float32, already normalised (:func:`normalize_splits`).
        labels: ``(n,)`` integers in ``0..n_classes-1``; label ``c`` is class ``class_ids[c]``.
        class_ids: ``(n_classes,)`` int: each class's id in the source dataset.
        class_names: one name per class (e.g. ``"Trouser"`` or a WordNet id).
    """

    images: np.ndarray
    labels: np.ndarray
    class_ids: np.ndarray
    class_names: tuple[str, ...]

    def __post_init__(self):
        images, labels = self.images, self.labels
        if images.ndim != 4 or images.dtype != np.float32:
            raise ValueError(
                f"FewShotSplit(images=...) must be float32 of shape (n, C, H, W), got "
                f"{images.dtype} {images.shape}; convert with images.astype(np.float32) and "
                "move channels first (NHWC -> NCHW: images.transpose(0, 3, 1, 2))."
            )
        if labels.shape != (images.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(
                f"FewShotSplit(labels=...) must be integers of shape ({images.shape[0]},), one "
                f"per image, got {labels.dtype} {labels.shape}."
            )
        k = len(self.class_names)
        if np.shape(self.class_ids) != (k,):
            raise ValueError(
                f"FewShotSplit: class_ids has shape {np.shape(self.class_ids)} but there are "
                f"{k} class_names; give one id and one name per class."
            )
        counts = np.bincount(labels, minlength=k) if labels.size else np.zeros(k, np.int64)
        if labels.size and (labels.min() < 0 or labels.max() >= k):
            raise ValueError(
                f"FewShotSplit(labels=...) must lie in 0..{k - 1} (one per class name), got "
                f"{labels.min()}..{labels.max()}; relabel with split_by_classes."
            )
        if k == 0:
            raise ValueError("FewShotSplit: class_names is empty; a split needs classes.")
        if counts.min() == 0:
            empty = [self.class_names[c] for c in np.flatnonzero(counts == 0)]
            raise ValueError(f"FewShotSplit: every class needs an image; none for {empty}.")

    @property
    def n_classes(self) -> int:
        return len(self.class_names)

    def counts(self) -> np.ndarray:
        """``(n_classes,)`` the number of images of each class."""
        return np.bincount(self.labels, minlength=self.n_classes)


def split_by_classes(
    images: np.ndarray,
    labels: np.ndarray,
    class_lists: Sequence[Sequence[int]],
    class_names: Sequence[str] | None = None,
) -> tuple[FewShotSplit, ...]:
    """Cut a labelled image set into class-disjoint :class:`FewShotSplit`\\ s.

    Split ``s`` holds every image whose label is in ``class_lists[s]``, relabelled by position
    in that list (``class_lists[s][c]`` becomes label ``c``). Images are kept as given
    (normalise afterwards with :func:`normalize_splits`).

    Args:
        images: ``(n, C, H, W)`` float32.
        labels: ``(n,)`` integer class ids.
        class_lists: one list of class ids per split, e.g. ``[range(6), range(6, 10)]``;
            the lists must be pairwise disjoint and each id present in ``labels``.
        class_names: names indexed by class id (e.g. ``FASHION_MNIST_CLASSES``); default
            ``str(id)``.

    Returns:
        One split per list, in order.

    Raises:
        ValueError: a class id repeated across or within lists, or absent from ``labels``.
    """
    labels = np.asarray(labels)
    seen: dict[int, int] = {}
    for s, ids in enumerate(class_lists):
        for c in ids:
            if int(c) in seen:
                raise ValueError(
                    f"split_by_classes(class_lists=...): class {int(c)} is in list "
                    f"{seen[int(c)]} and again in list {s}; the splits must be class-disjoint."
                )
            seen[int(c)] = s
    return tuple(_one_split(images, labels, ids, class_names) for ids in class_lists)


def _one_split(images, labels, ids, class_names) -> FewShotSplit:
    ids = np.asarray([int(c) for c in ids], dtype=np.int64)
    missing = [int(c) for c in ids if not np.any(labels == c)]
    if missing:
        raise ValueError(
            f"split_by_classes(class_lists=...): classes {missing} have no image in labels "
            f"(present: {sorted(set(labels.tolist()))})."
        )
    keep = np.isin(labels, ids)
    relabel = np.searchsorted(np.sort(ids), labels[keep])
    position = np.argsort(ids)[relabel]  # label = index of the class in the caller's list
    names = tuple(str(c) if class_names is None else class_names[c] for c in ids)
    return FewShotSplit(images[keep], position.astype(np.int32), ids, names)


def channel_stats(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and standard deviation of ``(n, C, H, W)`` images, float32 ``(C,)``.

    Accumulated in float64 (a float32 sum over 10^7 pixels loses digits).
    """
    mean = images.mean(axis=(0, 2, 3), dtype=np.float64)
    std = images.std(axis=(0, 2, 3), dtype=np.float64)
    return mean.astype(np.float32), std.astype(np.float32)


def normalize_splits(
    train: FewShotSplit,
    *others: FewShotSplit,
    mean: Sequence[float] | np.ndarray | None = None,
    std: Sequence[float] | np.ndarray | None = None,
) -> tuple[FewShotSplit, ...]:
    """``(x - mean_c) / std_c`` per channel c, on every split, with META-TRAIN statistics.

    The statistics come from ``train`` (:func:`channel_stats`) unless ``mean`` and ``std`` are
    given, as for miniImageNet, whose official code uses fixed values. Held-out
    splits never inform them.

    Returns:
        ``(train, *others)`` normalised, float32.

    Raises:
        ValueError: only one of ``mean`` / ``std`` given, a length other than the channel
            count, or a non-positive ``std`` (a channel constant on meta-train).
    """
    if (mean is None) != (std is None):
        raise ValueError("normalize_splits: give both mean= and std= (or neither, to use train's).")
    if mean is None:
        mean, std = channel_stats(train.images)
    mean = np.asarray(mean, dtype=np.float32)
    std = np.asarray(std, dtype=np.float32)
    channels = train.images.shape[1]
    if mean.shape != (channels,) or std.shape != (channels,):
        raise ValueError(
            f"normalize_splits: mean and std need one value per channel ({channels}), got "
            f"shapes {mean.shape} and {std.shape}."
        )
    if not np.all(std > 0):
        raise ValueError(f"normalize_splits: std must be positive per channel, got {std}.")
    return tuple(
        dataclasses.replace(s, images=_normalized(s.images, mean, std)) for s in (train, *others)
    )


def _normalized(images: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    out = np.subtract(images, mean[:, None, None], dtype=np.float32)  # one new array, no more:
    out /= std[:, None, None]  # miniImageNet's meta-train set is 3.3 GB in float32
    return out


def distinct_indices(key: jax.Array, n, k: int) -> jax.Array:
    """``k`` distinct integers drawn uniformly from ``[0, n)``, in a uniformly random order.

    Robert Floyd's algorithm (J. Bentley, "Programming Pearls: A Sample of Brilliance",
    CACM 30(9), 1987): for ``m = n-k, ..., n-1`` draw ``t`` uniform in ``[0, m]`` and take
    ``t``, or ``m`` when ``t`` is already taken; every k-subset is then equally likely. Sorting
    by 32-bit random keys then makes every order equally likely (up to a tie among the keys,
    probability below k^2 / 2^33). ``O(k^2)`` work whatever ``n``, so ``n`` may be traced.

    Args:
        key: PRNG key.
        n: population size(s), an int or an int array of any batch shape, each ``>= k``.
        k: how many to draw (static).

    Returns:
        int32 array of shape ``n.shape + (k,)``; draws for different entries of ``n`` are
        independent.
    """
    k_draw, k_order = jax.random.split(key)
    n = jnp.asarray(n, jnp.int32)[..., None]  # (..., 1)
    steps = jnp.arange(k, dtype=jnp.int32) - k
    tops = n + steps.reshape((1,) * (n.ndim - 1) + (k,))  # (..., k): n - k + j
    draws = jax.random.randint(k_draw, tops.shape, 0, tops + 1, dtype=jnp.int32)  # in [0, tops]

    def take(j, chosen):
        t = draws[..., j]
        taken = jnp.any(chosen == t[..., None], axis=-1)
        return chosen.at[..., j].set(jnp.where(taken, tops[..., j], t))

    chosen = jax.lax.fori_loop(0, k, take, jnp.full(tops.shape, -1, jnp.int32))
    order = jnp.argsort(jax.random.bits(k_order, tops.shape), axis=-1)
    return jnp.take_along_axis(chosen, order, axis=-1)


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"EpisodeSampler({name}=...) must be a positive int, got {value!r}.")
    return int(value)


class EpisodeSampler(eqx.Module):
    """Draws meta-batches of N-way K-shot tasks from a :class:`FewShotSplit` (module docstring).

    The sampler is a pytree holding the split's images on the device and a per-class index
    table, so pass it as an ARGUMENT of jitted functions (``jax.jit(lambda s, k: s.sample(k))``)
    rather than closing over it, which would bake the images into the program as a constant.

    Args:
        split: the classes and images to draw from.
        ways: classes per task (N), at most ``split.n_classes``.
        shots: support images per class (K).
        queries: query images per class.
        meta_batch: tasks per call of :meth:`sample` (B).

    Raises:
        ValueError: a non-positive count, ``ways`` above the number of classes, or a class with
            fewer than ``shots + queries`` images (named in the message).

    Example:
        >>> import numpy as np, jax
        >>> split = FewShotSplit(np.zeros((12, 1, 2, 2), np.float32), np.arange(12) % 3,
        ...                      np.arange(3), ("a", "b", "c"))
        >>> ep = EpisodeSampler(split, ways=2, shots=1, queries=2, meta_batch=4).sample(
        ...     jax.random.key(0))
        >>> ep.support_images.shape, ep.query_labels.shape
        ((4, 2, 1, 2, 2), (4, 4))
    """

    images: jax.Array  # (n, C, H, W) float32: the split's images
    table: jax.Array  # (n_classes, max count) int32: row of class c's j-th image (0-padded)
    counts: jax.Array  # (n_classes,) int32: images per class (valid prefix of each table row)
    ways: int = eqx.field(static=True)
    shots: int = eqx.field(static=True)
    queries: int = eqx.field(static=True)
    meta_batch: int = eqx.field(static=True)

    def __init__(self, split: FewShotSplit, ways: int, shots: int, queries: int, meta_batch: int):
        self.ways = _positive_int("ways", ways)
        self.shots = _positive_int("shots", shots)
        self.queries = _positive_int("queries", queries)
        self.meta_batch = _positive_int("meta_batch", meta_batch)
        if self.ways > split.n_classes:
            raise ValueError(
                f"EpisodeSampler(ways={ways}) exceeds the split's {split.n_classes} classes; "
                f"use ways <= {split.n_classes}."
            )
        counts = split.counts()
        need = self.shots + self.queries
        short = [f"{split.class_names[c]!r} ({counts[c]})" for c in np.flatnonzero(counts < need)]
        if short:
            raise ValueError(
                f"EpisodeSampler: every class needs shots + queries = {need} images, but "
                f"class {', '.join(short)} has fewer; lower shots/queries or drop the class."
            )
        table = np.zeros((split.n_classes, counts.max()), np.int32)
        for c in range(split.n_classes):
            table[c, : counts[c]] = np.flatnonzero(split.labels == c)
        self.images = jnp.asarray(split.images)
        self.table = jnp.asarray(table)
        self.counts = jnp.asarray(counts, dtype=jnp.int32)

    @property
    def n_classes(self) -> int:
        return self.table.shape[0]

    @eqx.filter_jit
    def sample(self, key: jax.Array) -> Episodes:
        """B independent tasks (module docstring), a pure function of ``key``.

        Jitted (compiled once per sampler shape); inside a caller's jit it is inlined.
        """
        k_classes, k_images = jax.random.split(key)
        batch = (self.meta_batch,)
        classes = distinct_indices(k_classes, jnp.full(batch, self.n_classes), self.ways)
        picks = distinct_indices(k_images, self.counts[classes], self.shots + self.queries)
        rows = self.table[classes[..., None], picks]  # (B, ways, shots + queries) image rows
        support = rows[..., : self.shots].reshape(self.meta_batch, -1)
        query = rows[..., self.shots :].reshape(self.meta_batch, -1)
        return Episodes(
            self.images[support],
            self._labels(self.shots),
            self.images[query],
            self._labels(self.queries),
        )

    def _labels(self, per_class: int) -> jax.Array:
        """(B, ways * per_class): label j for the j-th chosen class, examples grouped by label."""
        labels = jnp.repeat(jnp.arange(self.ways, dtype=jnp.int32), per_class)
        return jnp.broadcast_to(labels, (self.meta_batch, labels.size))

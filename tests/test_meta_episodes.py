"""Episode sampler, class-disjoint splits and normalisation (bilevel.meta.episodes).

The sampler is checked on a split whose every image holds its own row number, so each episode
can be traced back to the rows and classes it drew. One compiled call draws 4000 tasks: every
task is checked exactly (distinct classes, distinct images of the right class, labels
consistent) and the frequencies against their exact probabilities, within 5 binomial standard
deviations (a fixed key, so the check is deterministic; 5 sd keeps it valid for any key with
probability > 1 - 1e-4 over the ~150 counts checked).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bilevel.meta.episodes import (
    Episodes,
    EpisodeSampler,
    FewShotSplit,
    distinct_indices,
    normalize_splits,
    split_by_classes,
)

COUNTS = (5, 6, 7, 8, 9, 10, 11)  # images per class; class 0 has exactly shots + queries
WAYS, SHOTS, QUERIES, TASKS = 3, 2, 3, 4000


def numbered_split() -> FewShotSplit:
    """Image i is the constant i (exact in float32); classes interleaved in a shuffled order."""
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(7), COUNTS))
    images = np.broadcast_to(
        np.arange(len(labels), dtype=np.float32)[:, None, None, None], (len(labels), 1, 2, 3)
    )
    names = tuple(f"class{c}" for c in range(7))
    return FewShotSplit(images.copy(), labels.astype(np.int32), np.arange(10, 17), names)


def rows_of(images) -> np.ndarray:
    return np.asarray(images[..., 0, 0, 0]).astype(np.int64)


def within(count, n, p, sd=5.0) -> bool:
    return bool(np.all(np.abs(count - n * p) <= sd * np.sqrt(n * p * (1 - p))))


@pytest.fixture(scope="module")
def drawn():
    split = numbered_split()
    sampler = EpisodeSampler(split, WAYS, SHOTS, QUERIES, meta_batch=TASKS)
    return split, sampler, sampler.sample(jax.random.key(0))


def test_shapes_dtypes_and_labels(drawn):
    _, sampler, ep = drawn
    assert isinstance(ep, Episodes)
    assert ep.support_images.shape == (TASKS, WAYS * SHOTS, 1, 2, 3)
    assert ep.query_images.shape == (TASKS, WAYS * QUERIES, 1, 2, 3)
    assert ep.support_images.dtype == ep.query_images.dtype == jnp.float32
    assert ep.support_labels.dtype == ep.query_labels.dtype == jnp.int32
    np.testing.assert_array_equal(
        ep.support_labels, np.tile(np.repeat(np.arange(WAYS), SHOTS), (TASKS, 1))
    )
    np.testing.assert_array_equal(
        ep.query_labels, np.tile(np.repeat(np.arange(WAYS), QUERIES), (TASKS, 1))
    )
    shapes = jax.eval_shape(lambda s, k: s.sample(k), sampler, jax.random.key(1))
    assert [a.shape for a in shapes] == [a.shape for a in ep]  # static: fixed by the config


def test_every_task_is_a_valid_episode(drawn):
    split, _, ep = drawn
    support = rows_of(ep.support_images).reshape(TASKS, WAYS, SHOTS)
    query = rows_of(ep.query_images).reshape(TASKS, WAYS, QUERIES)
    rows = np.concatenate([support, query], axis=2)  # (task, label, image)
    flat = np.sort(rows.reshape(TASKS, -1), axis=1)
    assert np.all(np.diff(flat, axis=1) > 0)  # distinct images, so support and query disjoint
    classes = split.labels[rows]
    assert np.all(classes == classes[:, :, :1])  # one class per label, support and query alike
    chosen = np.sort(classes[:, :, 0], axis=1)
    assert np.all(np.diff(chosen, axis=1) > 0)  # distinct classes per task


def test_draws_are_uniform(drawn):
    split, _, ep = drawn
    support = rows_of(ep.support_images).reshape(TASKS, WAYS, SHOTS)
    classes = split.labels[support[:, :, 0]]  # (task, label) -> class
    per_label = np.stack([np.bincount(classes[:, j], minlength=7) for j in range(WAYS)])
    assert within(per_label, TASKS, 1 / 7)  # each label is each class w.p. 1/7: random order
    chosen = np.bincount(classes.reshape(-1), minlength=7)
    # given its class is chosen, an image is in the support w.p. shots / n_c
    in_support = np.bincount(support.reshape(-1), minlength=len(split.labels))
    n_c = np.asarray(COUNTS)[split.labels]
    assert within(in_support, chosen[split.labels], SHOTS / n_c)
    assert within(chosen, TASKS, WAYS / 7)


def test_distinct_indices_every_ordered_draw_equally_likely():
    n, k = 4, 2
    draws = np.asarray(distinct_indices(jax.random.key(1), np.full(24000, n), k))
    assert draws.shape == (24000, k) and draws.min() >= 0 and draws.max() < n
    codes = draws @ (n ** np.arange(k))  # each ordered tuple -> an integer
    _, count = np.unique(codes, return_counts=True)
    outcomes = int(np.prod(np.arange(n - k + 1, n + 1)))  # n! / (n - k)! ordered draws
    assert len(count) == outcomes and within(count, 24000, 1 / outcomes)


def test_same_key_same_episode_jit_and_vmap(drawn):
    _, sampler, ep = drawn
    keys = jnp.stack([jax.random.key(0), jax.random.key(1)])
    again = [sampler.sample(k) for k in keys]  # compiled once for the fixture: cached
    # the sampler as an argument of a jitted, vmapped function (how a training step uses it)
    batched = jax.jit(jax.vmap(lambda s, k: s.sample(k), in_axes=(None, 0)))(sampler, keys)
    for a, b, c in zip(ep, again[0], batched, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c[0])
    for a, c in zip(again[1], batched, strict=True):
        np.testing.assert_array_equal(a, c[1])
    assert not np.array_equal(again[0].support_images, again[1].support_images)


def test_sampler_rejects_bad_settings():
    split = numbered_split()
    with pytest.raises(ValueError, match=r"ways=8\) exceeds the split's 7 classes"):
        EpisodeSampler(split, 8, 1, 1, 1)
    for name, bad in [("ways", 0), ("shots", -1), ("queries", 2.0), ("meta_batch", True)]:
        kwargs = dict(ways=2, shots=1, queries=1, meta_batch=1) | {name: bad}
        with pytest.raises(
            ValueError, match=rf"EpisodeSampler\({name}=...\) must be a positive int"
        ):
            EpisodeSampler(split, **kwargs)
    with pytest.raises(ValueError, match=r"class 'class0' \(5\), 'class1' \(6\) has fewer"):
        EpisodeSampler(split, 2, 3, 4, 1)


def test_split_by_classes_relabels_in_list_order():
    images = np.arange(10, dtype=np.float32).reshape(10, 1, 1, 1)
    labels = np.array([0, 1, 2, 3, 4, 0, 1, 2, 3, 4])
    names = ("a", "b", "c", "d", "e")
    first, second = split_by_classes(images, labels, [[3, 1], [4]], names)
    np.testing.assert_array_equal(first.images[:, 0, 0, 0], [1, 3, 6, 8])
    np.testing.assert_array_equal(first.labels, [1, 0, 1, 0])  # class 3 -> label 0
    assert first.class_names == ("d", "b") and list(first.class_ids) == [3, 1]
    assert second.class_names == ("e",) and list(second.labels) == [0, 0]
    with pytest.raises(ValueError, match="class 1 is in list 0 and again in list 1"):
        split_by_classes(images, labels, [[3, 1], [1]])
    with pytest.raises(ValueError, match=r"classes \[7\] have no image"):
        split_by_classes(images, labels, [[7]])


def test_split_checks_its_arrays():
    ok = dict(images=np.zeros((3, 1, 2, 2), np.float32), labels=np.array([0, 1, 1]))
    ids, names = np.arange(2), ("a", "b")
    with pytest.raises(ValueError, match="must be float32 of shape"):
        FewShotSplit(np.zeros((3, 2, 2), np.float32), ok["labels"], ids, names)
    with pytest.raises(ValueError, match=r"must lie in 0\.\.1"):
        FewShotSplit(ok["images"], np.array([0, 1, 2]), ids, names)
    with pytest.raises(ValueError, match=r"none for \['b'\]"):
        FewShotSplit(ok["images"], np.array([0, 0, 0]), ids, names)


def test_normalisation_uses_train_statistics_only():
    rng = np.random.default_rng(0)
    raw = [rng.normal(loc, 3.0, (n, 2, 4, 4)).astype(np.float32) for loc, n in [(1, 50), (9, 20)]]
    train, val = (FewShotSplit(x, np.zeros(len(x), np.int32), np.arange(1), ("a",)) for x in raw)
    ntrain, nval = normalize_splits(train, val)
    np.testing.assert_allclose(ntrain.images.mean(axis=(0, 2, 3)), 0, atol=1e-5)
    np.testing.assert_allclose(ntrain.images.std(axis=(0, 2, 3)), 1, atol=1e-5)
    x = raw[0].astype(np.float64)
    mean, std = x.mean(axis=(0, 2, 3))[:, None, None], x.std(axis=(0, 2, 3))[:, None, None]
    np.testing.assert_allclose(nval.images, (raw[1] - mean) / std, rtol=1e-5, atol=1e-5)
    (fixed,) = normalize_splits(val, mean=[1.0, 2.0], std=[2.0, 4.0])
    np.testing.assert_allclose(fixed.images[:, 1], (raw[1][:, 1] - 2.0) / 4.0, rtol=1e-6)
    with pytest.raises(ValueError, match="give both mean= and std="):
        normalize_splits(train, mean=[0.0, 0.0])
    with pytest.raises(ValueError, match=r"one value per channel \(2\)"):
        normalize_splits(train, mean=[0.0], std=[1.0])
    with pytest.raises(ValueError, match="std must be positive"):
        normalize_splits(train, mean=[0.0, 0.0], std=[1.0, 0.0])

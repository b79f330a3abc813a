"""The Experiment 1 stream (bl.problems.imbalanced_stream): per-round data shapes, phase
proportions ~ rho^i, inverse-frequency weights u_j = 1/p_j, disjoint train/validation pools, the
CNN's shapes and its batch-statistics BatchNorm, and the levels' definitions.

Break checked once: drawing validation labels from the uniform distribution instead of the
phase's (``p=None`` in ``draw``) fails ``test_labels_follow_the_phase_proportions``.

Also the reference hypergradient the experiment's regret is measured with
(``bl.metrics.reference_hypergradient``) where g is not convex in y, as for the CNN (issue #35).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bilevel.analysis.metrics import reference_hypergradient
from bilevel.problems.imbalanced_stream import (
    balanced_accuracy,
    cnn4,
    imbalanced_stream,
    init_cnn4,
    inverse_frequency,
    phase_proportions,
)
from bilevel.problems.models import softmax_cross_entropy


def images(n=600, side=16, seed=0):
    """Fake images whose pixel (0, 0) encodes the image's index (to trace pool membership)."""
    rng = np.random.default_rng(seed)
    a = rng.random((n, side, side))
    a[:, 0, 0] = np.arange(n) / n
    return a, np.arange(n) % 10


def test_shapes_and_start():
    X, y = images()
    p = imbalanced_stream(X, y, rounds_per_phase=3, n_train=8, n_val=5, channels=4)
    assert p.horizon == 12
    assert p.inner_data["images"].shape == (12, 8, 16, 16)
    assert p.inner_data["labels"].shape == (12, 8)
    assert p.outer_data["images"].shape == (12, 5, 16, 16)
    assert p.outer_data["weights"].shape == (12, 5)
    np.testing.assert_array_equal(p.x0["scale"], np.ones(10))
    np.testing.assert_array_equal(p.x0["offset"], np.zeros(10))
    assert p.y0["fc"]["w"].shape == (4, 10)  # 16 -> 8 -> 4 -> 2 -> 1: 4 channels x 1 x 1
    assert p.reference.phase(np.array([1, 3, 4, 12])).tolist() == [1, 1, 2, 4]


def test_labels_follow_the_phase_proportions():
    X, y = images(2000)
    rhos = (0.6, 0.9)
    p = imbalanced_stream(X, y, rhos=rhos, rounds_per_phase=40, n_train=100, n_val=100)
    for level in (p.inner_data, p.outer_data):
        labels = np.asarray(level["labels"])
        for phase, rho in enumerate(rhos):
            chunk = labels[40 * phase : 40 * (phase + 1)].ravel()  # 4000 draws
            freq = np.bincount(chunk, minlength=10) / chunk.size
            expected = phase_proportions(rho)
            # binomial standard error sqrt(p (1 - p) / 4000) <= 0.008: 4 sigma
            np.testing.assert_allclose(freq, expected, atol=0.033)
    np.testing.assert_allclose(
        phase_proportions(0.5)[:3] / phase_proportions(0.5)[0], [1, 0.5, 0.25]
    )
    np.testing.assert_allclose(phase_proportions(0.7).sum(), 1.0)


def test_weights_are_inverse_class_frequencies():
    X, y = images()
    p = imbalanced_stream(X, y, rhos=(0.6, 0.8), rounds_per_phase=2, n_train=4, n_val=30)
    labels = np.asarray(p.outer_data["labels"])
    w = np.asarray(p.outer_data["weights"])
    for t in range(4):
        rho = 0.6 if t < 2 else 0.8
        np.testing.assert_allclose(w[t], inverse_frequency(rho)[labels[t]], rtol=1e-6)
        np.testing.assert_allclose(p.reference.weights[t] * p.reference.proportions[t], 1.0)
    # E_p[u_b] = J: the weighted loss is J x the class-balanced loss in expectation
    assert np.isclose(np.sum(phase_proportions(0.6) * inverse_frequency(0.6)), 10.0)


def test_train_and_validation_pools_are_disjoint():
    X, y = images(500)
    p = imbalanced_stream(X, y, rounds_per_phase=5, n_train=30, n_val=30, val_fraction=0.3)
    tr = set(np.round(np.asarray(p.inner_data["images"])[..., 0, 0].ravel() * 500).astype(int))
    val = set(np.round(np.asarray(p.outer_data["images"])[..., 0, 0].ravel() * 500).astype(int))
    assert tr and val and not tr & val


def test_levels_are_the_weighted_and_adjusted_cross_entropies():
    X, y = images()
    p = imbalanced_stream(X, y, rounds_per_phase=1, n_train=6, n_val=7, weight_decay=0.01)
    t = jnp.asarray(2, jnp.int32)
    od, idd = p.evaluation_data(t)
    x = {"scale": jnp.linspace(0.5, 2.0, 10), "offset": jnp.linspace(-1.0, 1.0, 10)}
    theta = p.y0
    f, g = p.at_round(t)
    ce_val = softmax_cross_entropy(cnn4(theta, od["images"]), od["labels"])
    np.testing.assert_allclose(f(x, theta, od), jnp.mean(od["weights"] * ce_val), rtol=1e-6)
    logits = cnn4(theta, idd["images"]) * x["scale"][None, :] + x["offset"][None, :]
    decay = 0.005 * sum(jnp.sum(a**2) for a in jax.tree.leaves(theta))
    expected = jnp.mean(softmax_cross_entropy(logits, idd["labels"])) + decay
    np.testing.assert_allclose(g(x, theta, idd), expected, rtol=1e-6)
    # x = (1, 0): plain cross-entropy
    x0 = p.x0
    plain = jnp.mean(softmax_cross_entropy(cnn4(theta, idd["images"]), idd["labels"]))
    np.testing.assert_allclose(g(x0, theta, idd), plain + decay, rtol=1e-6)


def test_cnn_batchnorm_uses_the_given_statistics():
    theta = init_cnn4(3, 28, key=1)
    assert theta["fc"]["w"].shape == (3, 10)  # 28 -> 14 -> 7 -> 3 -> 1
    a = jnp.asarray(np.random.default_rng(0).random((5, 28, 28)))
    b = jnp.asarray(np.random.default_rng(1).random((9, 28, 28)))
    own = cnn4(theta, a)
    assert own.shape == (5, 10)
    # normalising by a batch's own statistics = passing that batch as norm_images
    np.testing.assert_allclose(cnn4(theta, a, norm_images=a), own, rtol=1e-5, atol=1e-6)
    # per-sample outputs under fixed statistics do not depend on the rest of the batch
    fixed = cnn4(theta, a, norm_images=b)
    np.testing.assert_allclose(cnn4(theta, a[:2], norm_images=b), fixed[:2], rtol=1e-5, atol=1e-6)
    assert not np.allclose(fixed, own)
    with pytest.raises(ValueError, match="too small"):
        init_cnn4(3, 8)
    assert init_cnn4(3, 8, blocks=1)["fc"]["w"].shape == (48, 10)


def test_balanced_accuracy_is_the_mean_per_class_accuracy():
    labels = jnp.asarray([0, 0, 0, 1, 2])
    logits = jax.nn.one_hot(jnp.asarray([0, 1, 1, 1, 0]), 10)  # class 0: 1/3, class 1: 1, 2: 0
    np.testing.assert_allclose(balanced_accuracy(logits, labels), (1 / 3 + 1 + 0) / 3)


def test_bad_input_is_refused():
    X, y = images(40)
    with pytest.raises(ValueError, match="no image of classes"):
        imbalanced_stream(X, np.where(y == 9, 0, y))
    with pytest.raises(ValueError, match="shapes"):
        imbalanced_stream(X.reshape(40, -1), y)
    with pytest.raises(ValueError, match="n_train"):
        imbalanced_stream(X, y, n_train=0)


def test_reference_hypergradient_where_the_dominant_curvature_is_negative():
    """Issue #35: on the CNN the power iteration can settle on a direction of negative
    curvature (Rayleigh quotient -12.4 at F2OBO-SL's seed 4, round 32 of the quick run); a 1/L
    step from that quotient was 1e30 and the regret term NaN. Here g = -cos(y1) + (y2 - x)^2 / 4
    at y1 = 3 (curvature cos 3 = -0.99, dominating the 0.5 along y2): y* = (0, x), and with
    f = (y2 - 1)^2 / 2, grad F(x) = x - 1."""

    def inner(x, y, _):
        return -jnp.cos(y[0]) + 0.25 * (y[1] - x[0]) ** 2

    def outer(x, y, _):
        return 0.5 * (y[1] - 1.0) ** 2

    x, y = jnp.array([3.0]), jnp.array([3.0, 0.0])
    grad = reference_hypergradient(outer, inner, x, y, None, None, gd_steps=60, cg_steps=4)
    assert np.isfinite(np.asarray(grad)).all()
    np.testing.assert_allclose(grad, x - 1.0, rtol=1e-4)

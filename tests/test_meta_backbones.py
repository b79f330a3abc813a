"""The few-shot backbones (bilevel.meta.backbones: CNN4, ResNet-12; spec pzobo.md E4, P15).

Exact answers: shapes and parameter counts from the architectures' formulas, BatchNorm and the
convolution against direct NumPy loops, max pooling's floor semantics (values and gradient) on an
odd size. Then the contract the meta-learners rely on: a model is a pytree of float arrays that
goes through jit, ravel_pytree and PZOBO's direction sampler, max pooling has exact second
derivatives inside a scan, and ResNet-12 runs forward and backward on one 84x84 episode.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from bilevel.meta.backbones import CNN4, BatchNorm, Conv2d, ResNet12, max_pool2
from bilevel.solvers.zeroth_order.pzobo import sample_directions

#: one compiled forward pass per model structure and input shape, shared by the tests
forward = jax.jit(lambda model, images: model(images))


def n_params(model) -> int:
    return sum(leaf.size for leaf in jax.tree.leaves(model))


def float32_leaves(model) -> bool:
    return all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(model))


# ---- CNN4 ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "side, channels, features",
    # side after four floor halvings: 28 -> 1, 32 -> 2, 84 -> 5 (the spec's 32 * 5 * 5 = 800)
    [(28, 1, 32 * 1), (32, 1, 32 * 4), (84, 3, 32 * 25)],
)
def test_cnn4_shapes_and_feature_dim(side, channels, features):
    model = CNN4(channels, side, key=jax.random.key(0))
    # traced, not run (the forward pass runs in the tests below)
    out = jax.eval_shape(model, jax.ShapeDtypeStruct((3, channels, side, side), jnp.float32))
    assert model.feature_dim == features
    assert out.shape == (3, features) and out.dtype == jnp.float32
    # per layer: a 3x3 kernel and a bias (PyTorch's nn.Conv2d default), BatchNorm scale + shift
    hidden = 32
    expected = (9 * channels * hidden + hidden + 2 * hidden) + 3 * (9 * hidden**2 + 3 * hidden)
    assert n_params(model) == expected and float32_leaves(model)


# ---- layers against NumPy --------------------------------------------------------------------
def test_batchnorm_matches_numpy_reference():
    rng = np.random.default_rng(0)
    x = rng.normal(2.0, 3.0, size=(4, 3, 5, 6))
    gamma, beta = rng.normal(size=3), rng.normal(size=3)
    norm = BatchNorm(3, dtype=jnp.float64)
    assert np.all(np.asarray(norm.weight) == 1) and np.all(np.asarray(norm.bias) == 0)
    norm = eqx.tree_at(lambda m: (m.weight, m.bias), norm, (jnp.asarray(gamma), jnp.asarray(beta)))
    expected = np.empty_like(x)
    for c in range(3):
        channel = x[:, c]  # every sample and pixel of channel c
        var = np.mean((channel - channel.mean()) ** 2)  # biased (PyTorch's normalisation)
        expected[:, c] = (channel - channel.mean()) / np.sqrt(var + 1e-5) * gamma[c] + beta[c]
    # float64 throughout: the two computations differ only by rounding
    np.testing.assert_allclose(np.asarray(norm(jnp.asarray(x))), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kernel", [3, 1])
def test_conv_matches_numpy_loop(kernel):
    rng = np.random.default_rng(1)
    w, bias, x = (
        rng.normal(size=(3, 2, kernel, kernel)),
        rng.normal(size=3),
        rng.normal(size=(2, 2, 4, 5)),
    )
    conv = Conv2d(jnp.asarray(w), jnp.asarray(bias))
    p = kernel // 2
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    expected = np.zeros((2, 3, 4, 5))
    for n, o, i, j in np.ndindex(*expected.shape):  # cross-correlation, as PyTorch's Conv2d
        window = xp[n, :, i : i + kernel, j : j + kernel]
        expected[n, o, i, j] = np.sum(window * w[o]) + bias[o]
    np.testing.assert_allclose(np.asarray(conv(jnp.asarray(x))), expected, rtol=1e-12, atol=1e-12)


def test_max_pool_floor_semantics_on_odd_size():
    x = jnp.asarray(np.random.default_rng(2).permutation(35).reshape(1, 1, 5, 7), jnp.float64)
    out = max_pool2(x)
    # floor(5/2) x floor(7/2): the last row and column are dropped, as PyTorch's MaxPool2d(2)
    assert out.shape == (1, 1, 2, 3)
    kept = np.asarray(x)[0, 0, :4, :6].reshape(2, 2, 3, 2)
    np.testing.assert_array_equal(np.asarray(out)[0, 0], kept.max(axis=(1, 3)))
    # d sum(out) / dx: 1 at each window's (unique) arg-max, 0 elsewhere, dropped row/column too
    grad = np.asarray(jax.grad(lambda a: jnp.sum(max_pool2(a)))(x))[0, 0]
    # (the entries are distinct, so the arg-maxes are exactly the entries equal to an output)
    hits = np.isin(np.asarray(x)[0, 0], np.asarray(out)[0, 0])
    assert hits.sum() == 6 and not hits[4, :].any() and not hits[:, 6].any()
    np.testing.assert_array_equal(grad, hits.astype(float))


def test_max_pool_second_derivative_inside_scan():
    """MAML differentiates the backbone twice, in a loop: the Hessian-vector product of
    h(x) = sum(max_pool2(x)^2) is exactly 2 v on each window's arg-max and 0 elsewhere."""
    x = jnp.asarray(np.random.default_rng(3).permutation(35).reshape(1, 1, 5, 7), jnp.float64)
    directions = jnp.asarray(np.random.default_rng(4).normal(size=(2, 1, 1, 5, 7)))

    def hvp(_, v):
        grad = jax.grad(lambda a: jnp.sum(max_pool2(a) ** 2))
        return None, jax.jvp(grad, (x,), (v,))[1]

    _, hvps = jax.jit(lambda vs: jax.lax.scan(hvp, None, vs))(directions)
    mask = np.isin(np.asarray(x), np.asarray(max_pool2(x)))  # the arg-maxes (distinct entries)
    np.testing.assert_allclose(np.asarray(hvps), 2 * mask * np.asarray(directions), atol=1e-12)


# ---- ResNet-12 -------------------------------------------------------------------------------
def resnet12_count(in_channels=3, widths=(64, 160, 320, 640)) -> int:
    """Layer by layer: per block three bias-free 3x3 convolutions (c_in -> c, c -> c, c -> c),
    a bias-free 1x1 shortcut convolution (c_in -> c) and four affine BatchNorms of c channels."""
    total, c_in = 0, in_channels
    for c in widths:
        convs3 = 3 * 3 * (c_in * c + c * c + c * c)
        shortcut = c_in * c
        norms = 4 * (c + c)
        total += convs3 + shortcut + norms
        c_in = c
    return total


def test_resnet12_parameter_count_without_allocating():
    shapes = jax.eval_shape(lambda k: ResNet12(key=k), jax.random.key(0))
    count = n_params(shapes)
    assert count == resnet12_count() == 12_424_320
    assert f"{count / 1e6:.3g}" == "12.4"  # the spec's "about 12.4M", to 3 significant figures
    assert shapes.feature_dim == 640 and float32_leaves(shapes)


def test_resnet12_forward_and_backward_on_one_episode():
    """One 84x84 5-way 1-shot episode with 1 query per class: 10 images, one batch."""
    model = ResNet12(key=jax.random.key(0))
    rng = np.random.default_rng(1)
    images = rng.normal(size=(10, 3, 84, 84)).astype(np.float32)
    projection = rng.normal(size=(640, 5)).astype(np.float32)  # a fixed linear head

    def loss(m, images, projection):
        features = m(images)
        return jnp.mean(jax.nn.logsumexp(features @ projection, axis=-1)), features

    (value, features), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(
        model, images, projection
    )
    assert features.shape == (10, 640) and features.dtype == jnp.float32
    assert np.all(np.isfinite(features)) and np.isfinite(value)
    for leaf in map(np.asarray, jax.tree.leaves(grads)):  # on the host: no per-shape programs
        assert np.all(np.isfinite(leaf)) and np.any(leaf != 0)


# ---- the pytree contract ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_cnn():
    return CNN4(1, 16, hidden=4, key=jax.random.key(3))  # 16 -> 1: 4 features


def test_model_goes_through_jit_ravel_and_direction_sampling(small_cnn):
    images = np.random.default_rng(4).normal(size=(6, 1, 16, 16)).astype(np.float32)
    flat, unravel = ravel_pytree(small_cnn)
    assert flat.shape == (n_params(small_cnn),) and flat.dtype == jnp.float32
    # a model rebuilt from the flat vector (inside jit) is the same model
    rebuilt = jax.jit(lambda v: forward(unravel(v), images))(flat)
    np.testing.assert_array_equal(np.asarray(rebuilt), np.asarray(forward(small_cnn, images)))

    @jax.jit
    def perturbed(model, key):  # PZOBO's per-tensor unit directions (spec 3.4 item 1): phi + mu u
        u, _ = sample_directions(key, model, 1, "sphere_unscaled_per_tensor")
        return jax.tree.map(lambda a, b: a + 0.1 * b[0], model, u), u

    moved, u = perturbed(small_cnn, jax.random.key(5))
    norms = [np.linalg.norm(np.asarray(leaf)[0]) for leaf in jax.tree.leaves(u)]
    np.testing.assert_allclose(norms, 1.0, rtol=1e-5)
    assert jax.tree.structure(moved) == jax.tree.structure(small_cnn)
    assert forward(moved, images).shape == (6, small_cnn.feature_dim)


def test_batch_statistics_couple_the_images_of_a_call(small_cnn):
    """Spec P15: with batch statistics, one image's features depend on the rest of the batch."""
    images = np.random.default_rng(7).normal(size=(6, 1, 16, 16)).astype(np.float32)
    other = images.copy()
    other[3] *= 5.0  # only image 3 changes ...
    before, after = np.asarray(forward(small_cnn, images)), np.asarray(forward(small_cnn, other))
    assert not np.allclose(before[0], after[0])  # ... and image 0's features move


# ---- bad input -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "build, match",
    [
        (lambda k: CNN4(0, 84, key=k), r"CNN4\(in_channels=...\)"),
        (lambda k: CNN4(3, 8, key=k), r"CNN4\(image_size=...\) must be an int >= 16"),
        (lambda k: CNN4(3, 84, hidden=2.5, key=k), r"CNN4\(hidden=...\)"),
        (lambda k: ResNet12(channels=(64, 160, 320), key=k), r"ResNet12\(channels=...\)"),
    ],
)
def test_bad_construction_raises(build, match):
    with pytest.raises(ValueError, match=match):
        build(jax.random.key(0))


def test_bad_images_raise(small_cnn):
    with pytest.raises(ValueError, match=r"NCHW"):
        small_cnn(jnp.zeros((2, 16, 16, 1)))  # NHWC
    with pytest.raises(ValueError, match=r"must be 16x16"):
        small_cnn(jnp.zeros((2, 1, 20, 20)))
    with pytest.raises(ValueError, match=r"at least 16x16"):
        small_cnn(jnp.zeros((2, 1, 12, 12)))

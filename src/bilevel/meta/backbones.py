r"""Few-shot backbones: CNN4 and ResNet-12 as equinox modules (PZOBO's Sec. 4.3 and App. B.4).

A backbone phi is the outer variable x of the meta-learning bilevel problem (paper eq. 9): it maps
images ``(n, C, H, W)`` (float, NCHW as PyTorch's) to features ``(n, feature_dim)``, on which each
task fits a linear head (:mod:`bilevel.meta.heads`). Both models are pure pytrees whose only leaves
are float arrays (convolution kernels and biases, BatchNorm scales and shifts); every other
attribute is a static field. So ``jax.tree.map``, ``jax.flatten_util.ravel_pytree``,
``jax.grad`` and :func:`bilevel.solvers.zeroth_order.pzobo.sample_directions` work on a whole
model, and ``phi + mu * u`` is ``jax.tree.map(lambda a, b: a + mu * b, model, u)``.

* :class:`CNN4`: 4 x [conv3x3 pad 1 -> ReLU -> maxpool 2 -> BatchNorm], then flatten; the
  official code's ``MiniimageNetFeats(32)``: 800 features at 84x84.
* :class:`ResNet12`: 4 residual blocks of widths 64-160-320-640 and a global average pool; the
  learn2learn / MetaOptNet ResNet-12 the official code adapts (``resnet12.py``): 640 features,
  12,424,320 parameters.

BatchNorm uses batch statistics only (PyTorch's ``track_running_stats=False``, the code's
CNN4): there are no running averages, so a model holds no state besides its parameters and
behaves the same in training and at meta-test. The price: **the features of one image
depend on the other images of the batch** through the per-channel mean and variance. The
meta-learners therefore apply a backbone to one task's support set, and separately to its query
set, never to a batch mixing tasks (as the official code's ``Task.compute_feats`` and
``val_loss_f`` do), and PZOBO's perturbed and unperturbed feature passes see the same
batch-statistics behaviour.

References:
    Sow, Ji, Liang. "On the Convergence Theory for Hessian-Free Bilevel Algorithms." NeurIPS 2022
    (PZOBO; Sec. 4.3 and App. B.4, the meta-learning experiment).
    Vinyals, Blundell, Lillicrap, Kavukcuoglu, Wierstra. "Matching Networks for One Shot
    Learning." NeurIPS 2016 (the 4-layer convolutional backbone).
    Mishra, Rohaninejad, Chen, Abbeel. "A Simple Neural Attentive Meta-Learner." ICLR 2018, and
    Lee, Maji, Ravichandran, Soatto. "Meta-Learning with Differentiable Convex Optimization."
    CVPR 2019 (ResNet-12).
    Ioffe, Szegedy. "Batch Normalization." ICML 2015.
    He, Zhang, Ren, Sun. "Delving Deep into Rectifiers." ICCV 2015 (the initialisation).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "he_normal_kernels",
    "Conv2d",
    "BatchNorm",
    "relu",
    "leaky_relu",
    "max_pool2",
    "global_avg_pool",
    "CNN4",
    "ResNet12",
    "RESNET12_CHANNELS",
]

#: the widths of the four residual blocks of the few-shot ResNet-12
RESNET12_CHANNELS = (64, 160, 320, 640)

#: smallest input side: four 2x2 max pools (floor semantics) must leave at least one pixel
_MIN_SIDE = 16


# ---- layers ----------------------------------------------------------------------------------
def he_normal_kernels(
    key: jax.Array, shapes: Sequence[tuple[int, int, int, int]], dtype=jnp.float32
) -> list[jax.Array]:
    """He (Kaiming) normal OIHW kernels, ``N(0, 2 / fan_in)`` with ``fan_in = I k_h k_w`` (He et
    al., ICCV 2015, eq. 10), for several convolutions at once, from ONE normal draw of their total
    size split in order.

    One draw rather than one per kernel: JAX compiles its normal sampler once per output shape,
    and a ResNet-12's 16 kernels (13 distinct shapes) took 15 s to initialise eagerly on this
    shared 2-core CPU, almost all of it compiling samplers (about 2 s per new shape, measured);
    this way it is one compiled program per architecture (2.4 s for ResNet-12).

    Every convolution here is followed by a BatchNorm, which undoes any constant rescaling of its
    input, so the scale rule does not change the features (up to BatchNorm's eps): this fan-in
    rule and the fan-out rule of the code's ResNet-12 differ by a constant factor per kernel. The
    code's CNN4 keeps PyTorch's default (Kaiming-uniform kernels, uniform biases); its biases
    start at 0 here.
    """
    return _he_normal(key, tuple(tuple(int(d) for d in s) for s in shapes), jnp.dtype(dtype))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _he_normal(key: jax.Array, shapes: tuple[tuple[int, ...], ...], dtype) -> list[jax.Array]:
    sizes = [math.prod(shape) for shape in shapes]
    flat = jax.random.normal(key, (sum(sizes),), dtype)
    pieces = jnp.split(flat, np.cumsum(sizes)[:-1].tolist())
    return [
        math.sqrt(2.0 / math.prod(shape[1:])) * piece.reshape(shape)
        for shape, piece in zip(shapes, pieces, strict=True)
    ]


class Conv2d(eqx.Module):
    """A ``k x k`` convolution (odd k), stride 1, zero padding ``k // 2`` ("same"), of NCHW
    batches: ``lax.conv_general_dilated`` with an OIHW kernel, PyTorch's ``nn.Conv2d``
    (a cross-correlation). Build the kernels with :func:`he_normal_kernels`.

    XLA:CPU (jaxlib 0.10.2) runs this convolution 3-12x slower inside a rolled
    ``lax.scan``/``while`` loop than outside one (CNN4 gradient steps on 100 images, measured by
    ``benchmarks/meta_backbones.py``): on CPU a loop over backbone evaluations (MAML's inner loop,
    a scan over meta-steps) should be a Python loop or ``lax.scan(..., unroll=True)``, which run
    at the outside-loop speed.
    """

    weight: jax.Array  # (out_channels, in_channels, k, k)
    bias: jax.Array | None = None  # (out_channels,), or None for a bias-free convolution

    def __call__(self, x: jax.Array) -> jax.Array:
        p = self.weight.shape[-1] // 2
        out = jax.lax.conv_general_dilated(
            x, self.weight, (1, 1), ((p, p), (p, p)), dimension_numbers=("NCHW", "OIHW", "NCHW")
        )
        if self.bias is not None:
            out = out + self.bias[None, :, None, None]
        return out


class BatchNorm(eqx.Module):
    r"""Per-channel batch normalisation with batch statistics only (Ioffe & Szegedy 2015, Alg. 1).

    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` with the mean and the biased variance of
    each channel over the batch and spatial axes (N, H, W) of the input: PyTorch's
    ``BatchNorm2d(momentum=1, affine=True, track_running_stats=False)`` in either mode. Affine
    ``weight`` starts at 1 and ``bias`` at 0. No running statistics are kept, so each
    output depends on the whole batch.
    """

    weight: jax.Array  # (channels,) scale gamma
    bias: jax.Array  # (channels,) shift beta
    eps: float = eqx.field(static=True)

    def __init__(self, channels: int, *, eps: float = 1e-5, dtype=jnp.float32):
        self.weight = jnp.ones((channels,), dtype)
        self.bias = jnp.zeros((channels,), dtype)
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        mean = jnp.mean(x, axis=(0, 2, 3), keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=(0, 2, 3), keepdims=True)
        scale = self.weight[None, :, None, None] * jax.lax.rsqrt(var + self.eps)
        return (x - mean) * scale + self.bias[None, :, None, None]


def relu(x: jax.Array) -> jax.Array:
    """``max(x, 0)``."""
    return jax.nn.relu(x)


def leaky_relu(x: jax.Array) -> jax.Array:
    """``x`` for ``x >= 0``, ``0.1 x`` below: ResNet-12's activation (PyTorch's LeakyReLU(0.1))."""
    return jax.nn.leaky_relu(x, negative_slope=0.1)


def max_pool2(x: jax.Array) -> jax.Array:
    """2x2 max pool, stride 2, of NCHW activations, with PyTorch's floor semantics: an odd last
    row or column is dropped (``lax.reduce_window`` with VALID padding), so H -> floor(H / 2).

    The initial value is the Python float -inf on purpose: JAX differentiates ``reduce_window``
    only when it recognises the max monoid from a literal init value; a ``jnp.array(-inf)``
    there fails reverse mode with "Linearization failed" (JAX 0.10.2, measured).
    """
    return jax.lax.reduce_window(x, -math.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")


def global_avg_pool(x: jax.Array) -> jax.Array:
    """``(n, C, H, W) -> (n, C)``: the mean over the spatial axes."""
    return jnp.mean(x, axis=(2, 3))


# ---- input checks ----------------------------------------------------------------------------
def _check_positive_int(value, arg: str, fn: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{fn}({arg}=...) must be an int >= {minimum}, got {value!r}.")
    return int(value)


def _check_images(images: jax.Array, in_channels: int, fn: str) -> None:
    """Shape checks on a call's input (static, so they run at trace time under jit)."""
    shape = tuple(images.shape)
    if len(shape) != 4 or shape[1] != in_channels:
        raise ValueError(
            f"{fn}(images) must be a batch (n, {in_channels}, H, W) in NCHW layout with "
            f"{in_channels} channel(s), got shape {shape}; move the channel axis second."
        )
    if min(shape[2:]) < _MIN_SIDE:
        raise ValueError(
            f"{fn}(images) must be at least {_MIN_SIDE}x{_MIN_SIDE} (four 2x2 max pools), got "
            f"{shape[2]}x{shape[3]}; pad or resize the images."
        )


def _floor_halvings(side: int, times: int = 4) -> int:
    for _ in range(times):
        side //= 2
    return side


# ---- CNN4 ------------------------------------------------------------------------------------
class _ConvPoolNorm(eqx.Module):
    """One CNN4 layer: conv3x3 (pad 1, with bias) -> ReLU -> maxpool 2 -> BatchNorm."""

    conv: Conv2d
    norm: BatchNorm

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.norm(max_pool2(relu(self.conv(x))))


class CNN4(eqx.Module):
    """The 4-layer convolutional few-shot backbone (Sec. 4.3's "CNN4", the code's
    ``MiniimageNetFeats(hidden)``).

    ``4 x [conv3x3 with hidden filters, pad 1 -> ReLU -> maxpool 2 -> BatchNorm(batch
    statistics, affine)]`` then flatten (channel-major, as PyTorch's ``nn.Flatten`` of NCHW):
    ``feature_dim = hidden * s^2`` with ``s`` the image side after four floor halvings (84 -> 5:
    800 features for hidden = 32; 32 -> 2: 128; 28 -> 1: 32). The convolutions keep their biases
    as in the code's ``nn.Conv2d`` (a ReLU separates them from the BatchNorm, so they are not
    redundant). ``model(images)`` maps ``(n, in_channels, image_size, image_size)`` to
    ``(n, feature_dim)``; the BatchNorm statistics couple the images of one call (module
    docstring).

    Args:
        in_channels: image channels (3 for miniImageNet, 1 for Fashion-MNIST).
        image_size: the side of the square input images (>= 16).
        hidden: filters per layer (the code's 32).
        key: PRNG key of the initialisation.
        dtype: parameter dtype; inputs are cast to it.

    Raises:
        ValueError: a non-integer or too small ``in_channels``, ``image_size`` or ``hidden``.
    """

    layers: tuple[_ConvPoolNorm, ...]
    in_channels: int = eqx.field(static=True)
    image_size: int = eqx.field(static=True)
    feature_dim: int = eqx.field(static=True)

    def __init__(
        self,
        in_channels: int,
        image_size: int,
        hidden: int = 32,
        *,
        key: jax.Array,
        dtype=jnp.float32,
    ):
        self.in_channels = _check_positive_int(in_channels, "in_channels", "CNN4")
        self.image_size = _check_positive_int(image_size, "image_size", "CNN4", _MIN_SIDE)
        hidden = _check_positive_int(hidden, "hidden", "CNN4")
        widths = (in_channels, hidden, hidden, hidden)
        kernels = he_normal_kernels(key, [(hidden, c, 3, 3) for c in widths], dtype)
        self.layers = tuple(
            _ConvPoolNorm(
                Conv2d(kernel, jnp.zeros((hidden,), dtype)), BatchNorm(hidden, dtype=dtype)
            )
            for kernel in kernels
        )
        self.feature_dim = hidden * _floor_halvings(image_size) ** 2

    def __call__(self, images: jax.Array) -> jax.Array:
        _check_images(images, self.in_channels, "CNN4")
        if images.shape[2:] != (self.image_size, self.image_size):
            raise ValueError(
                f"CNN4(images) must be {self.image_size}x{self.image_size} (the model's "
                f"image_size, which fixes feature_dim), got {images.shape[2]}x{images.shape[3]}."
            )
        h = images.astype(self.layers[0].conv.weight.dtype)
        for layer in self.layers:
            h = layer(h)
        return h.reshape(h.shape[0], self.feature_dim)


# ---- ResNet-12 -------------------------------------------------------------------------------
class _ResidualBlock(eqx.Module):
    """One ResNet-12 block (learn2learn's ``BasicBlock`` with drop rate 0)::

        out = lrelu(bn1(conv1(x)));  out = lrelu(bn2(conv2(out)));  out = bn3(conv3(out))
        out = maxpool2(lrelu(out + bn_s(conv_s(x))))

    with 3x3 bias-free convolutions and a 1x1 bias-free convolution on the shortcut.
    """

    conv1: Conv2d
    norm1: BatchNorm
    conv2: Conv2d
    norm2: BatchNorm
    conv3: Conv2d
    norm3: BatchNorm
    shortcut_conv: Conv2d
    shortcut_norm: BatchNorm

    def __init__(self, kernels: Sequence[jax.Array]):
        """``kernels``: the three 3x3 kernels and the 1x1 shortcut kernel, in that order."""
        self.conv1, self.conv2, self.conv3, self.shortcut_conv = map(Conv2d, kernels)
        channels, dtype = kernels[0].shape[0], kernels[0].dtype
        self.norm1, self.norm2, self.norm3, self.shortcut_norm = (
            BatchNorm(channels, dtype=dtype) for _ in range(4)
        )

    @staticmethod
    def kernel_shapes(c_in: int, c: int) -> list[tuple[int, int, int, int]]:
        return [(c, c_in, 3, 3), (c, c, 3, 3), (c, c, 3, 3), (c, c_in, 1, 1)]

    def __call__(self, x: jax.Array) -> jax.Array:
        out = leaky_relu(self.norm1(self.conv1(x)))
        out = leaky_relu(self.norm2(self.conv2(out)))
        out = self.norm3(self.conv3(out))
        return max_pool2(leaky_relu(out + self.shortcut_norm(self.shortcut_conv(x))))


class ResNet12(eqx.Module):
    """The few-shot ResNet-12 (Sec. 4.3's "ResNet-12", the code's ``resnet12.py`` from learn2learn
    after MetaOptNet), with drop rate 0 and keep probability 1.

    Four residual blocks (:class:`_ResidualBlock`) of ``channels`` = 64, 160, 320, 640 widths,
    each ending in a 2x2 max pool (84 -> 42 -> 21 -> 10 -> 5), then an average pool to a
    ``channels[-1]`` = 640-dimensional feature. The code's ``AvgPool2d(5, stride=1)`` is exactly
    a global average pool on its 84x84 inputs (5x5 left); here the pool is global for any input
    side >= 16, so other sizes also give 640 features (the code's would fail below 80 pixels and
    give a larger feature map above 95). 12,424,320 parameters: per block ``9 c_in c +
    18 c^2`` (three 3x3 convolutions) ``+ c_in c`` (the 1x1 shortcut) ``+ 8 c`` (four BatchNorms).

    All BatchNorms use batch statistics (the code's ResNet-12 keeps PyTorch's default running
    statistics, which only matter in eval mode; here the CNN4 rule, batch statistics, applies
    to both backbones, so a model is its parameters alone). ``model(images)`` maps
    ``(n, in_channels, H, W)`` to ``(n, feature_dim)``.

    Args:
        in_channels: image channels (3 for miniImageNet).
        channels: the four block widths.
        key: PRNG key of the initialisation.
        dtype: parameter dtype; inputs are cast to it.

    Raises:
        ValueError: a bad ``in_channels`` or ``channels`` (not four positive ints).
    """

    blocks: tuple[_ResidualBlock, ...]
    in_channels: int = eqx.field(static=True)

    def __init__(
        self,
        in_channels: int = 3,
        channels: Sequence[int] = RESNET12_CHANNELS,
        *,
        key: jax.Array,
        dtype=jnp.float32,
    ):
        self.in_channels = _check_positive_int(in_channels, "in_channels", "ResNet12")
        channels = tuple(channels)
        if len(channels) != 4:
            raise ValueError(
                f"ResNet12(channels=...) must give the widths of 4 blocks, got {channels!r}; "
                f"the paper's are {RESNET12_CHANNELS}."
            )
        for c in channels:
            _check_positive_int(c, "channels", "ResNet12")
        widths = list(zip((in_channels, *channels[:-1]), channels, strict=True))
        shapes = [s for c_in, c in widths for s in _ResidualBlock.kernel_shapes(c_in, c)]
        kernels = he_normal_kernels(key, shapes, dtype)
        self.blocks = tuple(_ResidualBlock(kernels[4 * i : 4 * i + 4]) for i in range(4))

    @property
    def feature_dim(self) -> int:
        """The width of the last block (640 for the paper's ResNet-12)."""
        return self.blocks[-1].conv3.weight.shape[0]

    def __call__(self, images: jax.Array) -> jax.Array:
        _check_images(images, self.in_channels, "ResNet12")
        h = images.astype(self.blocks[0].conv1.weight.dtype)
        for block in self.blocks:
            h = block(h)
        return global_avg_pool(h)

"""Small model pieces shared by the machine-learning problems (pure JAX, no flax/equinox).

* losses: :func:`logistic_loss` (binary, labels +-1), :func:`softmax_cross_entropy` (per-sample
  multinomial cross-entropy with integer labels) and :func:`accuracy`;
* models: :func:`linear` (``X W + b``), a ReLU :func:`mlp` with :func:`init_mlp`, and
  the LeNet-5 feature extractor :func:`lenet5_features` with :func:`init_lenet5`, its
  convolutions as matrix products of the stacked windows in NHWC (``_conv_nhwc``, faster than
  XLA:CPU's convolution inside solver loops) and max-pooling over strided sub-grids;
* input checks (``check_features``, ``check_labels``...) that raise ``ValueError`` naming the
  offending argument of the calling factory, and :func:`float_dtype`;
* mixed precision: :func:`check_compute_dtype` and :func:`in_compute_dtype` (bfloat16 data and
  activations around float32 parameters, losses and gradients).

Every per-sample function takes arrays with a leading sample axis and returns per-sample
values; problems take the mean. Broadcasting is always explicit (the test suite runs with
``jax_numpy_rank_promotion="raise"``).

References:
    LeCun, Bottou, Bengio, Haffner. "Gradient-based learning applied to document recognition."
    Proc. IEEE, 1998 (LeNet-5; the feature extractor follows ``networks.LeNet5Feats`` of the
    PZOBO code, github.com/sowmaster/esjacobians).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bilevel.core.finite import check_values

PyTree = Any

__all__ = [
    "float_dtype",
    "logistic_loss",
    "softmax_cross_entropy",
    "accuracy",
    "linear",
    "init_linear",
    "init_mlp",
    "mlp",
    "init_lenet5",
    "lenet5_features",
    "pad_to_32",
    "LENET5_FEATURES",
    "sum_of_squares",
    "check_compute_dtype",
    "in_compute_dtype",
]

LENET5_FEATURES = 84  # output width of the LeNet-5 feature extractor


def float_dtype() -> np.dtype:
    """The default float dtype: float32, or float64 when ``jax_enable_x64`` is on."""
    return np.dtype(jnp.result_type(float))


#: compute dtypes a model may run in besides its parameters' own (``compute_dtype=None``)
COMPUTE_DTYPES = ("bfloat16",)


def check_compute_dtype(value, fn: str):
    """``None`` (compute in the parameters' dtype) or ``jnp.bfloat16`` for ``value`` given as
    ``None``, ``"bfloat16"`` or ``jnp.bfloat16``.

    Raises:
        ValueError: any other value (float16 is refused: its 5-bit exponent overflows at 65504,
            which logits and their squares reach; bfloat16 keeps float32's range).
    """
    if value is None:
        return None
    try:
        dtype = jnp.dtype(value)
    except TypeError:
        dtype = None
    if dtype is None or dtype.name not in COMPUTE_DTYPES:
        raise ValueError(
            f"{fn}(compute_dtype=...) must be None (compute in the parameters' dtype: float32, "
            f"or float64 under jax_enable_x64) or 'bfloat16', got {value!r}."
        )
    return jnp.bfloat16


def in_compute_dtype(apply, compute_dtype, out_dtype):
    """``apply(params, X)`` run in ``compute_dtype``: inputs and a copy of the parameters are
    cast to it, so every activation is stored in it, and the output comes back in ``out_dtype``.

    The parameters themselves, the loss built on the output and every gradient stay in
    ``out_dtype``: the transpose of a cast is a cast, so reverse mode returns cotangents of the
    ``out_dtype`` parameters in ``out_dtype`` (mixed precision as in Micikevicius et al.,
    "Mixed Precision Training", ICLR 2018, with bfloat16 in place of float16, hence no loss
    scaling). XLA:CPU computes bfloat16 dot products in float32 and rounds their outputs.
    """

    def run(params: PyTree, X: jax.Array) -> jax.Array:
        low = jax.tree.map(lambda a: a.astype(compute_dtype), params)
        return apply(low, X.astype(compute_dtype)).astype(out_dtype)

    return run


# ---- losses ----------------------------------------------------------------------------------
def logistic_loss(margins: jax.Array) -> jax.Array:
    """``log(1 + exp(-m))`` elementwise, stable for large ``|m|`` (``m = b a^T y``, b = +-1)."""
    return jnp.logaddexp(jnp.zeros_like(margins), -margins)


def softmax_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-sample ``-log softmax(logits)[label]``: logits ``(n, C)``, integer labels ``(n,)``.

    The label's logit is picked by a one-hot mask, not ``take_along_axis``: XLA:CPU runs a
    gather (and its scatter in the backward pass) entry by entry, and that made a minibatch
    gradient of the data-cleaning problem slower than benchopt's one-hot form.
    """
    onehot = labels[:, None] == jnp.arange(logits.shape[-1])[None, :]
    picked = jnp.sum(jnp.where(onehot, logits, 0.0), axis=-1)
    return jax.nn.logsumexp(logits, axis=-1) - picked


def accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Fraction of samples whose arg-max logit is the label."""
    return jnp.mean((jnp.argmax(logits, axis=-1) == labels).astype(logits.dtype))


def sum_of_squares(tree: PyTree) -> jax.Array:
    """``sum`` of the squares of every entry of every leaf."""
    return sum(jnp.sum(leaf**2) for leaf in jax.tree.leaves(tree))


# ---- linear model and MLP --------------------------------------------------------------------
def init_linear(d: int, num_classes: int, dtype=None) -> dict:
    """Zeros ``{"W": (d, C), "b": (C,)}``."""
    dtype = dtype or float_dtype()
    return {"W": jnp.zeros((d, num_classes), dtype), "b": jnp.zeros((num_classes,), dtype)}


def linear(params: dict, X: jax.Array) -> jax.Array:
    """Logits ``X W + b`` of shape ``(n, C)``."""
    return X @ params["W"] + params["b"][None, :]


def _uniform(rng: np.random.Generator, shape, fan_in: int, dtype) -> jax.Array:
    bound = 1.0 / np.sqrt(fan_in)
    return jnp.asarray(rng.uniform(-bound, bound, size=shape), dtype)


def init_mlp(sizes: Sequence[int], seed: int = 0, dtype=None) -> dict:
    """A ReLU MLP with layer widths ``sizes`` (input first, output last).

    PyTorch's default ``nn.Linear`` initialisation: weights and biases uniform in
    ``+-1/sqrt(fan_in)``. Returns ``{"W1", "b1", "W2", "b2", ...}``.
    """
    dtype = dtype or float_dtype()
    rng = np.random.default_rng(seed)
    params = {}
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True), start=1):
        params[f"W{i}"] = _uniform(rng, (a, b), a, dtype)
        params[f"b{i}"] = _uniform(rng, (b,), a, dtype)
    return params


def mlp(params: dict, X: jax.Array) -> jax.Array:
    """ReLU MLP forward pass; no activation after the last layer."""
    depth = len(params) // 2
    h = X
    for i in range(1, depth + 1):
        h = h @ params[f"W{i}"] + params[f"b{i}"][None, :]
        if i < depth:
            h = jax.nn.relu(h)
    return h


# ---- LeNet-5 feature extractor ---------------------------------------------------------------
_LENET_CONVS = (("conv1", 1, 6), ("conv2", 6, 16), ("conv3", 16, 120))


def init_lenet5(seed: int = 0, dtype=None) -> dict:
    """Parameters of the LeNet-5 feature extractor (60,856 numbers).

    conv 1->6 (5x5), conv 6->16 (5x5), conv 16->120 (5x5), fc 120->84; kernels ``OIHW``, fc
    weight ``(120, 84)``. PyTorch's default initialisation (uniform in ``+-1/sqrt(fan_in)``),
    as in the PZOBO code, from a numpy generator seeded with ``seed``.
    """
    dtype = dtype or float_dtype()
    rng = np.random.default_rng(seed)
    params = {}
    for name, cin, cout in _LENET_CONVS:
        fan_in = cin * 25
        params[name] = {
            "w": _uniform(rng, (cout, cin, 5, 5), fan_in, dtype),
            "b": _uniform(rng, (cout,), fan_in, dtype),
        }
    params["fc"] = {
        "w": _uniform(rng, (120, LENET5_FEATURES), 120, dtype),
        "b": _uniform(rng, (LENET5_FEATURES,), 120, dtype),
    }
    return params


def _conv_nhwc(x: jax.Array, p: dict) -> jax.Array:
    """A 'valid' 2-D convolution of NHWC activations with an OIHW kernel, as one matrix product
    of the concatenated shifted windows (im2col) with the kernel reshaped to ``(HWI, O)``.

    Why not ``lax.conv_general_dilated``: inside ``scan`` / ``while`` (every solver's loop) its
    XLA:CPU forms ran 5-12x slower than outside, and its automatic transposes (the backward
    pass) 13x slower than this form (LeNet's 6 -> 16 layer at batch 256, measured
    2026-11-22: 238 ms against 18 ms per forward+backward). Slices, a concatenation and a dot
    are differentiated by JAX in every mode into more slices and dots, equally fast. All of
    LeNet runs in NHWC: mixing in an NCHW first layer (shifted multiply-adds, faster alone)
    made XLA's fusions of the whole network 4x slower (measured).
    """
    w = jnp.transpose(p["w"], (2, 3, 1, 0))  # HWIO
    kh, kw, cin, cout = w.shape
    ho, wo = x.shape[1] - kh + 1, x.shape[2] - kw + 1
    windows = [x[:, i : i + ho, j : j + wo, :] for i in range(kh) for j in range(kw)]
    out = jnp.dot(jnp.concatenate(windows, axis=-1), w.reshape(kh * kw * cin, cout))
    return out + p["b"][None, None, None, :]


def _maxpool2(x: jax.Array) -> jax.Array:
    """2x2 max-pooling, stride 2, of NHWC activations (even H, W), as the max of the four
    strided sub-grids.

    Not ``lax.reduce_window``: its second-order derivative inside ``lax.map``/``scan`` (the
    chunked feature pass of ``deep_hyper_representation``, differentiated twice by the
    Hessian-vector products of the solvers) fails to linearise in JAX 0.10. Not a max over a
    reshape either: its backward pass cost 3x this one's on XLA:CPU (measured, batch 256). Same
    values and first derivatives away from ties (after a ReLU, ties are at 0, where the ReLU's
    derivative is 0 anyway).
    """
    top = jnp.maximum(x[:, 0::2, 0::2], x[:, 0::2, 1::2])
    bottom = jnp.maximum(x[:, 1::2, 0::2], x[:, 1::2, 1::2])
    return jnp.maximum(top, bottom)


def lenet5_features(params: dict, images: jax.Array) -> jax.Array:
    """LeNet-5 features ``(n, 84)`` of images ``(n, 1, 32, 32)`` (NCHW, as PyTorch's).

    conv(5x5) -> ReLU -> maxpool 2 -> conv(5x5) -> ReLU -> maxpool 2 -> conv(5x5) -> ReLU ->
    flatten (120) -> fc -> ReLU. Computed in NHWC (one input channel: the reshape is free);
    see ``_conv_nhwc`` for why.
    """
    h = images.reshape(images.shape[0], images.shape[2], images.shape[3], 1)
    h = _maxpool2(jax.nn.relu(_conv_nhwc(h, params["conv1"])))  # (n, 14, 14, 6)
    h = _maxpool2(jax.nn.relu(_conv_nhwc(h, params["conv2"])))  # (n, 5, 5, 16)
    h = jax.nn.relu(_conv_nhwc(h, params["conv3"]))  # (n, 1, 1, 120)
    h = h.reshape(h.shape[0], 120)
    return jax.nn.relu(h @ params["fc"]["w"] + params["fc"]["b"][None, :])


def pad_to_32(images: np.ndarray, arg: str = "images", fn: str = "pad_to_32") -> np.ndarray:
    """Images as ``(n, 1, 32, 32)``: accepts ``(n, 28, 28)``, ``(n, 32, 32)``, ``(n, 784)``,
    ``(n, 1024)`` or the same with a channel axis of 1; 28x28 images are zero-padded by 2 (the
    LeNet-5 input size, as torchvision's ``Resize(32)`` is replaced by padding here).

    Raises:
        ValueError: any other shape, naming ``arg`` of ``fn``.
    """
    a = np.asarray(images)
    n = a.shape[0] if a.ndim else 0
    shape = a.shape
    if a.ndim == 2 and shape[1] in (784, 1024):
        side = 28 if shape[1] == 784 else 32
        a = a.reshape(n, 1, side, side)
    elif a.ndim == 3 and shape[1:] in ((28, 28), (32, 32)):
        a = a[:, None]
    elif not (a.ndim == 4 and shape[1:] in ((1, 28, 28), (1, 32, 32))):
        raise ValueError(
            f"{fn}({arg}=...) must hold grey-scale 28x28 or 32x32 images, shaped (n, 28, 28), "
            f"(n, 32, 32), (n, 784), (n, 1024) or (n, 1, H, W); got shape {shape}."
        )
    if a.shape[-1] == 28:
        a = np.pad(a, ((0, 0), (0, 0), (2, 2), (2, 2)))
    return a


# ---- input checks ----------------------------------------------------------------------------
def check_features(X, arg: str, fn: str, *, ndim: int = 2, n: int | None = None) -> np.ndarray:
    """``X`` as a finite float array of the default dtype with ``ndim`` axes (and ``n`` rows)."""
    if hasattr(X, "toarray") and not isinstance(X, np.ndarray):
        raise ValueError(
            f"{fn}({arg}=...) must be a dense numpy array, got {type(X).__name__}; reduce the "
            "number of columns (e.g. load_20newsgroups(n_features=...)) and call .toarray()."
        )
    a = np.asarray(X)
    if a.ndim != ndim:
        raise ValueError(f"{fn}({arg}=...) must have {ndim} axes, got shape {a.shape}.")
    if a.shape[0] == 0:
        raise ValueError(f"{fn}({arg}=...) has no samples (shape {a.shape}).")
    if n is not None and a.shape[0] != n:
        raise ValueError(
            f"{fn}({arg}=...) has {a.shape[0]} samples (leading axis) but {n} were expected "
            "from the matching features/labels."
        )
    if a.dtype.kind not in "biuf":
        raise ValueError(f"{fn}({arg}=...) must be real-valued, got dtype {a.dtype}.")
    a = a.astype(float_dtype())
    check_values(a, arg, fn, axes=("row",), label=False)  # NaN, inf, or a square overflowing
    return a


def check_labels(y, arg: str, fn: str, *, n: int, num_classes: int) -> np.ndarray:
    """Integer class labels ``(n,)`` in ``0..num_classes-1``, returned as int32."""
    a = np.asarray(y)
    if a.shape != (n,):
        raise ValueError(
            f"{fn}({arg}=...) must have shape ({n},) to match its features, got {a.shape}."
        )
    if a.dtype.kind == "f":
        if not np.all(np.isfinite(a)) or np.any(a != np.round(a)):
            raise ValueError(f"{fn}({arg}=...) must hold integer class labels.")
    elif a.dtype.kind not in "iu":
        raise ValueError(f"{fn}({arg}=...) must hold integer class labels, got {a.dtype}.")
    if a.size and (a.min() < 0 or a.max() >= num_classes):
        raise ValueError(
            f"{fn}({arg}=...) labels must lie in 0..{num_classes - 1} (num_classes="
            f"{num_classes}), found {a.min()}..{a.max()}."
        )
    return a.astype(np.int32)


def check_pair(X, y, x_arg: str, y_arg: str, fn: str, *, num_classes: int, d: int | None = None):
    """Features ``(n, d)`` and matching labels; ``d`` (if given) fixes the feature count."""
    Xa = check_features(X, x_arg, fn)
    if d is not None and Xa.shape[1] != d:
        raise ValueError(
            f"{fn}({x_arg}=...) has {Xa.shape[1]} features (columns) but the training data has {d}."
        )
    return Xa, check_labels(y, y_arg, fn, n=Xa.shape[0], num_classes=num_classes)


def check_optional_pair(X, y, x_arg: str, y_arg: str, fn: str, **kw):
    """Like :func:`check_pair` for an optional split: both ``None`` or both given."""
    if X is None and y is None:
        return None
    if X is None or y is None:
        missing = x_arg if X is None else y_arg
        raise ValueError(
            f"{fn}({missing}=...) is required when the other of {x_arg}/{y_arg} is given."
        )
    return check_pair(X, y, x_arg, y_arg, fn, **kw)


def check_num_classes(num_classes, fn: str) -> int:
    if isinstance(num_classes, bool) or not isinstance(num_classes, int | np.integer):
        raise ValueError(f"{fn}(num_classes=...) must be an int >= 2, got {num_classes!r}.")
    if num_classes < 2:
        raise ValueError(f"{fn}(num_classes=...) must be >= 2, got {num_classes}.")
    return int(num_classes)


def check_nonneg(value, arg: str, fn: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{fn}({arg}=...) must be a number >= 0, got {value!r}.") from None
    if not (np.isfinite(v) and v >= 0):
        raise ValueError(f"{fn}({arg}=...) must be a finite number >= 0, got {value!r}.")
    return v


def check_choice(value, arg: str, fn: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ValueError(
            f"{fn}({arg}=...) must be one of {', '.join(map(repr, choices))}, got {value!r}."
        )
    return value

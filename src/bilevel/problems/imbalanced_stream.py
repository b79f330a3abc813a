r"""Online parametric-loss tuning on an imbalanced image stream (Jia & Chen, arXiv:2602.11665,
Sec. 6.1, Experiment 1; the loss family of AutoBalance, Li et al., arXiv:2201.01212).

The upper variable is x = (gamma_j, Delta_j)_{j=1..J}, J logit scales and J offsets (2J = 20
numbers for J = 10 classes, unconstrained); the lower variable theta is a small CNN. Round t
brings a training set D_t^tr and a validation set D_t^val drawn from that round's class
distribution::

    F_t(x) = 1/|D_t^val| sum_{(a_i, b_i) in D_t^val} u_{b_i} CE(h(theta*_t(x); a_i), b_i)
    g_t(x, theta) = -1/|D_t^tr| sum_{D_t^tr} log softmax(gamma * h(theta; a_i) + Delta)[b_i]
                    + weight_decay/2 ||theta||^2

with u_j the inverse class frequency (the reciprocal of class j's proportion in the round's
distribution, as the paper says; so E[u_b CE] = J x the class-balanced cross-entropy). The
``weight_decay`` term is ours (default 1e-4): a network is not strongly convex in its weights
anyway, the term only keeps the inner Hessian from being singular along flat directions.

**The stream** (our reading of Sec. 6.1's "four 100-timestep phases, transitioning from 0.6^i
to 0.9^i distribution for each class i"): class i has proportion p_i proportional to rho^i, with
rho = 0.6, 0.7, 0.8, 0.9 in the four phases (the paper gives no intermediate values). Each
round draws the class of every sample from p, then an image of that class uniformly from a
pool; training and validation images come from disjoint pools (``val_fraction`` of the images
for validation), so no validation image is ever trained on. Per-round sizes are unspecified in
the paper: ``n_train`` and ``n_val`` (default 128 each).

**The network** (the paper: "four 3x3 conv blocks (Conv-ReLU-2x2 MaxPool-BN), followed by
flattening and a 10-way linear classifier"): :func:`cnn4`, channel width ``channels`` (the
paper gives none; 64 is the Conv-4 custom, we default to 16 for CPU budgets), 'same' 3x3
convolutions (padding 1), 2x2 max-pooling with floor (an odd side drops its last row, as
PyTorch's MaxPool2d), so 28x28 inputs go 28 -> 14 -> 7 -> 3 -> 1 and 16x16 inputs 16 -> 8 -> 4
-> 2 -> 1. **BatchNorm uses batch statistics only** (no running averages: a running average is
state outside the bilevel variables): each forward pass normalises by the statistics of its
own batch, or of ``norm_images`` when given (the test accuracy normalises by the round's
training batch, what running statistics would estimate), then applies its learnt per-channel
scale and shift.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from bilevel.core.online_problem import OnlineProblem
from bilevel.problems.models import (
    _conv_nhwc,
    _maxpool2,
    float_dtype,
    softmax_cross_entropy,
    sum_of_squares,
)

__all__ = [
    "PAPER_RHOS",
    "phase_proportions",
    "inverse_frequency",
    "init_cnn4",
    "cnn4",
    "imbalanced_stream",
    "ImbalancedReference",
    "balanced_accuracy",
]

#: the four phases' imbalance ratios (class i has proportion proportional to rho^i)
PAPER_RHOS = (0.6, 0.7, 0.8, 0.9)
#: BatchNorm's variance floor (PyTorch's default eps)
BN_EPS = 1e-5
#: conv blocks of the paper's network
BLOCKS = 4


def phase_proportions(rho: float, num_classes: int = 10) -> np.ndarray:
    """Class proportions p_i = rho^i / sum_j rho^j, i = 0..num_classes-1."""
    if not 0 < rho <= 1:
        raise ValueError(f"phase_proportions(rho={rho!r}) must lie in (0, 1].")
    p = float(rho) ** np.arange(num_classes)
    return p / p.sum()


def inverse_frequency(rho: float, num_classes: int = 10) -> np.ndarray:
    """u_j = 1 / p_j, the inverse class frequency of the phase (the paper's u_j)."""
    return 1.0 / phase_proportions(rho, num_classes)


# ---- the network -----------------------------------------------------------------------------
def final_side(side: int, blocks: int = BLOCKS) -> int:
    """The feature map's side after ``blocks`` blocks (each 'same' conv keeps it, each pool
    halves it with floor)."""
    for _ in range(blocks):
        side //= 2
    return side


def init_cnn4(
    channels: int,
    image_side: int,
    num_classes: int = 10,
    key: jax.Array | int = 0,
    *,
    blocks: int = BLOCKS,
    dtype=None,
) -> dict:
    """Parameters of :func:`cnn4`: ``blocks`` 3x3 convolutions (kernels OIHW, PyTorch's
    default uniform initialisation in +-1/sqrt(fan_in), drawn from the PRNG ``key`` or an int
    seed), BatchNorm scales 1 and shifts 0, and the linear classifier on the flattened
    ``channels * s * s`` features (s = :func:`final_side`). Jit-able in ``key`` (a random
    start per seed: ``bl.solve_online(init=...)``).

    Raises:
        ValueError: images too small for the poolings (the last would leave nothing).
    """
    s = final_side(image_side, blocks)
    if s < 1:
        raise ValueError(
            f"init_cnn4(image_side={image_side}, blocks={blocks}) is too small for {blocks} "
            f"2x2 poolings; use images of at least {2**blocks}x{2**blocks} (upsample smaller "
            "ones)."
        )
    if channels < 1:
        raise ValueError(f"init_cnn4(channels={channels}) must be >= 1.")
    dtype = dtype or float_dtype()
    key = jax.random.PRNGKey(key) if isinstance(key, int) else key
    keys = iter(jax.random.split(key, 2 * blocks + 2))

    def uniform(shape, fan_in):
        bound = 1.0 / np.sqrt(fan_in)
        return jax.random.uniform(next(keys), shape, dtype, -bound, bound)

    params = {}
    cin = 1
    for b in range(1, blocks + 1):
        params[f"conv{b}"] = {
            "w": uniform((channels, cin, 3, 3), cin * 9),
            "b": uniform((channels,), cin * 9),
        }
        params[f"bn{b}"] = {
            "scale": jnp.ones((channels,), dtype),
            "shift": jnp.zeros((channels,), dtype),
        }
        cin = channels
    d = channels * s * s
    params["fc"] = {"w": uniform((d, num_classes), d), "b": uniform((num_classes,), d)}
    return params


def _block(p_conv, p_bn, h, h_norm):
    """Conv 3x3 (padding 1) -> ReLU -> 2x2 max-pool -> BatchNorm, on ``h`` (NHWC); the BN
    statistics come from ``h_norm``'s activations (the same batch when ``h_norm is h``)."""

    def conv_pool(a):
        a = jnp.pad(a, ((0, 0), (1, 1), (1, 1), (0, 0)))
        a = jax.nn.relu(_conv_nhwc(a, p_conv))
        side_h, side_w = (a.shape[1] // 2) * 2, (a.shape[2] // 2) * 2
        return _maxpool2(a[:, :side_h, :side_w, :])

    out = conv_pool(h)
    ref = out if h_norm is None else conv_pool(h_norm)
    mean = jnp.mean(ref, axis=(0, 1, 2))
    var = jnp.mean((ref - mean[None, None, None, :]) ** 2, axis=(0, 1, 2))
    inv = p_bn["scale"] / jnp.sqrt(var + BN_EPS)

    def normalise(a):
        return (a - mean[None, None, None, :]) * inv[None, None, None, :] + p_bn["shift"][
            None, None, None, :
        ]

    return normalise(out), None if h_norm is None else normalise(ref)


def cnn4(params: dict, images: jax.Array, norm_images: jax.Array | None = None) -> jax.Array:
    """Logits ``(n, classes)`` of grey images ``(n, H, W)`` through the blocks and the
    linear classifier. BatchNorm normalises by the batch's own statistics, or by those of
    ``norm_images`` (``(m, H, W)``) when given."""
    h = images[..., None]
    h_norm = None if norm_images is None else norm_images[..., None]
    blocks = sum(1 for k in params if k.startswith("conv"))
    for b in range(1, blocks + 1):
        h, h_norm = _block(params[f"conv{b}"], params[f"bn{b}"], h, h_norm)
    flat = h.reshape(h.shape[0], -1)
    return flat @ params["fc"]["w"] + params["fc"]["b"][None, :]


def balanced_accuracy(logits: jax.Array, labels: jax.Array, num_classes: int = 10) -> jax.Array:
    """Mean over classes of the per-class accuracy (classes absent from ``labels`` are skipped)."""
    onehot = jax.nn.one_hot(labels, num_classes, dtype=logits.dtype)
    hit = (jnp.argmax(logits, axis=-1) == labels).astype(logits.dtype)
    per_class_n = onehot.sum(axis=0)
    per_class_hit = (onehot * hit[:, None]).sum(axis=0)
    present = per_class_n > 0
    acc = jnp.where(present, per_class_hit / jnp.maximum(per_class_n, 1.0), 0.0)
    return acc.sum() / present.sum()


# ---- the levels (module-level functions: every stream built here shares them, so solvers'
# compiled programs are reused across streams of the same shapes) -----------------------------
def _adjusted_logits(x, logits):
    return logits * x["scale"][None, :] + x["offset"][None, :]


def _outer(t, x, theta, batch):
    """u-weighted validation cross-entropy of the plain logits (x enters through theta* only)."""
    ce = softmax_cross_entropy(cnn4(theta, batch["images"]), batch["labels"])
    return jnp.mean(batch["weights"] * ce)


def _make_inner(weight_decay: float):
    def inner(t, x, theta, batch):
        logits = _adjusted_logits(x, cnn4(theta, batch["images"]))
        ce = jnp.mean(softmax_cross_entropy(logits, batch["labels"]))
        return ce + 0.5 * weight_decay * sum_of_squares(theta)

    return inner


_INNERS: dict[float, object] = {}


def _inner_for(weight_decay: float):
    """One inner function per weight decay (the same object for every stream)."""
    if weight_decay not in _INNERS:
        _INNERS[weight_decay] = _make_inner(weight_decay)
    return _INNERS[weight_decay]


@dataclasses.dataclass(frozen=True)
class ImbalancedReference:
    """What the stream was built from: the phases' rho, the sizes and the classes. Compared by
    value (it is static in the problem's pytree): two streams built with the same settings but
    other seeds share every compiled solver program."""

    rhos: tuple
    rounds_per_phase: int
    n_train: int
    n_val: int
    channels: int
    weight_decay: float
    num_classes: int
    blocks: int

    @property
    def proportions(self) -> np.ndarray:
        """Class proportions of every round, ``(rounds, J)``."""
        per_phase = np.stack([phase_proportions(r, self.num_classes) for r in self.rhos])
        return np.repeat(per_phase, self.rounds_per_phase, axis=0)

    @property
    def weights(self) -> np.ndarray:
        """u_j = 1/p_j of every round, ``(rounds, J)``."""
        return 1.0 / self.proportions

    def phase(self, t) -> np.ndarray:
        """The phase (1..len(rhos)) of round(s) ``t`` (from 1)."""
        return (np.asarray(t) - 1) // self.rounds_per_phase + 1


def imbalanced_stream(
    images,
    labels,
    *,
    rhos=PAPER_RHOS,
    rounds_per_phase: int = 100,
    n_train: int = 128,
    n_val: int = 128,
    channels: int = 16,
    blocks: int = BLOCKS,
    weight_decay: float = 1e-4,
    val_fraction: float = 0.2,
    num_classes: int = 10,
    seed: int = 0,
    init_seed: int | None = None,
) -> OnlineProblem:
    """The Experiment 1 stream (module docstring) from ``images`` ``(n, H, W)`` in [0, 1] and
    integer ``labels`` ``(n,)``.

    Args:
        rhos: one imbalance ratio per phase (class i has proportion ~ rho^i).
        rounds_per_phase: rounds of each phase; horizon = len(rhos) * rounds_per_phase.
        n_train, n_val: samples of D_t^tr and D_t^val per round.
        channels: the CNN's width.
        blocks: conv blocks (the paper's 4; fewer only for smoke tests).
        weight_decay: the L2 weight on theta in g_t.
        val_fraction: the share of the images kept for the validation pool.
        seed: the stream's draws (pools and per-round samples).
        init_seed: the CNN's initialisation (default ``seed``).

    Returns:
        An :class:`bilevel.OnlineProblem` with x = ``{"scale": ones(J), "offset": zeros(J)}``,
        y = the CNN's parameters, held per-round data (outer: images, labels and u weights;
        inner: images and labels) and an :class:`ImbalancedReference`.
    """
    images, labels = _check_stream_args(images, labels, n_train, n_val, rounds_per_phase, rhos)
    rng = np.random.default_rng(seed)
    pools = _class_pools(rng, labels, val_fraction, num_classes)
    horizon = len(rhos) * rounds_per_phase
    ref = ImbalancedReference(
        rhos=tuple(float(r) for r in rhos),
        rounds_per_phase=int(rounds_per_phase),
        n_train=int(n_train),
        n_val=int(n_val),
        channels=int(channels),
        weight_decay=float(weight_decay),
        num_classes=int(num_classes),
        blocks=int(blocks),
    )
    props, u = ref.proportions, ref.weights
    tr_images, tr_labels = _draw_rounds(rng, images, props, pools["train"], n_train)
    val_images, val_labels = _draw_rounds(rng, images, props, pools["val"], n_val)
    weights = np.take_along_axis(u, val_labels.astype(np.int64), axis=1).astype(float_dtype())
    dtype = float_dtype()
    x0 = {"scale": jnp.ones((num_classes,), dtype), "offset": jnp.zeros((num_classes,), dtype)}
    theta0 = init_cnn4(
        channels,
        images.shape[1],
        num_classes,
        seed if init_seed is None else init_seed,
        blocks=blocks,
    )
    return OnlineProblem(
        outer=_outer,
        inner=_inner_for(float(weight_decay)),
        horizon=horizon,
        x0=x0,
        y0=theta0,
        outer_data={"images": val_images, "labels": val_labels, "weights": weights},
        inner_data={"images": tr_images, "labels": tr_labels},
        name=f"imbalanced stream (rho {', '.join(f'{r:g}' for r in rhos)}; {horizon} rounds)",
        reference=ref,
    )


def _check_stream_args(images, labels, n_train, n_val, rounds_per_phase, rhos):
    """``(images, labels)`` as arrays, the images in the float dtype."""
    fn = "imbalanced_stream"
    images = np.asarray(images, float_dtype())
    labels = np.asarray(labels)
    if images.ndim != 3 or labels.shape != images.shape[:1]:
        raise ValueError(
            f"{fn}(images=..., labels=...) need shapes (n, H, W) and (n,), got {images.shape} "
            f"and {labels.shape}."
        )
    if min(n_train, n_val, rounds_per_phase) < 1 or not rhos:
        raise ValueError(
            f"{fn} needs n_train, n_val, rounds_per_phase >= 1 and at least one phase, got "
            f"n_train={n_train}, n_val={n_val}, rounds_per_phase={rounds_per_phase}, "
            f"rhos={rhos}."
        )
    return images, labels


def _class_pools(rng: np.random.Generator, labels, val_fraction: float, num_classes: int):
    """Disjoint image pools by split and class: ``{"val": [indices of class c], "train": ...}``,
    the validation pool a random ``val_fraction`` of the images."""
    order = rng.permutation(len(labels))
    cut = int(round(val_fraction * len(labels)))
    pools = {"val": order[:cut], "train": order[cut:]}
    by_class = {}
    for split, idx in pools.items():
        by_class[split] = [idx[labels[idx] == c] for c in range(num_classes)]
        empty = [c for c in range(num_classes) if len(by_class[split][c]) == 0]
        if empty:
            raise ValueError(
                f"imbalanced_stream: the {split} pool has no image of classes {empty} "
                f"({len(labels)} images, val_fraction={val_fraction}); give more images."
            )
    return by_class


def _draw_rounds(rng: np.random.Generator, images, props: np.ndarray, pool_by_class, n: int):
    """``n`` samples per round: each class drawn from the round's proportions ``props``
    (rounds, J), then an image of that class uniformly from its pool."""
    num_classes = props.shape[1]
    ys = np.stack([rng.choice(num_classes, size=n, p=p) for p in props])  # (rounds, n)
    picks = np.empty_like(ys)
    for c in range(num_classes):
        mask = ys == c
        picks[mask] = rng.choice(pool_by_class[c], size=int(mask.sum()))
    return images[picks], ys.astype(np.int32)

r"""Linear task heads, their losses, and the inner head solver shared by the meta-learners.

In the multi-task form of PZOBO (Sow, Ji, Liang, NeurIPS 2022, eq. 9) task i's inner variable is
the last linear layer w_i = (W_i, b_i) over backbone features, fitted on the support set S_i::

    L_{S_i}(phi, w_i) = (1/|S_i|) sum_{zeta in S_i} [ L(phi, w_i; zeta) + R(w_i) ]
                      = mean_zeta L(phi, w_i; zeta) + R(w_i),
    R(w) = 0.5 * reg * (||W||^2 + ||b||^2)            (official code: reg = 0.5 on miniImageNet)

so L_{S_i} is ``reg``-strongly convex in w_i for the cross-entropy and the squared loss alike.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from bilevel.problems.models import accuracy, softmax_cross_entropy

__all__ = [
    "LOSSES",
    "LinearHead",
    "zeros_head",
    "head_logits",
    "ridge",
    "head_loss",
    "support_loss",
    "fit_head",
    "accuracy",
]

#: the per-sample losses a head can be fitted with: the paper's cross-entropy, and the squared
#: loss to one-hot targets (whose ridge head has a closed form, used by the exact tests)
LOSSES = ("cross_entropy", "squared")


class LinearHead(NamedTuple):
    """A linear classifier over features: ``logits = features @ weight.T + bias``."""

    weight: jax.Array  # (ways, feature_dim)
    bias: jax.Array  # (ways,)


def zeros_head(ways: int, feature_dim: int, dtype=jnp.float32) -> LinearHead:
    """The all-zeros head (the initial head w0 of the authors' ``meta_learning.py``)."""
    return LinearHead(jnp.zeros((ways, feature_dim), dtype), jnp.zeros((ways,), dtype))


def head_logits(head: LinearHead, features: jax.Array) -> jax.Array:
    """``(n, ways)`` logits of ``(n, feature_dim)`` features."""
    return features @ head.weight.T + head.bias[None, :]


def ridge(head: LinearHead, reg) -> jax.Array:
    """R(w) = 0.5 reg (||W||^2 + ||b||^2): the code's regulariser, on weights and bias."""
    return 0.5 * reg * (jnp.sum(head.weight**2) + jnp.sum(head.bias**2))


def head_loss(head: LinearHead, features, labels, loss: str = "cross_entropy") -> jax.Array:
    """Mean per-sample loss of the head (no regulariser): L_{D_i} on a query set.

    ``"squared"`` is ``0.5 ||logits - onehot(label)||^2`` per sample.
    """
    logits = head_logits(head, features)
    if loss == "cross_entropy":
        return jnp.mean(softmax_cross_entropy(logits, labels))
    if loss == "squared":
        onehot = jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype)
        return 0.5 * jnp.mean(jnp.sum((logits - onehot) ** 2, axis=-1))
    raise ValueError(f"unknown head loss {loss!r}; use one of {LOSSES}.")


def support_loss(head: LinearHead, features, labels, reg, loss="cross_entropy") -> jax.Array:
    """L_{S_i}(phi, w_i) of eq. (9): the mean loss on the support set plus R(w_i)."""
    return head_loss(head, features, labels, loss) + ridge(head, reg)


def fit_head(
    features: jax.Array,
    labels: jax.Array,
    head0: LinearHead,
    *,
    steps: int,
    lr,
    reg,
    transform: optax.GradientTransformation,
    loss: str = "cross_entropy",
) -> LinearHead:
    """``steps`` steps of ``head <- head - lr * transform(grad L_S)`` from ``head0``.

    The features are fixed (computed once per path), so each step is a cheap
    linear-head gradient. ``transform`` is an optax transformation WITHOUT a learning rate
    (:func:`bilevel.solvers.base.optimizer_transform`: "gd", "momentum" = PyTorch's SGD momentum
    0.9 as in the code's meta-learning runs, "adam"), started fresh for every call (the code
    resets the momentum between the unperturbed and the perturbed solve).
    A ``lax.scan`` carrying only (head, optimiser state): no path is stored.
    """
    grad_fn = jax.grad(support_loss)

    def body(carry, _):
        head, opt = carry
        direction, opt = transform.update(grad_fn(head, features, labels, reg, loss), opt)
        head = jax.tree.map(lambda w, d: w - lr * d, head, direction)
        return (head, opt), None

    (head, _), _ = jax.lax.scan(body, (head0, transform.init(head0)), None, length=steps)
    return head

r"""Prototypical networks (Snell, Swersky, Zemel, "Prototypical Networks for Few-shot
Learning", NeurIPS 2017): a backbone trained so that classes cluster around their mean.

For one task with support features f(x_j), labels y_j and query features f(q) (eq. (1)-(2))::

    c_k = (1/|S_k|) sum_{j: y_j = k} f(x_j)                  (prototype of class k)
    logit_k(q) = -||f(q) - c_k||^2                             (squared Euclidean distance)
    L = mean over the query set of cross-entropy(logits, label)

and the backbone follows Adam on the meta-batch average of L. No inner loop: a new task is
"adapted to" by computing its prototypes.

As learn2learn's ``LightningPrototypicalNetworks`` (which PZOBO's paper ran): the whole task
(support and query) is embedded in one backbone pass, the distance is the squared Euclidean
one, and the default Adam rate 5e-3 is its miniImageNet recipe (``examples/vision/lightning/
Makefile``, target ``proto-mi``: meta-batch 8 tasks, trained 20-way with 15 queries, tested
5-way). This library's learners keep one ``ways`` from ``init`` for training and meta-test,
so a run trains ProtoNet on the tasks every method sees.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import optax

from bilevel.meta.common import (
    check_backbone,
    check_count,
    check_learning_rate,
    joint_features,
    outer_step,
    per_task,
    task_mean,
)
from bilevel.problems.models import softmax_cross_entropy

__all__ = ["ProtoNet", "ProtoNetState", "prototypes", "prototype_logits"]


class ProtoNetState(NamedTuple):
    """State of :class:`ProtoNet`."""

    params: Any  # phi: the backbone
    classes: jax.Array  # (ways,) int32 task-level labels 0..ways-1 (its shape fixes ways)
    opt: optax.OptState  # the outer Adam state over params
    k: jax.Array  # meta-steps taken (int32)


def prototypes(features: jax.Array, labels: jax.Array, classes: jax.Array) -> jax.Array:
    """``(ways, F)`` class means c_k of ``(n, F)`` support features (Snell et al. 2017, eq. 1)."""
    onehot = (labels[:, None] == classes[None, :]).astype(features.dtype)  # (n, ways)
    return (onehot.T @ features) / jnp.sum(onehot, axis=0)[:, None]


def prototype_logits(support_features, support_labels, query_features, classes) -> jax.Array:
    """``(n_query, ways)`` logits ``-||f(q) - c_k||^2`` (Snell et al. 2017, eq. 2)."""
    centres = prototypes(support_features, support_labels, classes)
    diff = query_features[:, None, :] - centres[None, :, :]
    return -jnp.sum(diff**2, axis=-1)


@dataclasses.dataclass(frozen=True)
class ProtoNet:
    """Prototypical networks with a squared Euclidean distance and Adam (module docstring).

    Args:
        outer_lr: Adam learning rate, a float or an optax schedule (learn2learn ``proto-mi``:
            5e-3).

    References:
        Snell, Swersky, Zemel. "Prototypical Networks for Few-shot Learning." NeurIPS 2017.
    """

    name: ClassVar[str] = "protonet"

    outer_lr: Any = 5e-3

    def __post_init__(self):
        check_learning_rate("ProtoNet(outer_lr=...)", self.outer_lr)

    @property
    def _optimizer(self) -> optax.GradientTransformation:
        return optax.adam(self.outer_lr)

    def init(self, backbone, ways: int, key: jax.Array) -> ProtoNetState:
        """The backbone, the class labels 0..ways-1 and a fresh Adam state (``key`` unused)."""
        check_backbone("ProtoNet", backbone)
        check_count("ProtoNet.init(ways=...)", ways, minimum=2)
        classes = jnp.arange(ways, dtype=jnp.int32)
        return ProtoNetState(
            backbone, classes, self._optimizer.init(backbone), jnp.zeros((), jnp.int32)
        )

    @staticmethod
    def _task_logits(backbone, task, classes) -> jax.Array:
        support_features, query_features = joint_features(backbone, task)
        return prototype_logits(support_features, task.support_labels, query_features, classes)

    def meta_loss(self, backbone, episodes, classes) -> jax.Array:
        """The meta-batch mean of the tasks' query cross-entropy, the loss ``step`` descends."""

        def task_loss(backbone, task):
            logits = self._task_logits(backbone, task, classes)
            return jnp.mean(softmax_cross_entropy(logits, task.query_labels))

        return task_mean(task_loss, backbone, episodes)

    def step(self, state: ProtoNetState, episodes, key: jax.Array):
        """One Adam step on the meta-batch's query loss. ``key`` is unused."""

        def loss(backbone, episodes):
            return self.meta_loss(backbone, episodes, state.classes)

        params, opt, value = outer_step(loss, state.params, state.opt, self._optimizer, episodes)
        return ProtoNetState(params, state.classes, opt, state.k + 1), value

    def query_logits(self, state: ProtoNetState, episodes) -> jax.Array:
        """``(B, ways * queries, ways)`` logits of each task's query set against its prototypes."""

        def logits(backbone, task):
            return self._task_logits(backbone, task, state.classes)

        return per_task(logits, state.params, episodes)

r"""MAML (second order), first-order MAML and ANIL: meta-learners with an SGD inner loop.

All three meta-learn an initialisation theta = (phi, w) of a backbone phi and a linear head w
and train it by backpropagating the query loss of the task-adapted parameters (Finn, Abbeel,
Levine, ICML 2017, Algorithm 2)::

    theta_i' = theta - alpha sum_{t<K} grad L_{S_i}(theta_t)          (K inner SGD steps)
    min_theta (1/B) sum_i L_{D_i}(theta_i')                        (Adam on the meta-batch)

They differ only in what the inner loop adapts and how it is differentiated, which is the one
shared :func:`bilevel.meta.common.adapt`:

* :class:`MAML`: every parameter adapts; the meta-gradient goes through the inner gradients
  (Hessian-vector products, exact second order);
* ``MAML(first_order=True)`` (registered as ``"fomaml"``): the same inner loop with a
  stop-gradient on each inner gradient, so the meta-gradient is grad L_D at theta_i' (Finn et
  al. 2017, Sec. 5.2; Nichol, Achiam, Schulman, arXiv:1803.02999, 2018). It has no
  convergence guarantee and vanishes where the outer loss depends on the inner variable only
  (the hyperparameter optimisation of PZOBO's Sec. 4.4, whose direct gradient term is zero);
* :class:`ANIL` (Raghu, Raghu, Bengio, Vinyals, "Rapid Learning or Feature Reuse? Towards
  Understanding the Effectiveness of MAML", ICLR 2020): only the head adapts, over features
  computed once per task; the meta-gradient is second order through the head-only inner loop
  and reaches the backbone through the support features (that shape the adapted head) and the
  query features.

Defaults are learn2learn's miniImageNet recipes for its PyTorch-Lightning wrappers, which PZOBO's
paper ran for its baselines (learn2learn ``examples/vision/lightning/Makefile``, targets
``maml-mi`` and ``anil-mi``; 5-way 5-shot, 5 queries, meta-batch 16 tasks): MAML inner lr
0.02, 5 inner steps, outer Adam lr 3e-4; ANIL inner lr 0.1, 5 inner steps, outer Adam lr 1e-3.
learn2learn adapts with the same number of steps at meta-test as in training, and so do the
defaults here (``test_inner_steps``). The meta-batch size belongs to the episode sampler.

Head initialisation: zeros (a meta-learned init that starts at zero), where learn2learn keeps
PyTorch's random ``nn.Linear`` init. Each task relabels its classes in a random order, so no
class-specific head init can help on average, and the zero head treats all classes alike: it is
the "zeroing trick" that Kao, Chu, Chen, Lin ("MAML is a Noisy Contrastive Learner in
Classification", ICLR 2022) found to help MAML, and it is the w0 = 0 that PZOBO's own
meta-learner starts from (the authors' ``meta_learning.py``), so all methods start alike.

BatchNorm (batch statistics only, :mod:`bilevel.meta.backbones`): the backbone runs on one
task's images at a time (``vmap`` over the tasks).
MAML embeds the support set (to adapt) and the query set (to predict) in separate passes, as
learn2learn's ``LightningMAML`` does; ANIL embeds both in one pass, as ``LightningANIL`` does.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import optax

from bilevel.meta.common import (
    adapt,
    check_backbone,
    check_count,
    check_learning_rate,
    feature_dim,
    feature_dtype,
    joint_features,
    outer_step,
    per_task,
    task_mean,
)
from bilevel.meta.heads import LinearHead, head_logits, head_loss, zeros_head

__all__ = ["MAML", "ANIL", "MetaParams", "MAMLState"]


class MetaParams(NamedTuple):
    """The meta-learned initialisation theta = (phi, w) that the inner loop adapts."""

    backbone: Any  # phi: the feature extractor (an equinox module of float arrays)
    head: LinearHead  # w: the linear head over phi's features


class MAMLState(NamedTuple):
    """State of :class:`MAML` and :class:`ANIL`."""

    params: Any  # phi: the backbone's meta-learned initialisation
    head: LinearHead  # w: the head's meta-learned initialisation (zeros at k = 0)
    opt: optax.OptState  # the outer Adam state over MetaParams(params, head)
    k: jax.Array  # meta-steps taken (int32)


@dataclasses.dataclass(frozen=True)
class _InnerLoopLearner:
    """MAML's outer loop (Finn et al. 2017, Algorithm 2), shared by MAML, FOMAML and ANIL.

    A subclass says how one task adapts, in :meth:`_adapt_task`: from ``MetaParams`` and a
    task, the adapted head and the query features it classifies.
    """

    inner_lr: float  # alpha: the inner SGD step
    inner_steps: int  # K: inner SGD steps when meta-training
    test_inner_steps: int  # inner SGD steps when adapting at meta-test (query_logits)
    outer_lr: Any  # beta: the outer Adam learning rate (a float or an optax schedule)

    def __post_init__(self):
        owner = type(self).__name__
        check_learning_rate(f"{owner}(inner_lr=...)", self.inner_lr, schedule_ok=False)
        check_count(f"{owner}(inner_steps=...)", self.inner_steps)
        check_count(f"{owner}(test_inner_steps=...)", self.test_inner_steps)
        check_learning_rate(f"{owner}(outer_lr=...)", self.outer_lr)

    #: run the tasks of a meta-batch one after another (:func:`~bilevel.meta.common.per_task`):
    #: True where each task adapts the backbone itself (MAML), so the tasks' weights differ
    sequential_tasks: ClassVar[bool] = False

    def _adapt_task(self, theta: MetaParams, task, steps: int):
        raise NotImplementedError

    @property
    def _optimizer(self) -> optax.GradientTransformation:
        return optax.adam(self.outer_lr)

    def init(self, backbone, ways: int, key: jax.Array) -> MAMLState:
        """The meta-parameters (``backbone``, a zeros head) and a fresh Adam state. ``key`` is
        unused: the backbone comes initialised and the head starts at zero."""
        owner = type(self).__name__
        check_backbone(owner, backbone)
        check_count(f"{owner}.init(ways=...)", ways, minimum=2)
        head = zeros_head(ways, feature_dim(owner, backbone), feature_dtype(backbone))
        theta = MetaParams(backbone, head)
        return MAMLState(backbone, head, self._optimizer.init(theta), jnp.zeros((), jnp.int32))

    def meta_loss(self, theta: MetaParams, episodes) -> jax.Array:
        """(1/B) sum_i L_{D_i}(theta_i'): the mean query cross-entropy after training-time
        adaptation (``inner_steps``), the objective whose gradient ``step`` follows."""

        def task_loss(theta, task):
            head, query_features = self._adapt_task(theta, task, self.inner_steps)
            return head_loss(head, query_features, task.query_labels)

        return task_mean(task_loss, theta, episodes, self.sequential_tasks)

    def step(self, state: MAMLState, episodes, key: jax.Array) -> tuple[MAMLState, jax.Array]:
        """One Adam step on :meth:`meta_loss`'s gradient. ``key`` is unused (no randomness)."""
        theta = MetaParams(state.params, state.head)
        theta, opt, loss = outer_step(self.meta_loss, theta, state.opt, self._optimizer, episodes)
        return MAMLState(theta.backbone, theta.head, opt, state.k + 1), loss

    def query_logits(self, state: MAMLState, episodes) -> jax.Array:
        """``(B, ways * queries, ways)`` query logits after ``test_inner_steps`` of adaptation."""

        def logits(theta, task):
            return head_logits(*self._adapt_task(theta, task, self.test_inner_steps))

        theta = MetaParams(state.params, state.head)
        return per_task(logits, theta, episodes, self.sequential_tasks)


@dataclasses.dataclass(frozen=True)
class MAML(_InnerLoopLearner):
    """Model-agnostic meta-learning: the whole network adapts (see the module docstring).

    Args:
        inner_lr: inner SGD step alpha (learn2learn ``maml-mi``: 0.02).
        inner_steps: inner steps when meta-training (``maml-mi``: 5).
        test_inner_steps: inner steps at meta-test (learn2learn uses the training count: 5).
        outer_lr: outer Adam learning rate, a float or an optax schedule (``maml-mi``: 3e-4).
        first_order: stop the gradient of the inner gradients (FOMAML); ``False`` is exact
            second-order MAML.

    References:
        Finn, Abbeel, Levine. "Model-Agnostic Meta-Learning for Fast Adaptation of Deep
        Networks." ICML 2017. Nichol, Achiam, Schulman. "On First-Order Meta-Learning
        Algorithms." arXiv:1803.02999, 2018.
    """

    inner_lr: float = 0.02
    inner_steps: int = 5
    test_inner_steps: int = 5
    outer_lr: Any = 3e-4
    first_order: bool = False

    sequential_tasks: ClassVar[bool] = True  # every task adapts its own copy of the backbone

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.first_order, bool):
            raise ValueError(f"MAML(first_order=...) must be a bool, got {self.first_order!r}.")

    @property
    def name(self) -> str:
        """``"fomaml"`` for the first-order variant, ``"maml"`` otherwise (registry names)."""
        return "fomaml" if self.first_order else "maml"

    def _adapt_task(self, theta: MetaParams, task, steps: int):
        def support_loss(theta):
            features = theta.backbone(task.support_images)
            return head_loss(theta.head, features, task.support_labels)

        adapted = adapt(
            support_loss, theta, steps=steps, lr=self.inner_lr, first_order=self.first_order
        )
        return adapted.head, adapted.backbone(task.query_images)


@dataclasses.dataclass(frozen=True)
class ANIL(_InnerLoopLearner):
    """Almost No Inner Loop: only the head adapts (see the module docstring).

    Args:
        inner_lr: inner SGD step on the head (learn2learn ``anil-mi``: 0.1).
        inner_steps: inner steps when meta-training (``anil-mi``: 5).
        test_inner_steps: inner steps at meta-test (learn2learn uses the training count: 5).
        outer_lr: outer Adam learning rate, a float or an optax schedule (``anil-mi``: 1e-3).

    References:
        Raghu, Raghu, Bengio, Vinyals. "Rapid Learning or Feature Reuse? Towards Understanding
        the Effectiveness of MAML." ICLR 2020.
    """

    name: ClassVar[str] = "anil"

    inner_lr: float = 0.1
    inner_steps: int = 5
    test_inner_steps: int = 5
    outer_lr: Any = 1e-3

    def _adapt_task(self, theta: MetaParams, task, steps: int):
        support_features, query_features = joint_features(theta.backbone, task)

        def support_loss(head):
            return head_loss(head, support_features, task.support_labels)

        head = adapt(support_loss, theta.head, steps=steps, lr=self.inner_lr, first_order=False)
        return head, query_features

"""MAML, FOMAML, ANIL and ProtoNet (bilevel.meta.maml, bilevel.meta.protonet) against exact answers.

* The meta-gradients against the chain rule written out with an explicit Hessian: after K
  inner steps theta_{j+1} = theta_j - a P grad L_S(theta_j) (P projects on what adapts: all
  of theta for MAML, the head for ANIL), the gradient of L_Q(theta_K) is
  ``prod_j (I - a H_j P) grad L_Q(theta_K)``, H_j the support-loss Hessian at theta_j (for
  K = 1 and P = I: (I - a H_S) grad L_Q(theta')), and FOMAML's is grad L_Q(theta_K). The
  reference losses are written here from scratch (log-softmax of a bilinear model) and the
  Hessian is ``jax.hessian`` of them: no learner code is involved.
* ProtoNet's logits and loss against numbers computed by hand.
* Each learner beats chance on held-out classes of a small synthetic few-shot problem after a
  few meta-steps, and by more than it did before training.

Episodes are built here with the fields of ``bilevel.meta.episodes.Episodes``; the backbones
are tiny equinox modules whose only leaves are float arrays.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from bilevel.meta import registry
from bilevel.meta.episodes import Episodes
from bilevel.meta.heads import LinearHead, accuracy
from bilevel.meta.maml import ANIL, MAML, MetaParams
from bilevel.meta.protonet import ProtoNet, prototype_logits


class LinearFeatures(eqx.Module):
    """features = flatten(images) @ weight.T: a linear backbone (closed-form tests)."""

    weight: jax.Array  # (feature_dim, C * H * W)
    feature_dim: int = eqx.field(static=True)

    def __call__(self, images):
        return images.reshape(images.shape[0], -1) @ self.weight.T


class TanhFeatures(eqx.Module):
    """features = tanh(flatten(images) @ weight.T + bias): a nonlinear backbone (learning)."""

    weight: jax.Array
    bias: jax.Array
    feature_dim: int = eqx.field(static=True)

    def __call__(self, images):
        return jnp.tanh(images.reshape(images.shape[0], -1) @ self.weight.T + self.bias[None, :])


# ---- exact meta-gradients ----------------------------------------------------------------------
WAYS, SHOTS, QUERIES, DIM, FEATURES, TASKS = 2, 2, 3, 4, 3, 2


def _random_episodes(seed: int) -> Episodes:
    rng = np.random.default_rng(seed)
    labels = [np.tile(np.arange(WAYS, dtype=np.int32), (TASKS, n)) for n in (SHOTS, QUERIES)]
    return Episodes(
        jnp.asarray(rng.normal(size=(TASKS, WAYS * SHOTS, 1, 2, 2))),
        jnp.asarray(rng.permuted(labels[0], axis=1)),
        jnp.asarray(rng.normal(size=(TASKS, WAYS * QUERIES, 1, 2, 2))),
        jnp.asarray(rng.permuted(labels[1], axis=1)),
    )


def _random_theta(seed: int) -> MetaParams:
    rng = np.random.default_rng(seed)
    backbone = LinearFeatures(jnp.asarray(rng.normal(size=(FEATURES, DIM))), FEATURES)
    head = LinearHead(
        jnp.asarray(rng.normal(size=(WAYS, FEATURES))), jnp.asarray(rng.normal(size=WAYS))
    )
    return MetaParams(backbone, head)


def _cross_entropy(theta: MetaParams, images, labels):
    """Mean cross-entropy of the bilinear model, written independently of the library."""
    x = images.reshape(images.shape[0], -1)
    logits = x @ theta.backbone.weight.T @ theta.head.weight.T + theta.head.bias[None, :]
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(labels.shape[0]), labels])


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _reference_meta_gradients(theta, episodes, lr, steps, head_only):
    """Task means of grad L_Q(theta_K) (first order) and of prod_j (I - a H_j P) grad
    L_Q(theta_K) (second order), as flat vectors (module docstring)."""
    flat, unravel = ravel_pytree(theta)
    mask = MetaParams(
        jax.tree.map(lambda w: jnp.full_like(w, not head_only), theta.backbone),
        jax.tree.map(jnp.ones_like, theta.head),
    )
    project = ravel_pytree(mask)[0]  # P: 1 where the inner loop adapts, 0 elsewhere

    def one_task(task):
        def support(v):
            return _cross_entropy(unravel(v), task.support_images, task.support_labels)

        def query(v):
            return _cross_entropy(unravel(v), task.query_images, task.query_labels)

        path = [flat]
        for _ in range(steps):
            path.append(path[-1] - lr * project * jax.grad(support)(path[-1]))
        first = v = jax.grad(query)(path[-1])
        for t in reversed(path[:-1]):
            v = v - lr * jax.hessian(support)(t) @ (project * v)
        return first, v

    return jax.tree.map(lambda g: jnp.mean(g, axis=0), jax.vmap(one_task)(episodes))


@pytest.mark.parametrize("steps", [1, 2])
@pytest.mark.parametrize(
    "learner",
    [
        MAML(inner_lr=0.4, first_order=False),
        MAML(inner_lr=0.4, first_order=True),
        ANIL(inner_lr=0.4),
    ],
    ids=["maml", "fomaml", "anil"],
)
def test_meta_gradient_matches_the_chain_rule(learner, steps):
    """The learner's meta-gradient = the explicit-Hessian chain rule, at 1e-10 (float64
    round-off of a few dozen products of O(1) numbers); the second-order term is not
    negligible here (so dropping it fails the test)."""
    learner = dataclasses.replace(learner, inner_steps=steps)
    theta = _random_theta(0)
    episodes = _random_episodes(1)
    got = ravel_pytree(jax.jit(jax.grad(learner.meta_loss))(theta, episodes))[0]
    first, second = _reference_meta_gradients(
        theta, episodes, 0.4, steps, isinstance(learner, ANIL)
    )
    want, other = (first, second) if getattr(learner, "first_order", False) else (second, first)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    # the other order's answer is far off, in the backbone and in the head block alike (for
    # ANIL the backbone's second-order part flows through the adapted head)
    n_backbone = FEATURES * DIM  # the backbone's weight comes first in ravel order
    for block in (slice(0, n_backbone), slice(n_backbone, None)):
        gap = float(jnp.linalg.norm(other[block] - want[block]))
        assert gap > 1e-2 * float(jnp.linalg.norm(want[block]))


# ---- ProtoNet by hand --------------------------------------------------------------------------
def test_protonet_logits_and_loss_by_hand():
    """Identity features in R^2. Class 0 support (0,0), (2,0) -> prototype (1,0); class 1
    support (0,2), (0,4) -> prototype (0,3) (given out of order). Query (1,1), label 0:
    distances^2 1 and 5; query (0,3), label 1: 10 and 0. Loss = mean of log(1 + e^-4) and
    log(1 + e^-10)."""
    identity = LinearFeatures(jnp.eye(2), 2)
    support = jnp.array([[0.0, 2.0], [0.0, 0.0], [0.0, 4.0], [2.0, 0.0]])
    query = jnp.array([[1.0, 1.0], [0.0, 3.0]])
    episodes = Episodes(
        support.reshape(1, 4, 1, 1, 2),
        jnp.array([[1, 0, 1, 0]], jnp.int32),
        query.reshape(1, 2, 1, 1, 2),
        jnp.array([[0, 1]], jnp.int32),
    )
    learner = ProtoNet()
    state = learner.init(identity, 2, jax.random.key(0))
    logits = jax.jit(learner.query_logits)(state, episodes)
    np.testing.assert_allclose(logits, [[[-1.0, -5.0], [-10.0, 0.0]]], rtol=0, atol=1e-12)
    want = 0.5 * (math.log1p(math.exp(-4.0)) + math.log1p(math.exp(-10.0)))
    loss = jax.jit(learner.meta_loss)(state.params, episodes, state.classes)
    np.testing.assert_allclose(loss, want, rtol=1e-12)
    direct = jax.jit(prototype_logits)(support, jnp.array([1, 0, 1, 0]), query, jnp.arange(2))
    np.testing.assert_allclose(direct, logits[0], rtol=0, atol=1e-12)
    new_state, step_loss = jax.jit(learner.step)(state, episodes, jax.random.key(1))
    np.testing.assert_allclose(step_loss, want, rtol=1e-12)
    assert int(new_state.k) == 1


# ---- learning on a synthetic few-shot problem --------------------------------------------------
N_CLASSES, TRAIN_CLASSES, IN_DIM = 16, 10, 8
SYN_WAYS, SYN_SHOTS, SYN_QUERIES = 3, 2, 4
META_STEPS, META_BATCH, TEST_TASKS = 60, 8, 512


def _sample(rng, means, pool, tasks: int) -> Episodes:
    """``tasks`` tasks of SYN_WAYS classes drawn from ``pool`` without replacement, in random
    order; inputs are the class mean plus noise of sd 0.6 in the first 4 dims and 3.0 in the
    last 4. numpy, not jax.random: XLA:CPU takes seconds to compile each random draw."""
    classes = np.stack([rng.choice(pool, SYN_WAYS, replace=False) for _ in range(tasks)])
    per_class = SYN_SHOTS + SYN_QUERIES
    scale = np.where(np.arange(IN_DIM) < 4, 0.6, 3.0)
    noise = rng.normal(size=(tasks, SYN_WAYS, per_class, IN_DIM)) * scale
    x = means[classes][:, :, None, :] + noise  # (tasks, ways, shots + queries, IN_DIM)
    labels = np.broadcast_to(np.arange(SYN_WAYS, dtype=np.int32)[:, None], x.shape[1:3])

    def part(lo, hi):
        images = x[:, :, lo:hi].reshape(tasks, -1, 1, 2, IN_DIM // 2)
        return jnp.asarray(images), jnp.asarray(np.tile(labels[:, lo:hi].reshape(-1), (tasks, 1)))

    return Episodes(*part(0, SYN_SHOTS), *part(SYN_SHOTS, per_class))


@pytest.fixture(scope="module")
def synthetic():
    """Class means vary in the first 4 input dims only (the last 4 carry large class-free
    noise, which a backbone must learn to ignore). META_STEPS meta-batches of tasks from
    classes 0-9, and TEST_TASKS tasks from the held-out classes 10-15."""
    rng = np.random.default_rng(10)
    means = 1.5 * rng.normal(size=(N_CLASSES, IN_DIM)) * (np.arange(IN_DIM) < 4)
    train = _sample(rng, means, np.arange(TRAIN_CLASSES), META_STEPS * META_BATCH)
    train = Episodes(*(a.reshape(META_STEPS, META_BATCH, *a.shape[1:]) for a in train))
    return train, _sample(rng, means, np.arange(TRAIN_CLASSES, N_CLASSES), TEST_TASKS)


LEARNERS = [
    MAML(inner_lr=0.5, inner_steps=2, test_inner_steps=2, outer_lr=0.03),
    MAML(inner_lr=0.5, inner_steps=2, test_inner_steps=2, outer_lr=0.03, first_order=True),
    ANIL(inner_lr=0.5, inner_steps=2, test_inner_steps=2, outer_lr=0.03),
    ProtoNet(outer_lr=0.03),
]


@pytest.mark.parametrize("learner", LEARNERS, ids=lambda m: m.name)
def test_learner_beats_chance_on_held_out_classes(learner, synthetic):
    """60 meta-steps (meta-batch 8) on classes 0-9, then 512 test tasks from classes 10-15.
    Chance is 1/3; a standard error is about 0.01 (512 x 12 queries), so the bounds are far
    beyond noise."""
    train_episodes, test_episodes = synthetic
    weight = jnp.asarray(0.3 * np.random.default_rng(11).normal(size=(8, IN_DIM)))
    state = learner.init(TanhFeatures(weight, jnp.zeros(8), 8), SYN_WAYS, jax.random.key(12))

    @jax.jit
    def test_accuracy(state):
        logits = learner.query_logits(state, test_episodes)
        return jnp.mean(jax.vmap(accuracy)(logits, test_episodes.query_labels))

    @jax.jit
    def train(state):
        def body(state, episodes):
            return learner.step(state, episodes, jax.random.key(0))

        return jax.lax.scan(body, state, train_episodes)

    before = float(test_accuracy(state))
    state, losses = train(state)
    after = float(test_accuracy(state))
    assert int(state.k) == META_STEPS
    assert float(jnp.mean(losses[-10:])) < float(jnp.mean(losses[:10]))
    assert after > 1 / SYN_WAYS + 0.2, (before, after)
    assert after > before + 0.15, (before, after)


# ---- registry and bad input --------------------------------------------------------------------
def test_registry_names_and_make():
    assert {"maml", "fomaml", "anil", "protonet"} <= set(registry.names())
    fomaml = registry.make("FOMAML", inner_steps=1)
    assert isinstance(fomaml, MAML) and fomaml.first_order and fomaml.name == "fomaml"
    assert registry.make("maml").name == "maml" and not registry.make("maml").first_order
    assert registry.make("anil").name == "anil" and registry.make("protonet").name == "protonet"
    with pytest.raises(ValueError, match="Did you mean 'maml'"):
        registry.make("mamll")
    with pytest.raises(ValueError, match="inner_lr"):
        registry.make("protonet", inner_lr=0.1)
    with pytest.raises(ValueError, match="fixes first_order=True"):
        registry.make("fomaml", first_order=False)
    with pytest.raises(ValueError, match="already registered"):
        registry.register("maml", ANIL)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: MAML(inner_lr=-0.1), r"MAML\(inner_lr=...\)"),
        (lambda: MAML(inner_lr="fast"), r"MAML\(inner_lr=...\)"),
        (lambda: ANIL(inner_steps=0), r"ANIL\(inner_steps=...\)"),
        (lambda: ANIL(test_inner_steps=2.0), r"ANIL\(test_inner_steps=...\)"),
        (lambda: MAML(first_order="yes"), r"MAML\(first_order=...\)"),
        (lambda: ProtoNet(outer_lr=0.0), r"ProtoNet\(outer_lr=...\)"),
    ],
)
def test_bad_hyperparameters_raise(build, match):
    with pytest.raises(ValueError, match=match):
        build()


class _IntLeaf(eqx.Module):
    weight: jax.Array
    feature_dim: int = 3

    def __call__(self, images):
        return images


def test_bad_backbone_or_ways_raise():
    good = LinearFeatures(jnp.ones((3, 4)), 3)
    with pytest.raises(ValueError, match="ways"):
        MAML().init(good, 1, jax.random.key(0))
    with pytest.raises(ValueError, match="static"):
        ANIL().init(_IntLeaf(jnp.ones(3)), 2, jax.random.key(0))
    with pytest.raises(ValueError, match="feature_dim"):
        MAML().init(eqx.nn.Identity(), 2, jax.random.key(0))
    with pytest.raises(ValueError, match="ways"):
        ProtoNet().init(good, 1, jax.random.key(0))

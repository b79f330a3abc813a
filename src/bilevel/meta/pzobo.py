r"""PZOBO's multi-task form for few-shot meta-learning (Sow, Ji, Liang, NeurIPS 2022, App. B.4).

The backbone phi is the outer variable; task i of a meta-batch of B tasks has its own linear head
w_i, fitted on its support set S_i under the ridge of eq. (9) (:mod:`bilevel.meta.heads`). One
meta-step, Algorithm 1 (lines 3-15) on eq. (9) as the authors' ``meta_learning.py`` runs it::

    u ~ directions(phi)                                       ONE u for all B tasks (the code's)
    for every task i:
        F_i     = phi(S_i)                                    support features, once
        w_i^N   = N inner steps on L_{S_i}(F_i, .) from w0
        F_i^u   = (phi + mu u)(S_i)                           forward pass only
        w_{i,u}^N = N inner steps on L_{S_i}(F_i^u, .) from w0  (same w0, fresh optimiser state)
        delta_i = (w_{i,u}^N - w_i^N) / mu                      (eq. 4)
    gradhat = grad_phi[(1/B) sum_i L_{D_i}(phi, w_i^N)]
              + c [(1/B) sum_i <delta_i, grad_w L_{D_i}(phi, w_i^N)>] u      (eq. 5, averaged over
                                                                             tasks before u)
    phi <- phi - beta_k Adam(gradhat);   w0 <- (1/B) sum_i w_i^N  (the code's warm start)

Both paths start from the same w0 with a fresh optimiser state: any other difference between them
would be divided by mu and swamp the estimate. With Q > 1 directions the bracket is averaged over
them, ``(c / Q) sum_j [...]_j u_j``. The only backward pass through the backbone is grad_phi of
the query loss at phi: the support features at phi and phi + mu u are forward passes, and the
heads are fitted on fixed features.

Defaults are the official code's miniImageNet run (``github.com/sowmaster/esjacobians``,
``meta_learning.py``, beyond Appendix B.4's settings), each an option with the paper's
choice as an alternative:

* ``inner_steps`` N = 30, ``lr_inner`` 0.01, ``reg`` 0.5, ``smoothing`` mu = 0.1 (Appendix B.4);
* ``inner_optimizer`` "momentum" (PyTorch's SGD momentum 0.9, the code; "gd" is Algorithm 1);
* ``directions`` "sphere_unscaled_per_tensor" (the code: every tensor of phi normalised to unit
  norm, no rescaling; "gaussian" is the paper's eq. 4, "sphere_scaled" the unbiased sphere
  smoothing; see :func:`bilevel.solvers.zeroth_order.pzobo.sample_directions`);
* ``warm_start`` True (the code: w0 <- mean of the adapted heads after each step, zeros at first;
  False keeps w0 = 0 at every step, Algorithm 1 line 3);
* outer optimiser Adam, ``lr_outer`` 0.01 (Appendix B.4); :func:`code_outer_schedule` gives the
  code's drops to 1e-3 and 1e-4.

Meta-test adaptation (:meth:`PZOBOMeta.query_logits`) is the code's ``evaluate``: a head fitted on
the support features by the same inner solver (same N, lr, optimiser) from the state's w0, so
T_test = N.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import optax

from bilevel.core.schedules import check_step_size, step_size
from bilevel.core.tree import tree_axpy, tree_sub, tree_vdot
from bilevel.meta.common import check_backbone, check_count, feature_dim, feature_dtype
from bilevel.meta.heads import LOSSES, LinearHead, fit_head, head_logits, head_loss, zeros_head
from bilevel.solvers.base import OUTER_OPTIMIZERS, check_optimizer, optimizer_transform
from bilevel.solvers.zeroth_order.pzobo import (
    DIRECTIONS,
    INNER_OPTIMIZERS,
    combine_directions,
    sample_directions,
)

PyTree = Any

__all__ = [
    "PZOBOMeta",
    "PZOBOMetaState",
    "MetaGradient",
    "StepCost",
    "code_outer_schedule",
    "task_features",
]


def code_outer_schedule(lr: float = 0.01) -> optax.Schedule:
    """The official code's outer step drops: ``lr`` until step 1500, ``lr / 10`` until step
    3500, ``lr / 100`` after (``meta_learning.py``; Appendix B.4 gives a constant 0.01).

    The code lowers the rate after finishing meta-step k >= 1500 (resp. 3500), so the first step
    at the lower rate is k = 1501 (resp. 3501), counting from 0 as ``state.k`` does.
    """
    return optax.piecewise_constant_schedule(lr, {1501: 0.1, 3501: 0.1})


def task_features(backbone: PyTree, images: jax.Array) -> jax.Array:
    """``(B, n, F)`` features of ``(B, n, C, H, W)`` images, one backbone call per task.

    Each task's set goes through the backbone on its own, so batch-statistics BatchNorm normalises
    over that set only, as the code's per-task forward passes do (its CNN4 BatchNorm keeps no
    running statistics).
    """
    return jax.vmap(backbone)(images)


class PZOBOMetaState(NamedTuple):
    """PZOBO's meta-training state."""

    params: PyTree  # phi_k: the backbone (an equinox module whose leaves are float arrays)
    head0: LinearHead  # w0: start of every inner path (warm start: mean of the last w_i^N)
    opt_state: Any  # the outer optimiser's optax state
    k: jax.Array  # meta-step count (int32)


class MetaGradient(NamedTuple):
    """What one meta-gradient evaluation returns (:meth:`PZOBOMeta.meta_gradient`)."""

    grad: PyTree  # gradhat, shaped like phi
    loss: jax.Array  # (1/B) sum_i L_{D_i}(phi, w_i^N): the mean query loss
    heads: LinearHead  # w_i^N, leading axis B (the next warm start is their mean)


class StepCost(NamedTuple):
    """Oracle calls of one meta-step on a meta-batch of B tasks with Q directions and N steps."""

    support_forwards: int  # backbone forward passes on a support set: B (Q + 1)
    query_backwards: int  # backbone forward + backward passes on a query set: B
    head_gradients: int  # gradients of L_{S_i} in the head on fixed features: B (Q + 1) N


@dataclasses.dataclass(frozen=True)
class PZOBOMeta:
    r"""PZOBO's multi-task meta-learner (Sow, Ji, Liang, NeurIPS 2022, App. B.4 with eq. 9).

    Per meta-step, on a meta-batch of B episodes (see the module docstring for the maths)::

        w_i^N     = fit(phi(S_i), w0),      w_{i,u}^N = fit((phi + mu u)(S_i), w0)     (eq. 4)
        gradhat   = grad_phi (1/B) sum_i L_{D_i}(phi, w_i^N)
                    + (c / Q) sum_j [(1/B) sum_i <delta_{i,j}, grad_w L_{D_i}(phi, w_i^N)>] u_j
        phi      <- phi - beta_k P(gradhat)                  (P: the outer optimiser, Adam)

    Args:
        inner_steps: N, inner steps of every path and of the meta-test adaptation (default 30:
            Appendix B.4; the code's T = T_test = 30 on miniImageNet).
        lr_inner: the inner step size alpha (default 0.01: Appendix B.4).
        inner_optimizer: "momentum" (default: the code's SGD momentum 0.9, reset for every path),
            "gd" (Algorithm 1), "adam", or an optax transformation without a learning rate.
        reg: the ridge weight of R(w) = 0.5 reg ||w||^2 (default 0.5: the code on miniImageNet);
            L_{S_i} is reg-strongly convex in w_i.
        smoothing: mu (default 0.1: Appendix B.4).
        num_directions: Q (default 1: "fixed to 1 in all our experiments", Appendix B).
        directions: "sphere_unscaled_per_tensor" (default, the code), "gaussian" (eq. 4) or
            "sphere_scaled" (:func:`bilevel.solvers.zeroth_order.pzobo.sample_directions`).
        parallel_directions: run the Q perturbed solves at once with ``vmap`` (default) or one
            after another with ``lax.map`` (memory of one backbone pass).
        warm_start: w0 <- mean of the tasks' adapted heads after every step (default True, the
            code); False keeps w0 = 0 (Algorithm 1).
        lr_outer: beta, a float or a schedule of the step count (default 0.01: Appendix B.4;
            :func:`code_outer_schedule` for the code's drops).
        outer_optimizer: "adam" (default: every experiment of the paper), "sgd", "momentum", or an
            optax transformation without a learning rate.
        loss: "cross_entropy" (default, eq. 9) or "squared" (closed-form ridge head; tests).

    References:
        Sow, Ji, Liang. "On the Convergence Theory for Hessian-Free Bilevel Algorithms."
        NeurIPS 2022 (arXiv:2110.07004), eqs. (4), (5), (9), Appendix B.4.

    Assumptions: the head's support loss is strongly convex (``reg > 0``); the backbone is a pure
    pytree of float arrays with a ``feature_dim``.
    """

    inner_steps: int = 30
    lr_inner: float = 0.01
    inner_optimizer: Any = "momentum"
    reg: float = 0.5
    smoothing: float = 0.1
    num_directions: int = 1
    directions: str = "sphere_unscaled_per_tensor"
    parallel_directions: bool = True
    warm_start: bool = True
    lr_outer: Any = 0.01
    outer_optimizer: Any = "adam"
    loss: str = "cross_entropy"

    name: ClassVar[str] = "pzobo"

    def __post_init__(self) -> None:
        for fld in ("inner_steps", "num_directions"):
            check_count(f"PZOBOMeta({fld}=...)", getattr(self, fld))
        for fld in ("lr_inner", "reg", "smoothing"):
            value = getattr(self, fld)
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if not (ok and 0 < value < float("inf")):
                raise ValueError(
                    f"PZOBOMeta({fld}=...) must be a positive finite float, got {value!r} "
                    "(the code uses lr_inner=0.01, reg=0.5, smoothing=0.1)."
                )
        check_step_size(self.lr_outer, "PZOBOMeta(lr_outer=...)")
        if self.directions not in DIRECTIONS:
            raise ValueError(
                f"PZOBOMeta(directions={self.directions!r}) is unknown; use one of {DIRECTIONS}."
            )
        if self.loss not in LOSSES:
            raise ValueError(f"PZOBOMeta(loss={self.loss!r}) is unknown; use one of {LOSSES}.")
        check_optimizer("PZOBOMeta", "inner_optimizer", self.inner_optimizer, INNER_OPTIMIZERS)
        check_optimizer("PZOBOMeta", "outer_optimizer", self.outer_optimizer, OUTER_OPTIMIZERS)
        for fld in ("warm_start", "parallel_directions"):
            if not isinstance(getattr(self, fld), bool):
                raise ValueError(f"PZOBOMeta({fld}=...) must be True or False.")

    # ---- the contract ------------------------------------------------------------------------
    def init(self, backbone: PyTree, ways: int, key: jax.Array) -> PZOBOMetaState:
        """phi_0 = ``backbone``, w0 = 0 (the code's first head), a fresh outer optimiser.

        ``key`` is unused (nothing is random at initialisation); it is part of the contract.
        """
        del key
        if not jax.tree.leaves(backbone):  # phi + mu u needs a direction to draw
            raise ValueError("PZOBOMeta.init(backbone=...) has no float arrays to perturb.")
        check_backbone("PZOBOMeta", backbone)
        check_count("PZOBOMeta.init(ways=...)", ways, minimum=2)
        head0 = zeros_head(ways, feature_dim("PZOBOMeta", backbone), feature_dtype(backbone))
        opt_state = optimizer_transform(self.outer_optimizer).init(backbone)
        return PZOBOMetaState(backbone, head0, opt_state, jnp.zeros((), jnp.int32))

    def step(self, state: PZOBOMetaState, episodes, key: jax.Array):
        """One meta-step; returns ``(new state, mean query loss at the old state)``.

        Key convention: ``u, c = sample_directions(key, state.params, Q, directions)``, so ONE set
        of directions serves every task of the meta-batch (as in the authors' code).
        """
        u, scale = sample_directions(key, state.params, self.num_directions, self.directions)
        result = self.meta_gradient(state.params, state.head0, episodes, u, scale)
        params, opt_state = self._outer_update(state, result.grad)
        # the code's warm start: the next w0 is the average of the tasks' adapted heads
        head0 = jax.tree.map(lambda h: jnp.mean(h, axis=0), result.heads)
        head0 = head0 if self.warm_start else state.head0
        return PZOBOMetaState(params, head0, opt_state, state.k + 1), result.loss

    def query_logits(self, state: PZOBOMetaState, episodes) -> jax.Array:
        """``(B, ways * queries, ways)`` logits of heads fitted on the support sets.

        The code's meta-test evaluation: each task's head is fitted on its support features by
        the same inner solver (N steps, lr, optimiser) from the state's w0, so T_test = N.
        """
        features = task_features(state.params, episodes.support_images)
        heads = self.fit_heads(features, episodes.support_labels, state.head0)
        return jax.vmap(head_logits)(heads, task_features(state.params, episodes.query_images))

    # ---- the estimator -----------------------------------------------------------------------
    def fit_heads(self, features: jax.Array, labels: jax.Array, head0: LinearHead) -> LinearHead:
        """w_i^N for every task: N inner steps on L_{S_i}(features_i, .) from the same w0, each
        with a fresh optimiser state (so that the two paths differ by the perturbation only).
        ``features (B, n, F)``, ``labels (B, n)``; the
        heads have a leading axis B and w0's dtype (the features are cast to it)."""
        transform = optimizer_transform(self.inner_optimizer)
        features = features.astype(head0.weight.dtype)

        def fit(feats, labels):
            return fit_head(
                feats,
                labels,
                head0,
                steps=self.inner_steps,
                lr=self.lr_inner,
                reg=self.reg,
                transform=transform,
                loss=self.loss,
            )

        return jax.vmap(fit)(features, labels)

    def query_loss(self, params: PyTree, heads: LinearHead, episodes) -> jax.Array:
        """(1/B) sum_i L_{D_i}(phi, w_i): the meta-objective of eq. (9) on the meta-batch."""
        features = task_features(params, episodes.query_images)
        losses = jax.vmap(lambda h, f, y: head_loss(h, f, y, self.loss))(
            heads, features, episodes.query_labels
        )
        return jnp.mean(losses)

    def meta_gradient(
        self, params: PyTree, head0: LinearHead, episodes, u: PyTree, scale
    ) -> MetaGradient:
        """PZOBO's meta-gradient for GIVEN directions ``u`` (leading axis Q) and scale c.

        ``gradhat = grad_phi f + (c / Q) sum_j [(1/B) sum_i <delta_{i,j}, grad_{w_i} L_{D_i}>]
        u_j`` with f = (1/B) sum_i L_{D_i}(phi, w_i^N) (eq. 5 on the multi-task eq. (9)).
        Q is read from ``u``, so any set of directions works (e.g. the identity basis of R^p with
        c = Q: a forward finite difference of the head map, the exact tests' check).
        """
        support, labels = episodes.support_images, episodes.support_labels
        # support features at phi once, no backward pass through them
        heads = self.fit_heads(task_features(params, support), labels, head0)
        # grad_w f = (1/B) grad_w L_{D_i}: the task average is taken before u multiplies
        loss, (grad_phi, grad_w) = jax.value_and_grad(self.query_loss, argnums=(0, 1))(
            params, heads, episodes
        )

        def coefficient(u_j):  # (1/B) sum_i <delta_i, grad_w L_{D_i}> for direction u_j
            perturbed = tree_axpy(self.smoothing, u_j, params)  # phi + mu u_j
            heads_u = self.fit_heads(task_features(perturbed, support), labels, head0)
            delta = jax.tree.map(lambda d: d / self.smoothing, tree_sub(heads_u, heads))  # eq. 4
            return tree_vdot(delta, grad_w)

        if self.parallel_directions:
            coeffs = jax.vmap(coefficient)(u)
        else:
            coeffs = jax.lax.map(coefficient, u)
        indirect = combine_directions(coeffs, u, scale)
        grad = jax.tree.map(lambda a, b: a + b.astype(a.dtype), grad_phi, indirect)
        return MetaGradient(grad, loss, heads)

    def step_cost(self, meta_batch: int) -> StepCost:
        """The oracle calls of one meta-step: Algorithm 1's (Q + 1) N inner steps, per task."""
        paths = meta_batch * (self.num_directions + 1)
        return StepCost(paths, meta_batch, paths * self.inner_steps)

    # ---- the outer update ----------------------------------------------------------------------
    def _outer_update(self, state: PZOBOMetaState, grad: PyTree):
        """``phi - beta_k P(gradhat)``, every leaf kept in its own dtype."""
        transform = optimizer_transform(self.outer_optimizer)
        update, opt_state = transform.update(grad, state.opt_state, state.params)
        lr = step_size(self.lr_outer, state.k)
        params = jax.tree.map(lambda p, d: p - (lr * d).astype(p.dtype), state.params, update)
        return params, opt_state

"""The meta-learner contract: a frozen dataclass of hyperparameters with pure methods.

A meta-learner (PZOBO's multi-task form, MAML, FOMAML, ANIL, ProtoNet) is a frozen dataclass of
hyperparameters, hashable so it can be closed over by ``jax.jit``. Its state is a typed
``NamedTuple`` pytree holding at least the backbone's parameters (``params``) and the meta
step count ``k``. Every method works on a batch of episodes (:class:`bilevel.meta.episodes.
Episodes`, leading axis = tasks of the meta-batch):

* ``init(backbone, ways, key) -> state``: ``backbone`` an equinox module mapping images
  ``(n, C, H, W)`` to features ``(n, F)``;
* ``step(state, episodes, key) -> (state, loss)``: one meta-update on the meta-batch; ``loss``
  is the mean query loss at the state before the update;
* ``query_logits(state, episodes) -> (B, ways * queries, ways)``: meta-test prediction, which
  adapts to each task's support set the way the method does (a fresh head fitted by the same
  inner solver, MAML's inner loop, prototypes) and classifies its query set.

The training loop (:mod:`bilevel.meta.train`) owns jit, timing and evaluation.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

import jax

__all__ = ["MetaLearner"]


class MetaLearner(Protocol):
    """What the meta-training loop needs of a method (see the module docstring)."""

    name: ClassVar[str]

    def init(self, backbone: Any, ways: int, key: jax.Array) -> Any: ...

    def step(self, state: Any, episodes: Any, key: jax.Array) -> tuple[Any, jax.Array]: ...

    def query_logits(self, state: Any, episodes: Any) -> jax.Array: ...

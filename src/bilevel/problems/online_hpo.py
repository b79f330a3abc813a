r"""Online hyperparameter optimisation: per-feature L2 weights of a softmax classifier, tuned
on a stream of minibatches whose training labels get noisier (F2OBO's Experiment 2).

Jia & Chen, "Fully First-Order Algorithms for Online Non-Convex Bilevel Optimization",
arXiv:2602.11665, Sec. 6.2 and Appendix A. Round t (from 1)::

    g_t(lam, theta) = (1/B) sum_{(a, b) in D_t^tr} CE(theta^T a, b)
                      + 1/2 sum_i lam_i ||theta_i||^2 + ridge/2 ||theta||^2      (inner)
    f_t(lam, theta) = (1/B) sum_{(a, b) in D_t^val} CE(theta^T a, b)              (outer)

with theta of shape (d, C) (a linear model without bias; theta_i, row i, holds feature i's
weights over the classes), lam in the box [0, lam_max]^d (``bl.sets.Box``; the paper's
Lambda = [0, 0.1]^d1) and CE the softmax cross-entropy. ``ridge`` is a small fixed L2 term
(default 1e-4) that is not in the paper: at lam_i = 0 the cross-entropy of a linear model is
convex but not strongly convex in theta_i, and every method here assumes g_t strongly convex
(mu_g >= ridge); it is the same for every method and every x.

**The stream.** Round t brings one training batch D_t^tr of ``batch_size`` samples and one clean
validation batch D_t^val of ``val_batch_size`` (Appendix A: "each algorithm receives a dataset
with batch size 256 at every time step"), drawn uniformly with replacement from their pools;
each training label is flipped, with probability p(t), to a uniformly random *other* class. p(t)
is 0 before the first switch and then the levels of ``noise`` in turn: the paper injects 5%, 10%
and 15% label noise "at iterations 2,500, 5,000 and 7,500" of 10,000, read here as switches at
25/50/75% of the horizon with the level *replaced* at each switch, not added (our reading; the
paper does not say how the noise is injected). The stream is drawn once per ``seed`` and held as
per-round data (``bl.OnlineProblem``'s ``(rounds, samples)`` leaves): sample indices into the
pools and the labels as received, ``4 * (B + B_val) * 2`` bytes per round, so every method
played on the same seed sees the same batches and flips.
A solver with ``batch_size=None`` uses the whole round batch in each of its draws.

:class:`OnlineHPOStream` holds the pools and the level functions; its :meth:`problem(seed)`
gives the stream of a seed, and problems of different seeds share those functions, so a
compiled solver program serves them all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bilevel.core import sets
from bilevel.core.online_problem import OnlineProblem
from bilevel.problems import models as M

__all__ = ["online_l2_hpo", "OnlineHPOStream", "noise_level", "PAPER_NOISE"]

#: the paper's label-noise schedule: (fraction of the horizon after which it starts, level)
PAPER_NOISE: tuple[tuple[float, float], ...] = ((0.25, 0.05), (0.5, 0.10), (0.75, 0.15))


def noise_level(t, horizon: int, noise: Sequence[tuple[float, float]] = PAPER_NOISE):
    """p(t): the label-flip probability of round t (from 1, possibly traced, or an array of
    rounds): 0 up to round
    ``floor(frac_1 T)``, then ``level_1`` up to ``floor(frac_2 T)``, ... (levels replace each
    other)."""
    t = jnp.asarray(t, jnp.int32)
    levels = jnp.asarray([0.0] + [p for _, p in noise], M.float_dtype())
    starts = jnp.asarray([int(frac * horizon) for frac, _ in noise], jnp.int32)
    after = jnp.expand_dims(t, -1) > starts.reshape((1,) * t.ndim + (-1,))
    return levels[jnp.sum(after, axis=-1)]


def _check_noise(noise) -> tuple[tuple[float, float], ...]:
    out = tuple((float(frac), float(p)) for frac, p in noise)
    fracs = [frac for frac, _ in out]
    if any(not 0 <= frac <= 1 for frac in fracs) or fracs != sorted(fracs):
        raise ValueError(
            f"online_l2_hpo(noise={noise!r}): the fractions of the horizon must be increasing "
            "and in [0, 1], e.g. ((0.25, 0.05), (0.5, 0.1), (0.75, 0.15))."
        )
    if any(not 0 <= p <= 1 for _, p in out):
        raise ValueError(f"online_l2_hpo(noise={noise!r}): noise levels must be in [0, 1].")
    return out


def _check_size(value, arg: str, n: int, split: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"online_l2_hpo({arg}={value!r}) must be a positive int.")
    if value > n:
        raise ValueError(
            f"online_l2_hpo({arg}={value}) is larger than the {split} set ({n} samples); "
            f"use {arg} <= {n}."
        )
    return int(value)


@dataclasses.dataclass(frozen=True, eq=False)
class OnlineHPOStream:
    """The pools, settings and level functions of :func:`online_l2_hpo`; ``problem(seed)`` is
    the stream drawn with ``seed``. Build it with :func:`online_l2_hpo`'s checks through
    :meth:`build`."""

    X: Any  # (n_train + n_val, d): the training pool, then the validation pool
    y_train: np.ndarray
    y_val: np.ndarray
    num_classes: int
    horizon: int
    batch_size: int
    val_batch_size: int
    noise: tuple
    lam_max: float
    lam0: float
    ridge: float
    test: dict | None
    test_batch_size: int
    name: str
    outer: Any = None  # f(t, lam, theta, batch), set by build
    inner: Any = None  # g(t, lam, theta, batch)
    metrics: Any = None

    @classmethod
    def build(
        cls,
        X_train,
        y_train,
        X_val,
        y_val,
        *,
        num_classes: int,
        horizon: int,
        batch_size: int = 256,
        val_batch_size: int = 256,
        noise: Sequence[tuple[float, float]] = PAPER_NOISE,
        lam_max: float = 0.1,
        lam0: float = 0.01,
        ridge: float = 1e-4,
        X_test=None,
        y_test=None,
        test_batch_size: int = 256,
        name: str | None = None,
    ) -> OnlineHPOStream:
        fn = "online_l2_hpo"
        C = M.check_num_classes(num_classes, fn)
        Xtr, ytr = M.check_pair(X_train, y_train, "X_train", "y_train", fn, num_classes=C)
        n, d = Xtr.shape
        Xv, yv = M.check_pair(X_val, y_val, "X_val", "y_val", fn, num_classes=C, d=d)
        test = M.check_optional_pair(X_test, y_test, "X_test", "y_test", fn, num_classes=C, d=d)
        if isinstance(horizon, bool) or not isinstance(horizon, int | np.integer) or horizon < 1:
            raise ValueError(f"{fn}(horizon={horizon!r}) must be a positive int.")
        batch_size = _check_size(batch_size, "batch_size", n, "training")
        val_batch_size = _check_size(val_batch_size, "val_batch_size", len(yv), "validation")
        if test is not None:
            test_batch_size = _check_size(test_batch_size, "test_batch_size", len(test[1]), "test")
        if not 0 < lam_max < float("inf"):
            raise ValueError(f"{fn}(lam_max={lam_max!r}) must be a positive float.")
        if not 0 <= lam0 <= lam_max:
            raise ValueError(f"{fn}(lam0={lam0!r}) must be in [0, lam_max={lam_max}].")
        if not ridge > 0:
            raise ValueError(
                f"{fn}(ridge={ridge!r}) must be > 0: it keeps g_t strongly convex where lam_i = 0."
            )
        dtype = M.float_dtype()
        stream = cls(
            X=jnp.asarray(np.concatenate([Xtr, Xv]), dtype),
            y_train=np.asarray(ytr),
            y_val=np.asarray(yv),
            num_classes=C,
            horizon=int(horizon),
            batch_size=batch_size,
            val_batch_size=val_batch_size,
            noise=_check_noise(noise),
            lam_max=float(lam_max),
            lam0=float(lam0),
            ridge=float(ridge),
            test=None if test is None else {"X": jnp.asarray(test[0]), "y": jnp.asarray(test[1])},
            test_batch_size=test_batch_size,
            name=name or f"online_l2_hpo(n={n}, d={d}, C={C}, T={horizon})",
        )
        for field, value in zip(("outer", "inner", "metrics"), stream._functions(), strict=True):
            object.__setattr__(stream, field, value)
        return stream

    def _functions(self):
        X, ridge, horizon, noise, test = self.X, self.ridge, self.horizon, self.noise, self.test

        def ce(theta, batch):  # batch: indices into X and the labels as received
            return jnp.mean(M.softmax_cross_entropy(X[batch["idx"]] @ theta, batch["y"]))

        def inner(t, lam, theta, batch):
            reg = 0.5 * jnp.sum(lam * jnp.sum(theta**2, axis=1)) + 0.5 * ridge * jnp.sum(theta**2)
            return ce(theta, batch) + reg

        def outer(t, lam, theta, batch):
            return ce(theta, batch)

        def metrics(t, lam, theta):
            out = {"noise": noise_level(t, horizon, noise), "lam_mean": jnp.mean(lam)}
            if test is not None:  # round t's own draw of the test set, the same for every run
                key = jax.random.fold_in(jax.random.PRNGKey(0), t)
                idx = jax.random.randint(key, (self.test_batch_size,), 0, test["y"].shape[0])
                out["test_acc_batch"] = M.accuracy(test["X"][idx] @ theta, test["y"][idx])
            return out

        return outer, inner, metrics

    def draw(self, seed: int) -> tuple[dict, dict]:
        """The held per-round data of stream ``seed``: ``(outer_data, inner_data)``, dicts of
        int32 arrays ``idx`` (rows of ``X``) and ``y`` (labels as received), ``(T, batch)``."""
        rng = np.random.default_rng(seed)
        T, B, Bv, C = self.horizon, self.batch_size, self.val_batch_size, self.num_classes
        n = len(self.y_train)
        idx = rng.integers(0, n, (T, B))
        rounds = np.arange(1, T + 1)
        p = np.asarray(noise_level(rounds, T, self.noise))[:, None]
        flip = rng.random((T, B)) < p
        labels = self.y_train[idx]
        labels = np.where(flip, (labels + rng.integers(1, C, (T, B))) % C, labels)
        val_idx = rng.integers(0, len(self.y_val), (T, Bv))
        outer = {"idx": (n + val_idx).astype(np.int32), "y": self.y_val[val_idx].astype(np.int32)}
        return outer, {"idx": idx.astype(np.int32), "y": labels.astype(np.int32)}

    def problem(self, seed: int = 0) -> OnlineProblem:
        """The stream drawn with ``seed`` as a :class:`bilevel.OnlineProblem`."""
        outer_data, inner_data = self.draw(seed)
        d, C = self.X.shape[1], self.num_classes
        dtype = self.X.dtype
        return OnlineProblem(
            outer=self.outer,
            inner=self.inner,
            horizon=self.horizon,
            x0=jnp.full((d,), self.lam0, dtype),
            y0=jnp.zeros((d, C), dtype),
            x_set=sets.Box(0.0, self.lam_max),
            outer_data=outer_data,
            inner_data=inner_data,
            metrics=self.metrics,
            name=self.name,
        )


def online_l2_hpo(X_train, y_train, X_val, y_val, *, seed: int = 0, **options) -> OnlineProblem:
    r"""The online per-feature L2 HPO stream of F2OBO's Experiment 2 (module docstring).

    Args:
        X_train, y_train: ``(n, d)`` features and ``(n,)`` int labels in 0..C-1: the pool the
            training batches D_t^tr are drawn from (labels then flipped with probability p(t)).
        X_val, y_val: the clean validation pool of the D_t^val draws.
        seed: the stream's draw (batches and label flips).
        num_classes: C.
        horizon: T, the number of rounds.
        batch_size, val_batch_size: samples per round of each level (the paper: a batch of
            256 per step; whether per split is unclear, so both default to 256).
        noise: the label-noise schedule, ``(fraction of T after which it starts, level)``
            pairs; default the paper's ((0.25, 0.05), (0.5, 0.10), (0.75, 0.15)). ``()``: clean.
        lam_max: the box's upper end (paper 0.1); lam in [0, lam_max]^d.
        lam0: the start lam_1 = lam0 in every coordinate (not given by the paper).
        ridge: the fixed L2 term keeping g_t strongly convex at lam = 0 (not in the paper).
        X_test, y_test, test_batch_size: an optional test set: the per-round metric
            ``test_acc_batch`` is the accuracy on round t's own draw of ``test_batch_size``
            test samples (the same draw for every seed and method).
        name: a label.

    Returns:
        A :class:`bilevel.OnlineProblem` with x = lam of shape (d,), y = theta of shape (d, C)
        starting at 0, held per-round data ``{"idx", "y"}`` for both levels (sample rows of the
        pools and the labels as received), and per-round metrics ``noise`` (p(t)),
        ``lam_mean`` and, with a test set, ``test_acc_batch``. The training loss of round t at
        (x, y) is ``problem.outer(t, x, y, round t's inner data)`` (f is the plain
        cross-entropy of whichever batch it is given). For several seeds build an
        :class:`OnlineHPOStream` once and call its ``problem(seed)``.

    Raises:
        ValueError: mismatched shapes, labels out of range, batches larger than their pool, a
            bad noise schedule or box.
    """
    return OnlineHPOStream.build(X_train, y_train, X_val, y_val, **options).problem(seed)

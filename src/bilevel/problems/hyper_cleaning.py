r"""Data hyper-cleaning: learn one weight per (noisily labelled) training sample.

Kwon, Kwon, Wright, Nowak, "A Fully First-Order Method for Stochastic Bilevel Optimization",
ICML 2023, Section 5, in the *mean* form (as stocBiO's implementation, the paper's SOBO
baseline, does)::

    min_x  f(x, y) = (1/m) sum_{j <= m} CE(y; a_j, b_j)                      (clean validation)
    s.t.   y*(x) = argmin_y  g(x, y) = (1/n) sum_{i <= n} sigmoid(x_i) CE(y; a~_i, b~_i)
                                       + c ||y||^2                           (noisy training)

``x in R^n`` holds one logit per training sample (``x0 = 0``: every weight 0.5), ``y`` is the
model: multinomial logistic regression ``{"W": (d, C), "b": (C,)}`` (zeros at the start), a
one-hidden-layer ReLU MLP (``model="mlp"``), or a small CNN (``model="cnn"``: LeNet-5 features
and a linear head, for 28x28 or 32x32 images given as flat rows). The paper writes sums; with
sums over 19,000 samples ``c = 0.01`` would be negligible and mu_g, L_g would scale with n,
changing every step-size rule.

* The ridge ``c ||y||^2`` covers the bias too (Section 5 names only "a logistic loss function
  with parameter w"; stocBiO's model is ``W in R^{10 x 785}``, 784 pixels plus a bias column):
  without it the bias would have a flat direction (softmax is invariant to adding a constant
  to every logit), so mu_g would be 0. With ``model="logistic"``, g is ``2c``-strongly convex
  in y for every x. The MLP and the CNN are not convex; they are offered for experiments only.
* The inner data carries an ``"index"`` column ``arange(n)``: a minibatch B gives
  ``(1/|B|) sum_{i in B} sigmoid(x_{index_i}) CE_i + c ||y||^2``, an unbiased estimate of g whose
  x-gradient is sparse (non-zero only on the sampled coordinates, each with factor 1/|B|).
* ``d g / d x_i = sigmoid'(x_i) CE_i(y) / n`` on the full data; f does not depend on x, so
  ``grad_x f = 0`` and the hypergradient is the implicit term only.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bilevel.core.problem import BilevelProblem
from bilevel.core.tree import tree_add, tree_norm, tree_scale
from bilevel.problems import models as M

__all__ = [
    "hyper_cleaning",
    "HyperCleaningReference",
    "train_without_bilevel",
    "retrain",
    "hyper_cleaning_dataset",
]

_FN = "hyper_cleaning"
#: rows per block when the metrics of a network (mlp, cnn) run over a whole data split
EVAL_ROWS = 1000


@dataclasses.dataclass(frozen=True, eq=False)
class HyperCleaningReference:
    """What :func:`train_without_bilevel` needs to refit the model; solvers never read it.

    Attributes:
        apply: ``apply(y, X) -> logits (n, C)``, the model.
        c: the ridge coefficient of g.
        num_classes: C.
        model: ``"logistic"``, ``"mlp"`` or ``"cnn"``.
        corrupted: the boolean mask of corrupted training labels, or ``None``.
    """

    apply: Callable[..., Any]
    c: float
    num_classes: int
    model: str
    corrupted: np.ndarray | None = None


def _cnn(params: dict, X: jax.Array) -> jax.Array:
    """Logits of LeNet-5 features and a linear head for flat 28x28 or 32x32 image rows."""
    side = 28 if X.shape[1] == 784 else 32
    images = X.reshape(X.shape[0], 1, side, side)
    pad = (32 - side) // 2
    images = jnp.pad(images, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    return M.linear(params["head"], M.lenet5_features(params["features"], images))


def hyper_cleaning(
    X_train,
    y_train_noisy,
    X_val,
    y_val,
    *,
    num_classes: int,
    c: float = 0.01,
    X_test=None,
    y_test=None,
    corrupted=None,
    model: str = "logistic",
    hidden: int = 0,
    seed: int = 0,
    compute_dtype=None,
) -> BilevelProblem:
    r"""The data hyper-cleaning problem of F2SA (mean form; see the module docstring).

    Args:
        X_train: ``(n, d)`` training features; ``y_train_noisy``: ``(n,)`` int labels in
            ``0..C-1`` (corrupted). These are the inner data.
        X_val, y_val: ``(m, d)`` and ``(m,)``: the clean validation set (the outer data).
        num_classes: C.
        c: the inner ridge ``c ||y||^2`` (not ``c/2``), on every model parameter.
        X_test, y_test: an optional test set for the ``test_loss`` / ``test_acc`` metrics.
        corrupted: optional ``(n,)`` bool mask of the corrupted training labels (as returned by
            ``bl.data.corrupt_labels``); adds the metrics ``weight_corrupted`` and
            ``weight_clean``, the mean of ``sigmoid(x)`` over each group.
        model: ``"logistic"`` (multinomial logistic regression, y0 = 0), ``"mlp"`` (one
            hidden ReLU layer of ``hidden`` units, PyTorch-style init seeded by ``seed``) or
            ``"cnn"`` (LeNet-5 features, ``bl.problems.models.lenet5_features``, and a linear
            head, ``y = {"features", "head"}``; rows of ``d = 784`` or ``1024`` pixels are
            28x28 images, zero-padded to 32x32, or 32x32 ones).
        hidden: hidden width for ``model="mlp"`` (must be 0 otherwise).
        seed: seed of the MLP / CNN initialisation.
        compute_dtype: ``None`` (compute in the parameters' dtype) or ``"bfloat16"`` for
            ``model="mlp"`` / ``"cnn"``: the features are stored in bfloat16 (half the memory
            of float32) and the network runs on them with bfloat16 activations
            (``bl.problems.models.in_compute_dtype``), while y, x, the logits, the losses and
            every gradient stay in the default float dtype. Refused for ``"logistic"``: one
            matrix product, where rounding the logits to 8 bits of mantissa would perturb the
            strongly convex g that this model is the exact reference for.

    Returns:
        A :class:`bilevel.BilevelProblem` with ``x0 = zeros(n)``, inner data ``{"X", "y",
        "index"}``, outer data ``{"X", "y"}``, and metrics ``val_loss``, ``val_acc`` (full
        validation set), ``test_loss``, ``test_acc`` (if a test set is given),
        ``weight_corrupted``, ``weight_clean`` (if ``corrupted`` is given). Its ``reference``
        is a :class:`HyperCleaningReference`.

    Raises:
        ValueError: naming the argument, for shapes that disagree, labels out of range,
            non-finite features, ``c < 0``, an unknown ``model`` or ``compute_dtype``, or
            ``compute_dtype`` with ``model="logistic"``.

    References:
        Kwon, Kwon, Wright, Nowak. "A Fully First-Order Method for Stochastic Bilevel
        Optimization." ICML 2023 (Section 5). Franceschi, Donini, Frasconi, Pontil. "Forward
        and Reverse Gradient-Based Hyperparameter Optimization." ICML 2017 (hyper-cleaning).

    Assumptions:
        g is 2c-strongly convex in y for ``model="logistic"`` and ``c > 0``.
    """
    C = M.check_num_classes(num_classes, _FN)
    Xtr, ytr = M.check_pair(X_train, y_train_noisy, "X_train", "y_train_noisy", _FN, num_classes=C)
    n, d = Xtr.shape
    Xv, yv = M.check_pair(X_val, y_val, "X_val", "y_val", _FN, num_classes=C, d=d)
    test = M.check_optional_pair(X_test, y_test, "X_test", "y_test", _FN, num_classes=C, d=d)
    c = M.check_nonneg(c, "c", _FN)
    _check_model(model, hidden, d)
    low = _check_compute_dtype(compute_dtype, model)
    mask = _check_corrupted(corrupted, n)
    dtype = M.float_dtype()
    apply, y0 = _model(model, d, C, hidden, seed, dtype)
    if low is not None:  # data stored in the compute dtype; the model casts y to it
        apply = M.in_compute_dtype(apply, low, dtype)
        Xtr, Xv = Xtr.astype(low), Xv.astype(low)
        test = None if test is None else (test[0].astype(low), test[1])
    inner_data = {"X": Xtr, "y": ytr, "index": np.arange(n, dtype=np.int32)}
    outer_data = {"X": Xv, "y": yv}
    inner, outer = _cleaning_levels(apply, c)
    # a network's activations on a whole split take gigabytes (LeNet-5 on 59,000 images: 19 GB
    # peak for the default full-data inner_grad_norm): its metrics run over blocks of rows
    rows = None if model == "logistic" else EVAL_ROWS
    metrics = _cleaning_metrics(apply, inner, outer_data, test, mask, inner_data, rows)
    ref = HyperCleaningReference(apply=apply, c=c, num_classes=C, model=model, corrupted=mask)
    label = f"mlp{hidden}" if model == "mlp" else model
    label += "" if low is None else ", bfloat16 compute"
    return BilevelProblem(
        outer=outer,
        inner=inner,
        x0=jnp.zeros((n,), dtype),
        y0=y0,
        outer_data=outer_data,
        inner_data=inner_data,
        metrics=metrics,
        name=f"hyper_cleaning(n={n}, d={d}, C={C}, c={c}, {label})",
        reference=ref,
    )


def _check_model(model: str, hidden, d: int) -> None:
    M.check_choice(model, "model", _FN, ("logistic", "mlp", "cnn"))
    if model != "mlp" and hidden != 0:
        raise ValueError(f"{_FN}(hidden=...) must be 0 for model={model!r}, got {hidden!r}.")
    if model == "cnn" and d not in (784, 1024):
        raise ValueError(
            f"{_FN}(model='cnn') needs square images as rows of 784 (28x28) or 1024 (32x32) "
            f"pixels; X_train has {d} columns."
        )
    if model == "mlp" and not (isinstance(hidden, int | np.integer) and hidden >= 1):
        raise ValueError(f"{_FN}(hidden=...) must be an int >= 1 for model='mlp', got {hidden!r}.")


def _check_corrupted(corrupted, n: int) -> np.ndarray | None:
    if corrupted is None:
        return None
    mask = np.asarray(corrupted)
    if mask.shape != (n,) or mask.dtype != bool:
        raise ValueError(
            f"{_FN}(corrupted=...) must be a bool array of shape ({n},) (one flag per "
            f"training sample), got dtype {mask.dtype} and shape {mask.shape}."
        )
    return mask


def _model(model: str, d: int, C: int, hidden, seed: int, dtype):
    """``(apply, y0)``: the model ``apply(y, X) -> logits`` and its start."""
    if model == "logistic":
        return M.linear, M.init_linear(d, C, dtype)
    if model == "mlp":
        return M.mlp, M.init_mlp((d, int(hidden), C), seed=seed, dtype=dtype)
    head = M.init_linear(M.LENET5_FEATURES, C, dtype)
    return _cnn, {"features": M.init_lenet5(seed, dtype), "head": head}


def _cleaning_levels(apply, c: float):
    """``(inner, outer)``: the sigmoid-weighted training cross-entropy plus ``c ||y||^2`` over
    the batch's ``"index"`` column, and the validation cross-entropy (F2SA, Sec. 5)."""

    def inner(x, y, batch):
        weights = jax.nn.sigmoid(x[batch["index"]])
        ce = M.softmax_cross_entropy(apply(y, batch["X"]), batch["y"])
        return jnp.mean(weights * ce) + c * M.sum_of_squares(y)

    def outer(x, y, batch):
        return jnp.mean(M.softmax_cross_entropy(apply(y, batch["X"]), batch["y"]))

    return inner, outer


def _cleaning_metrics(apply, inner, val: dict, test, mask, inner_data: dict, rows: int | None):
    """The metrics of :func:`hyper_cleaning` (its Returns), over blocks of ``rows`` rows
    (``None``: each split at once); with ``rows``, also ``inner_grad_norm`` by blocks."""
    Xv_j, yv_j = jnp.asarray(val["X"]), jnp.asarray(val["y"])
    test_j = None if test is None else tuple(jnp.asarray(a) for a in test)
    groups = {}
    if mask is not None:
        for name, sel in (("weight_corrupted", mask), ("weight_clean", ~mask)):
            if sel.any():
                groups[name] = jnp.asarray(np.flatnonzero(sel).astype(np.int32))
    inner_j = jax.tree.map(jnp.asarray, inner_data) if rows else None

    def loss_and_accuracy(y, X, labels):
        def stats(b):
            logits = apply(y, b["X"])
            ce = jnp.mean(M.softmax_cross_entropy(logits, b["y"]))
            return ce, M.accuracy(logits, b["y"])

        return _mean_over_blocks(stats, {"X": X, "y": labels}, rows)

    def metrics(x, y):
        out = dict(zip(("val_loss", "val_acc"), loss_and_accuracy(y, Xv_j, yv_j), strict=True))
        if test_j is not None:
            test_stats = loss_and_accuracy(y, *test_j)
            out.update(zip(("test_loss", "test_acc"), test_stats, strict=True))
        for name, idx in groups.items():
            out[name] = jnp.mean(jax.nn.sigmoid(x[idx]))
        if inner_j is not None:  # replaces bl.metrics' one-pass full-data gradient
            grad = _mean_over_blocks(lambda b: jax.grad(inner, argnums=1)(x, y, b), inner_j, rows)
            out["inner_grad_norm"] = tree_norm(grad)
        return out

    return metrics


def _mean_over_blocks(fn, data, rows: int | None):
    """``fn(data)`` for ``fn`` a mean over the rows of its batch plus terms free of the data
    (every loss and accuracy here), computed as the mean of ``fn`` over blocks of ``rows`` rows
    in a ``lax.scan`` (the last block, if shorter, weighted by its size), so activations exist
    for one block at a time. Exact up to rounding. ``rows=None``: one call on everything."""
    if rows is None:
        return fn(data)
    # data closed over by the metrics is a constant of the program: without the barrier XLA
    # constant-folds the network's first layers on it at compile time (LeNet-5's stacked
    # windows of 1,000 validation images: a 78 MB constant, seconds of compilation)
    data = jax.lax.optimization_barrier(data)
    n = jax.tree.leaves(data)[0].shape[0]
    k = n // rows
    if k <= 1:
        return fn(data)
    blocks = jax.tree.map(lambda a: a[: k * rows].reshape(k, rows, *a.shape[1:]), data)
    zero = jax.tree.map(jnp.zeros_like, jax.eval_shape(fn, jax.tree.map(lambda a: a[0], blocks)))
    total = jax.lax.scan(lambda acc, b: (tree_add(acc, fn(b)), None), zero, blocks)[0]
    mean = tree_scale(1.0 / k, total)
    if k * rows == n:
        return mean
    rest = fn(jax.tree.map(lambda a: a[k * rows :], data))
    return tree_add(tree_scale(k * rows / n, mean), tree_scale((n - k * rows) / n, rest))


def _check_compute_dtype(compute_dtype, model: str):
    low = M.check_compute_dtype(compute_dtype, _FN)
    if low is not None and model == "logistic":
        raise ValueError(
            f"{_FN}(compute_dtype={compute_dtype!r}) is for model='mlp' or 'cnn'; the logistic "
            "model is the exact, strongly convex reference and runs in the default float dtype "
            "(leave compute_dtype=None)."
        )
    return low


def train_without_bilevel(
    problem: BilevelProblem,
    *,
    steps: int = 1000,
    lr: float | None = None,
    weight: float = 1.0,
):
    r"""The "Without BO" baseline: fit the model on the noisy training data, no reweighting.

    Minimises ``weight * (1/n) sum_i CE_i(y) + c ||y||^2`` on the full inner data of a
    :func:`hyper_cleaning` problem by ``steps`` of Nesterov's accelerated full-batch gradient
    descent from ``problem.y0``. ``weight=1`` is plain training on the noisy labels; ``weight=0.5``
    gives ``argmin_y g(x0, y)``, the model every bilevel method starts from.

    For ``model="logistic"`` the default step is ``1/L`` with the bound ``L = weight *
    lambda_max(A^T A / n) / 2 + 2c`` (A = [X, 1]; the softmax cross-entropy Hessian in the logits
    has norm <= 1/2) and the momentum ``(sqrt(L) - sqrt(mu)) / (sqrt(L) + sqrt(mu))`` with
    ``mu = 2c`` (or the ``k/(k+3)`` schedule when ``c = 0``): linear convergence at the rate
    ``1 - sqrt(mu/L)``. For ``model="mlp"`` / ``"cnn"`` (non-convex) the default is ``lr=0.1`` with
    momentum 0.9.

    Returns:
        y, the fitted model parameters. Evaluate it with ``problem.metrics(problem.x0, y)``.

    Raises:
        ValueError: ``problem`` was not built by :func:`hyper_cleaning`, or bad ``steps``/``lr``.
    """
    fn = "train_without_bilevel"
    n = _check_fit_args(problem, steps, fn)
    weight = M.check_nonneg(weight, "weight", fn)
    return _fit(problem, jnp.full((n,), weight, M.float_dtype()), steps, lr, fn)


def retrain(problem: BilevelProblem, x, *, steps: int = 1000, lr: float | None = None):
    r"""The model the learned sample weights give: ``y*(x) = argmin_y g(x, y)``, fitted.

    Minimises ``(1/n) sum_i sigmoid(x_i) CE_i(y) + c ||y||^2`` by the accelerated full-batch
    method of :func:`train_without_bilevel` (same step rule, with ``weight`` replaced by the
    largest ``sigmoid(x_i)``), so ``problem.metrics(x, retrain(problem, x))`` evaluates the bilevel
    objective ``F(x) = f(x, y*(x))`` itself rather than a solver's current, partly trained,
    iterate. This is what a cleaned data set is for: training a model on it.
    """
    fn = "retrain"
    n = _check_fit_args(problem, steps, fn)
    x = jnp.asarray(x)
    if x.shape != (n,):
        raise ValueError(
            f"{fn}(x=...) must have shape ({n},) (one logit per sample), got {x.shape}."
        )
    if not bool(jnp.all(jnp.isfinite(x))):
        raise ValueError(f"{fn}(x=...) has non-finite entries.")
    return _fit(problem, jax.nn.sigmoid(x), steps, lr, fn)


def _check_fit_args(problem: BilevelProblem, steps, fn: str) -> int:
    if not isinstance(problem.reference, HyperCleaningReference):
        raise ValueError(f"{fn}(problem=...) must be a problem built by hyper_cleaning().")
    if not (isinstance(steps, int) and steps >= 1):
        raise ValueError(f"{fn}(steps=...) must be an int >= 1, got {steps!r}.")
    return int(problem.inner_data["y"].shape[0])


def _fit(problem: BilevelProblem, weights: jax.Array, steps: int, lr: float | None, fn: str):
    """Accelerated full-batch descent on ``mean_i weights_i CE_i(y) + c ||y||^2`` from y0."""
    ref = problem.reference
    data = problem.inner_data
    c = ref.c
    if lr is None:
        if ref.model == "logistic":
            X = np.asarray(data["X"], np.float64)
            A = np.concatenate([X, np.ones((X.shape[0], 1))], axis=1)
            lam = float(np.linalg.eigvalsh(A.T @ A / X.shape[0])[-1])
            L = 0.5 * float(jnp.max(weights)) * lam + 2.0 * c
            lr = 1.0 / L
            if c > 0:
                q = np.sqrt(2.0 * c / L)
                momentum = (1.0 - q) / (1.0 + q)
            else:
                momentum = None  # k / (k + 3)
        else:
            lr, momentum = 0.1, 0.9
    else:
        if not lr > 0:
            raise ValueError(f"{fn}(lr=...) must be > 0, got {lr!r}.")
        momentum = 0.9 if ref.model in ("mlp", "cnn") else None

    return _accelerated_fit(
        problem.y0,
        weights,
        data["X"],
        data["y"],
        c,
        lr,
        0.0 if momentum is None else momentum,
        apply=ref.apply,
        steps=steps,
        k_over_k3=momentum is None,
    )


@functools.partial(jax.jit, static_argnames=("apply", "steps", "k_over_k3"))
def _accelerated_fit(y0, weights, X, labels, c, lr, momentum, *, apply, steps, k_over_k3):
    """``steps`` of Nesterov's method; one compilation per model and data shape (not per call)."""

    def loss(y):
        ce = M.softmax_cross_entropy(apply(y, X), labels)
        return jnp.mean(weights * ce) + c * M.sum_of_squares(y)

    def body(carry, k):
        y, y_prev = carry
        beta = k / (k + 3.0) if k_over_k3 else momentum
        z = jax.tree.map(lambda a, b: a + beta * (a - b), y, y_prev)
        grad = jax.grad(loss)(z)
        return (jax.tree.map(lambda a, g: a - lr * g, z, grad), y), None

    ks = jnp.arange(steps, dtype=M.float_dtype())
    (y, _), _ = jax.lax.scan(body, (y0, y0), ks)
    return y


def hyper_cleaning_dataset(
    dataset: str = "fashion_mnist",
    *,
    p: float = 0.1,
    n_train: int = 19000,
    n_val: int = 1000,
    n_test: int = 10000,
    seed: int = 0,
    path=None,
    **options,
) -> BilevelProblem:
    """Hyper-cleaning on (Fashion-)MNIST as in F2SA Section 5 (19,000 noisy + 1,000 clean).

    Draws ``n_train + n_val`` images of the training split by a seeded permutation, corrupts
    the first ``n_train`` labels with probability ``p`` (``bl.data.corrupt_labels``: a uniformly
    random *different* class, fixed once), keeps the next ``n_val`` clean for validation, and
    the first ``n_test`` images of the test split for testing. Pixels are scaled to [0, 1] by
    the loader, then normalised by the mean and standard deviation of the training pixels
    (stocBiO's ``Normalize(0.1307, 0.3081)`` for MNIST) and flattened to 784 features. ``options``
    go to :func:`hyper_cleaning` (``c``, ``model``, ``hidden``).

    Args:
        dataset: ``"fashion_mnist"`` (available offline as a Debian package) or ``"mnist"``.
        p: label corruption probability (the paper uses 0.1 and 0.3).
    """
    from bilevel import data as bl_data

    fn = "hyper_cleaning_dataset"
    M.check_choice(dataset, "dataset", fn, ("fashion_mnist", "mnist"))
    load = bl_data.load_fashion_mnist if dataset == "fashion_mnist" else bl_data.load_mnist
    images, labels = load("train", path)
    images_t, labels_t = load("test", path)
    if n_train + n_val > images.shape[0] or n_test > images_t.shape[0]:
        raise ValueError(
            f"{fn}: n_train + n_val = {n_train + n_val} (of {images.shape[0]}) or n_test = "
            f"{n_test} (of {images_t.shape[0]}) exceeds the split sizes."
        )
    rng = np.random.default_rng(seed)
    perm = rng.permutation(images.shape[0])[: n_train + n_val]
    X = images[perm].reshape(len(perm), -1).astype(np.float64)
    y = labels[perm]
    mean, std = X[:n_train].mean(), X[:n_train].std()
    X = (X - mean) / std
    X_test = (images_t[:n_test].reshape(n_test, -1) - mean) / std
    y_noisy, corrupted = bl_data.corrupt_labels(y[:n_train], p, 10, seed=seed)
    return hyper_cleaning(
        X[:n_train],
        y_noisy,
        X[n_train:],
        y[n_train:],
        num_classes=10,
        X_test=X_test,
        y_test=labels_t[:n_test],
        corrupted=corrupted,
        **options,
    )

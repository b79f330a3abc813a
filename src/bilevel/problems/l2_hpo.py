r"""L2 hyperparameter optimisation: one regularisation coefficient per feature (or weight).

Two problems, both with a validation loss that does not depend on x (``grad_x f = 0``):

**STABLE eq. (32)** (:func:`l2_hpo_logistic`; Chen, Sun, Xiao, Yin, AISTATS 2022, Sec. 4),
binary logistic regression with labels ``b in {-1, +1}`` and weights ``y in R^d``::

    min_x  f(x, y) = (1/m) sum_j log(1 + exp(-b_j a_j^T y))                  (validation)
    s.t.   y*(x) = argmin_y (1/n) sum_i log(1 + exp(-b~_i a~_i^T y)) + R(x, y)   (training)

with ``R = sum_i x_i y_i^2`` (``form="xy2"``, the paper's; no 1/2, not divided by n) or
``R = sum_i exp(x_i) y_i^2`` (``form="exp"``, a reparametrisation). R is deterministic, so it
sits in every minibatch estimate of g. The losses are means (eq. (32) writes expectations over
the training and validation sets).

*Positivity of x for ``form="xy2"``.* g is strongly convex (the paper's Assumption 2) only when
every ``x_i > 0`` (mu_g >= 2 min_i x_i), and eq. (32)'s ``x in R^d`` guarantees nothing. The
paper's problem (1a) allows a closed convex set X for x, onto which eq. (8a) projects, so the
problem carries ``x_set = bl.sets.Box(x_min, x_max)`` (default ``[1e-3, 10]``, so every
projected method stays in the strongly convex region) and starts at ``x0 = 0.1``.
``form="exp"`` is unconstrained with ``x0 = 0`` (the paper's algorithm on a reparametrised
problem, so no longer exactly the paper's).

**PZOBO E5 / hypertorch** (:func:`l2_hpo_linear`; Sow, Ji, Liang, NeurIPS 2022, Sec. 4.4 and
Appendix C, eq. (10)), a multinomial linear classifier ``w in R^{d x C}`` without bias,
initialised at 0::

    g(lambda, w) = (1/n) sum_i CE(w; a_i, b_i) + 0.5 * mean(w^2 * exp(lambda))
    f(lambda, w) = (1/m) sum_j CE(w; a_j, b_j)

where the mean in the regulariser runs over all ``d * C`` entries of w (hypertorch's
``l2reg_on_twentynews.py``) and ``lambda`` has one entry per feature, broadcast over the classes
(``per="feature"``, hypertorch), or one per weight (``per="weight"``, Appendix C's "lambda and w
have the same size"). ``lambda0 = 0``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bilevel.core import sets
from bilevel.core.problem import BilevelProblem
from bilevel.problems import models as M

__all__ = [
    "l2_hpo_logistic",
    "l2_hpo_linear",
    "newton_solve",
    "l2_hpo_logistic_dataset",
    "l2_hpo_linear_dataset",
]


# ---- damped Newton (jit-able) ----------------------------------------------------------------
def newton_solve(fun, y, *, steps: int = 10, halvings: int = 12):
    """Minimise a smooth strongly convex ``fun(y)`` (y a flat vector) by damped Newton.

    Each of the ``steps`` iterations takes the dense Newton direction and the first step of
    ``1, 1/2, ..., 2^-(halvings-1)`` that satisfies Armijo's condition (all candidates are
    evaluated at once, so it stays a fixed-shape, jit-able computation); if none does (at
    convergence, when rounding dominates) it stays put. Unlike pure Newton it cannot diverge
    from a poor warm start. Quadratically convergent near the minimiser. Meant for ``y`` of up
    to a few hundred entries (dense Hessian).
    """
    ts = 0.5 ** jnp.arange(halvings, dtype=y.dtype)

    def step(yy, _):
        val, grad = jax.value_and_grad(fun)(yy)
        direction = jnp.linalg.solve(jax.hessian(fun)(yy), grad)
        slope = grad @ direction
        vals = jax.vmap(lambda t: fun(yy - t * direction))(ts)
        ok = (vals <= val - 1e-4 * ts * slope) & jnp.isfinite(vals)
        t = jnp.where(jnp.any(ok), ts[jnp.argmax(ok)], jnp.zeros((), y.dtype))
        return yy - t * direction, None

    y, _ = jax.lax.scan(step, y, None, length=steps)
    return y


# ---- STABLE eq. (32) -------------------------------------------------------------------------
def _check_pm1(b, arg: str, fn: str, n: int) -> np.ndarray:
    a = np.asarray(b)
    if a.shape != (n,):
        raise ValueError(
            f"{fn}({arg}=...) must have shape ({n},) to match its features, got {a.shape}."
        )
    if a.dtype.kind not in "biuf" or not np.all(np.isin(a, (-1, 1))):
        raise ValueError(
            f"{fn}({arg}=...) must hold labels -1/+1 (for 0/1 labels pass 2 * y - 1; for "
            "multiclass labels use bl.data.binary_from_multiclass)."
        )
    return a.astype(M.float_dtype())


def l2_hpo_logistic(
    X_train,
    y_train,
    X_val,
    y_val,
    *,
    form: str = "xy2",
    X_test=None,
    y_test=None,
    x_min: float = 1e-3,
    x_max: float = 10.0,
    x0=None,
    y0=None,
    newton_steps: int = 10,
) -> BilevelProblem:
    r"""Per-feature L2 regularisation of logistic regression, STABLE eq. (32) (mean losses).

    Args:
        X_train, y_train: ``(n, d)`` features and ``(n,)`` labels in ``{-1, +1}`` (inner data).
        X_val, y_val: ``(m, d)`` and ``(m,)``: the outer (validation) data.
        form: ``"xy2"`` (``R = sum_i x_i y_i^2``, the paper's; x constrained to
            ``Box(x_min, x_max)``) or ``"exp"`` (``R = sum_i exp(x_i) y_i^2``, unconstrained).
        X_test, y_test: optional test set for ``test_loss`` / ``test_acc``.
        x_min, x_max: the box of ``form="xy2"`` (``0 < x_min <= x_max``; ``x_max=None`` for
            no upper bound, which leaves Frank-Wolfe's LMO unbounded).
        x0: start; default ``0.1 * ones(d)`` for ``"xy2"``, ``zeros(d)`` for ``"exp"``.
        y0: inner start; default ``zeros(d)``.
        newton_steps: damped-Newton iterations of the ``F`` / ``y_err`` metrics (warm-started
            at the current y, see :func:`newton_solve`).

    Returns:
        A :class:`bilevel.BilevelProblem` with inner data ``{"X", "b"}`` (train), outer data
        ``{"X", "b"}`` (validation) and metrics ``val_loss``, ``val_acc`` (at y), ``F`` (the
        exact objective ``f(x, y*(x))`` with ``y*(x)`` by damped Newton on the full training
        data), ``y_err`` (``||y - y*(x)||``), and ``test_loss``, ``test_acc`` (at y) if a test
        set is given.

    Raises:
        ValueError: naming the argument, for mismatched shapes, labels other than +-1, an
            unknown ``form`` or a box that is not inside ``x > 0``.

    References:
        Chen, Sun, Xiao, Yin. "A Single-Timescale Method for Stochastic Bilevel Optimization."
        AISTATS 2022 (Section 4, eq. (32)).

    Assumptions:
        g is strongly convex in y when every ``x_i > 0`` (``"xy2"``; mu_g >= 2 min_i x_i) and
        always for ``"exp"`` (mu_g >= 2 min_i exp(x_i)).
    """
    fn = "l2_hpo_logistic"
    M.check_choice(form, "form", fn, ("xy2", "exp"))
    Xtr, btr, Xv, bv, test = _check_logistic_data(X_train, y_train, X_val, y_val, X_test, y_test)
    if not (isinstance(newton_steps, int) and newton_steps >= 1):
        raise ValueError(f"{fn}(newton_steps=...) must be an int >= 1, got {newton_steps!r}.")
    n, d = Xtr.shape
    dtype = M.float_dtype()
    x_set = _positive_box(x_min, x_max) if form == "xy2" else None
    x0 = _start_vector(x0, "x0", 0.1 if form == "xy2" else 0.0, d, dtype)
    y0 = _start_vector(y0, "y0", 0.0, d, dtype)
    inner, outer = _logistic_levels(form)
    return BilevelProblem(
        outer=outer,
        inner=inner,
        x0=x0,
        y0=y0,
        outer_data={"X": Xv, "b": bv},
        inner_data={"X": Xtr, "b": btr},
        x_set=x_set,
        metrics=_logistic_metrics(inner, (Xtr, btr), (Xv, bv), test, newton_steps, dtype),
        name=f"l2_hpo_logistic(n={n}, d={d}, form={form})",
    )


def _check_logistic_data(X_train, y_train, X_val, y_val, X_test, y_test):
    """The checked ``(X_train, b_train, X_val, b_val, test)``, ``test`` a pair of jax arrays
    or ``None``."""
    fn = "l2_hpo_logistic"
    Xtr = M.check_features(X_train, "X_train", fn)
    n, d = Xtr.shape
    btr = _check_pm1(y_train, "y_train", fn, n)
    Xv = M.check_features(X_val, "X_val", fn)
    if Xv.shape[1] != d:
        raise ValueError(f"{fn}(X_val=...) has {Xv.shape[1]} features but X_train has {d}.")
    bv = _check_pm1(y_val, "y_val", fn, Xv.shape[0])
    test = None
    if X_test is not None or y_test is not None:
        if X_test is None or y_test is None:
            raise ValueError(
                f"{fn}({'X_test' if X_test is None else 'y_test'}=...) is "
                "required when the other of X_test/y_test is given."
            )
        Xt = M.check_features(X_test, "X_test", fn)
        if Xt.shape[1] != d:
            raise ValueError(f"{fn}(X_test=...) has {Xt.shape[1]} features but X_train has {d}.")
        test = (jnp.asarray(Xt), jnp.asarray(_check_pm1(y_test, "y_test", fn, Xt.shape[0])))
    return Xtr, btr, Xv, bv, test


def _positive_box(x_min, x_max) -> sets.Box:
    """``Box(x_min, x_max)`` inside ``x > 0``, where g is strongly convex (``x_max=None``:
    no upper bound)."""
    upper = np.inf if x_max is None else float(x_max)
    if not (float(x_min) > 0 and float(x_min) <= upper):
        raise ValueError(
            f"l2_hpo_logistic(x_min=...) must satisfy 0 < x_min <= x_max (strong convexity of g "
            f"needs x > 0), got x_min={x_min!r}, x_max={x_max!r}."
        )
    return sets.Box(lower=float(x_min), upper=upper)


def _start_vector(v, arg: str, default: float, d: int, dtype):
    """A start of shape ``(d,)``: ``v``, or ``default`` everywhere when ``v`` is None."""
    if v is None:
        return jnp.full((d,), default, dtype)
    a = np.asarray(v)
    if a.shape != (d,):
        raise ValueError(f"l2_hpo_logistic({arg}=...) must have shape ({d},), got {a.shape}.")
    return jnp.asarray(a, dtype)


def _logistic_loss(y, batch):
    """The mean logistic loss of the linear model y on a batch ``{"X", "b"}``."""
    return jnp.mean(M.logistic_loss(batch["b"] * (batch["X"] @ y)))


def _logistic_levels(form: str):
    """``(inner, outer)`` of eq. (32): the training loss plus R(x, y), the validation loss."""

    def reg(x, y):
        coef = x if form == "xy2" else jnp.exp(x)
        return jnp.sum(coef * y**2)

    def inner(x, y, batch):
        return _logistic_loss(y, batch) + reg(x, y)

    def outer(x, y, batch):
        return _logistic_loss(y, batch)

    return inner, outer


def _logistic_metrics(inner, train, val, test, newton_steps: int, dtype):
    """The metrics of :func:`l2_hpo_logistic`: at y, and at ``y*(x)`` by damped Newton on the
    full training data (warm-started at y)."""
    train = {"X": jnp.asarray(train[0]), "b": jnp.asarray(train[1])}
    val = {"X": jnp.asarray(val[0]), "b": jnp.asarray(val[1])}

    def acc(y, data):
        pred = jnp.where(data["X"] @ y >= 0, 1.0, -1.0)  # ties (e.g. y = 0) predict +1
        return jnp.mean((pred == data["b"]).astype(dtype))

    def metrics(x, y):
        y_star = newton_solve(lambda yy: inner(x, yy, train), y, steps=newton_steps)
        out = {
            "val_loss": _logistic_loss(y, val),
            "val_acc": acc(y, val),
            "F": _logistic_loss(y_star, val),
            "y_err": jnp.linalg.norm(y - y_star),
        }
        if test is not None:
            tdata = {"X": test[0], "b": test[1]}
            out["test_loss"] = _logistic_loss(y, tdata)
            out["test_acc"] = acc(y, tdata)
        return out

    return metrics


# ---- PZOBO E5 --------------------------------------------------------------------------------
def l2_hpo_linear(
    X_train,
    y_train,
    X_val,
    y_val,
    *,
    num_classes: int,
    per: str = "feature",
    X_test=None,
    y_test=None,
) -> BilevelProblem:
    r"""L2 HPO of a multinomial linear classifier (PZOBO E5, hypertorch's 20 Newsgroups setup).

    Args:
        X_train, y_train: ``(n, d)`` features and ``(n,)`` int labels (inner data).
        X_val, y_val: the validation set (outer data).
        num_classes: C.
        per: ``"feature"`` (``lambda in R^d``, broadcast over the classes; hypertorch) or
            ``"weight"`` (``lambda in R^{d x C}``; the paper's reading).
        X_test, y_test: optional test set for ``test_loss`` / ``test_acc``.

    Returns:
        A :class:`bilevel.BilevelProblem` with ``x0 = 0``, ``y0 = zeros(d, C)``, data
        ``{"X", "y"}`` and metrics ``val_loss``, ``val_acc`` and (with a test set)
        ``test_loss``, ``test_acc``.

    Raises:
        ValueError: naming the argument, for mismatched shapes, labels out of range, sparse
            input (densify after reducing the features) or an unknown ``per``.

    References:
        Sow, Ji, Liang. "On the Convergence Theory for Hessian-Free Bilevel Algorithms."
        NeurIPS 2022 (Section 4.4). Grazzi, Franceschi, Pontil, Salzo. "On the Iteration
        Complexity of Hypergradient Computation." ICML 2020 (the hypertorch setup).

    Assumptions:
        g is strongly convex in w: the regulariser adds ``exp(lambda) / (d C) > 0`` to every
        Hessian eigen-direction.
    """
    fn = "l2_hpo_linear"
    C = M.check_num_classes(num_classes, fn)
    M.check_choice(per, "per", fn, ("feature", "weight"))
    Xtr, ytr = M.check_pair(X_train, y_train, "X_train", "y_train", fn, num_classes=C)
    n, d = Xtr.shape
    Xv, yv = M.check_pair(X_val, y_val, "X_val", "y_val", fn, num_classes=C, d=d)
    test = M.check_optional_pair(X_test, y_test, "X_test", "y_test", fn, num_classes=C, d=d)
    dtype = M.float_dtype()

    def reg(lam, w):
        scale = jnp.exp(lam)
        if per == "feature":
            scale = scale[:, None]
        return 0.5 * jnp.mean(w**2 * scale)

    def ce(w, batch):
        return jnp.mean(M.softmax_cross_entropy(batch["X"] @ w, batch["y"]))

    def inner(lam, w, batch):
        return ce(w, batch) + reg(lam, w)

    def outer(lam, w, batch):
        return ce(w, batch)

    Xv_j, yv_j = jnp.asarray(Xv), jnp.asarray(yv)
    test_j = None if test is None else tuple(jnp.asarray(a) for a in test)

    def metrics(lam, w):
        logits = Xv_j @ w
        out = {
            "val_loss": jnp.mean(M.softmax_cross_entropy(logits, yv_j)),
            "val_acc": M.accuracy(logits, yv_j),
        }
        if test_j is not None:
            logits_t = test_j[0] @ w
            out["test_loss"] = jnp.mean(M.softmax_cross_entropy(logits_t, test_j[1]))
            out["test_acc"] = M.accuracy(logits_t, test_j[1])
        return out

    x_shape = (d,) if per == "feature" else (d, C)
    return BilevelProblem(
        outer=outer,
        inner=inner,
        x0=jnp.zeros(x_shape, dtype),
        y0=jnp.zeros((d, C), dtype),
        outer_data={"X": Xv, "y": yv},
        inner_data={"X": Xtr, "y": ytr},
        metrics=metrics,
        name=f"l2_hpo_linear(n={n}, d={d}, C={C}, per={per})",
    )


# ---- builders with default data (for the CLI registry) ---------------------------------------
_LIBSVM = ("australian", "ijcnn1", "covtype")


def l2_hpo_logistic_dataset(
    dataset: str = "breast_cancer",
    *,
    val_fraction: float = 0.5,
    seed: int = 0,
    path=None,
    **options,
) -> BilevelProblem:
    """:func:`l2_hpo_logistic` on a binary dataset, split train/validation at random (seeded).

    ``dataset``: the paper's LIBSVM sets ``"australian"``, ``"ijcnn1"``, ``"covtype"`` (scaled
    versions, used as loaded, no intercept; need the files, see ``bl.data.load_libsvm_dataset``),
    or scikit-learn's bundled ``"breast_cancer"`` (available offline; standardised with
    training statistics). ``options`` go to :func:`l2_hpo_logistic` (``form``, ...).
    """
    from bilevel import data as bl_data

    fn = "l2_hpo_logistic_dataset"
    M.check_choice(dataset, "dataset", fn, (*_LIBSVM, "breast_cancer"))
    if not 0 < val_fraction < 1:
        raise ValueError(f"{fn}(val_fraction=...) must be in (0, 1), got {val_fraction!r}.")
    if dataset in _LIBSVM:
        X, b = bl_data.load_libsvm_dataset(dataset, path)
    else:
        X, y = bl_data.load_sklearn(dataset)
        b = 2 * y.astype(np.int32) - 1
    (Xtr, btr), (Xv, bv), _ = bl_data.train_val_test_split(
        X, b, (1.0 - val_fraction, val_fraction, 0.0), seed=seed
    )
    if dataset not in _LIBSVM:
        Xtr, Xv = bl_data.standardize(Xtr, Xv)
    return l2_hpo_logistic(Xtr, btr, Xv, bv, **options)


def l2_hpo_linear_dataset(
    dataset: str = "digits",
    *,
    n_features: int | None = 10000,
    seed: int = 0,
    path=None,
    **options,
) -> BilevelProblem:
    """:func:`l2_hpo_linear` with default data.

    ``"20newsgroups"`` (PZOBO E5; needs scikit-learn's cache): the train subset split 50/50
    into train/validation (seeded), the test subset for testing, keeping the ``n_features``
    most frequent words (the full 130,107 columns would need a sparse model) with unit-norm
    rows. ``"digits"`` (scikit-learn, offline): 1797 8x8 images, standardised, split
    50/25/25. ``options`` go to :func:`l2_hpo_linear` (``per``).
    """
    from bilevel import data as bl_data

    fn = "l2_hpo_linear_dataset"
    M.check_choice(dataset, "dataset", fn, ("20newsgroups", "digits"))
    if dataset == "20newsgroups":
        X, y = bl_data.load_20newsgroups(path, n_features, subset="train")
        Xt, yt = bl_data.load_20newsgroups(path, n_features, subset="test")
        (Xtr, ytr), (Xv, yv), _ = bl_data.train_val_test_split(
            X.toarray(), y, (0.5, 0.5, 0.0), seed=seed
        )
        Xt = Xt.toarray()
        C = 20
    else:
        X, y = bl_data.load_sklearn("digits")
        (Xtr, ytr), (Xv, yv), (Xt, yt) = bl_data.train_val_test_split(
            X, y, (0.5, 0.25, 0.25), seed=seed
        )
        Xtr, Xv, Xt = bl_data.standardize(Xtr, Xv, Xt)
        C = 10
    return l2_hpo_linear(Xtr, ytr, Xv, yv, num_classes=C, X_test=Xt, y_test=yt, **options)

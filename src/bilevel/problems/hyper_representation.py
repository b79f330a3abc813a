r"""Hyper-representation: the outer level learns features, the inner level a head on them.

Sow, Ji, Liang, "On the Convergence Theory for Hessian-Free Bilevel Algorithms", NeurIPS 2022
(PZOBO), Sections 4.1 and 4.2 (experiments E1-E3 of this library: E1, E2 the linear and the
two-layer embedding of Sec. 4.1, E3 the LeNet of Sec. 4.2 and Appendix B.3).

**Shallow (E1, E2; eq. (8)).** With features ``T(X; x)`` and a ridge head ``w in R^d``::

    min_x  f(x, w) = 1/(2 n1) ||T(X1; x) w - Y1||^2                      (outer: validation)
    s.t.   w*(x) = argmin_w g(x, w) = 1/(2 n2) ||T(X2; x) w - Y2||^2 + gamma/2 ||w||^2
                                                                          (inner: training)

``T(X; H) = X H`` (``kind="linear"``, ``x = H in R^{m x d}``) or ``T(X; H1, H2) =
sigmoid(sigmoid(X H1) H2)`` (``kind="2layer"``, ``x = {"H1": (m, h), "H2": (h, d)}``, no biases,
as in the code). The inner data (``X_in, Y_in``) is the paper's training set (X2, Y2), the
outer data (``X_out, Y_out``) its validation set (X1, Y1). Both losses are means over samples,
so minibatches are unbiased. g is a ridge regression in w, gamma-strongly convex, with the
closed form ``w*(x) = (Z^T Z / n2 + gamma I)^{-1} Z^T Y2 / n2``, ``Z = T(X2; x)``, which gives
exact ``F`` and ``grad_norm`` metrics.

*Linear kind, exact hypergradient.* With ``G_k = X_k^T X_k / n_k``, ``c_k = X_k^T Y_k / n_k``,
``A = H^T G2 H + gamma I``, ``w = w*(H) = A^{-1} H^T c2``::

    grad_H f   = (G1 H w - c1) w^T,          grad_w f = H^T (G1 H w - c1),     v = A^{-1} grad_w f
    d^2g/dH dw [v] = (G2 H w - c2) v^T + G2 H v w^T
    grad F(H)  = (G1 H w - c1) w^T - (G2 H w - c2) v^T - G2 H v w^T          (IFT)

(``d^2g/dH dw [v]`` is the H-gradient of ``<grad_w g, v> = v^T H^T (G2 H w - c2) + gamma v^T w``.)
The metric evaluates these from the data (residuals, not Gram matrices, which would cancel
catastrophically in float32) and solves with A through a QR factorisation of the stacked
least-squares matrix ``[X2 H / sqrt(n2); sqrt(gamma) I]``. For ``kind="2layer"`` the same
quantity is obtained exactly by differentiating ``f(x, w*(x))`` through that QR solve.

**Deep (E3).** :func:`deep_hyper_representation`: x is a LeNet-5 feature extractor (60,856
parameters), y = a linear head ``{"W": (84, C), "b": (C,)}`` initialised at zero, cross-entropy
at both levels, the inner one plus ``beta/2 ||head||^2``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bilevel.core.problem import BilevelProblem
from bilevel.core.tree import tree_norm
from bilevel.problems import models as M

__all__ = [
    "synthetic_hyperrep_data",
    "hyper_representation",
    "deep_hyper_representation",
    "hyper_representation_synthetic",
    "deep_hyper_representation_dataset",
]

_DEFAULTS = {  # the notebooks' sizes: E1 (d = 128 case) and E2
    "linear": {"m": 64, "d": 128, "n": 500},
    "2layer": {"m": 256, "d": 256, "n": 5000, "hidden": 512},
}


def _sigmoid_net(H1, H2, X):
    return jax.nn.sigmoid(jax.nn.sigmoid(X @ H1) @ H2)


def synthetic_hyperrep_data(
    kind: str = "linear",
    m: int | None = None,
    d: int | None = None,
    n: int | None = None,
    seed: int = 0,
    hidden: int | None = None,
    n_out: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    r"""The synthetic data of PZOBO E1 / E2 (Grazzi et al. 2020's process, from the notebooks).

    ``kind="linear"``: ``H* ~ N(0,1)^{m x d}``, ``w* ~ N(0,1)^d``, ``X ~ N(0,1)^{n x m}``,
    ``Y = X H* w* + 0.1 N(0,1)``. ``kind="2layer"``: ``H1* ~ N(0,1)^{m x hidden}``,
    ``H2* ~ N(0,1)^{hidden x d}``, ``w* ~ N(0,1)^d``, ``Y = sigmoid(sigmoid(X H1*) H2*) w* +
    0.1 N(0,1)``. The inner (training) and outer (validation) sets are drawn independently
    from the same model.

    Args:
        kind: ``"linear"`` or ``"2layer"``.
        m: input dimension (the code's ``p``); default 64 (linear) / 256 (2layer).
        d: embedding dimension; default 128 / 256. (E1's second case: m=128, d=256, n=1000.)
        n: samples of the inner set; default 500 / 5000.
        seed: numpy seed.
        hidden: hidden width of the 2-layer generator; default 512.
        n_out: samples of the outer set (default ``n``).

    Returns:
        ``(X_in, Y_in, X_out, Y_out)`` as float32 numpy arrays (float64 under x64), ready for
        ``hyper_representation(*data, kind=kind, d=d, hidden=hidden)``.
    """
    fn = "synthetic_hyperrep_data"
    M.check_choice(kind, "kind", fn, ("linear", "2layer"))
    sizes = dict(_DEFAULTS[kind])
    for name, v in (("m", m), ("d", d), ("n", n), ("hidden", hidden), ("n_out", n_out)):
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
                raise ValueError(f"{fn}({name}=...) must be a positive int, got {v!r}.")
            sizes[name] = int(v)
    if kind == "linear" and hidden is not None:
        raise ValueError(f"{fn}(hidden=...) applies to kind='2layer' only.")
    m, d, n = sizes["m"], sizes["d"], sizes["n"]
    n2 = sizes.get("n_out", n)
    rng = np.random.default_rng(seed)
    if kind == "linear":
        H = rng.standard_normal((m, d))
        w = rng.standard_normal(d)

        def target(X):
            return X @ H @ w
    else:
        h = sizes["hidden"]
        H1 = rng.standard_normal((m, h))
        H2 = rng.standard_normal((h, d))
        w = rng.standard_normal(d)

        def sig(z):
            return 1.0 / (1.0 + np.exp(-z))

        def target(X):
            return sig(sig(X @ H1) @ H2) @ w

    out = []
    for size in (n, n2):
        X = rng.standard_normal((size, m))
        Y = target(X) + 0.1 * rng.standard_normal(size)
        out += [X, Y]
    dtype = M.float_dtype()
    return tuple(a.astype(dtype) for a in out)


def hyper_representation(
    X_in,
    Y_in,
    X_out,
    Y_out,
    *,
    kind: str = "linear",
    d: int,
    hidden: int | None = None,
    gamma: float = 0.1,
    x0=None,
    y0=None,
    seed: int = 0,
) -> BilevelProblem:
    r"""Shallow hyper-representation, PZOBO eq. (8) (see the module docstring).

    Args:
        X_in, Y_in: ``(n2, m)``, ``(n2,)``: the inner (training) data, X2 and Y2.
        X_out, Y_out: ``(n1, m)``, ``(n1,)``: the outer (validation) data, X1 and Y1.
        kind: ``"linear"`` (``x = H``, ``(m, d)``) or ``"2layer"`` (``x = {"H1": (m, hidden),
            "H2": (hidden, d)}``).
        d: embedding dimension (= dim y).
        hidden: hidden width, required for ``"2layer"``.
        gamma: inner ridge ``gamma/2 ||w||^2`` (E1: 0.1; E2's code: 0.001).
        x0, y0: starts; default ``x0`` entries N(0, 1) and ``y0 ~ N(0, I_d)`` (the code's fixed
            ``p0``), both from ``numpy.random.default_rng(seed)`` (x0 first).
        seed: seed of the default starts.

    Returns:
        A :class:`bilevel.BilevelProblem` with data ``{"X", "Y"}`` at both levels and exact
        metrics ``F`` (``f(x, w*(x))``) and ``grad_norm`` (``||grad F(x)||``): closed form for
        ``"linear"``, autodiff through the ridge solve for ``"2layer"``.

    Raises:
        ValueError: naming the argument, for mismatched shapes, ``gamma <= 0`` or a missing
            ``hidden``.

    References:
        Sow, Ji, Liang. "On the Convergence Theory for Hessian-Free Bilevel Algorithms."
        NeurIPS 2022 (Section 4.1, eq. (8)). Grazzi, Franceschi, Pontil, Salzo. "On the
        Iteration Complexity of Hypergradient Computation." ICML 2020.

    Assumptions:
        g is gamma-strongly convex in w for every x.
    """
    fn = "hyper_representation"
    M.check_choice(kind, "kind", fn, ("linear", "2layer"))
    X2, Y2, X1, Y1 = _check_shallow_data(X_in, Y_in, X_out, Y_out)
    (n2, m), n1 = X2.shape, X1.shape[0]
    if isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 1:
        raise ValueError(f"{fn}(d=...) must be a positive int, got {d!r}.")
    gamma = M.check_nonneg(gamma, "gamma", fn)
    if gamma == 0:
        raise ValueError(
            f"{fn}(gamma=...) must be > 0 (the inner problem must be strongly convex)."
        )
    shapes = _embedding_shapes(kind, m, d, hidden)
    x0, y0 = _shallow_starts(kind, m, shapes, x0, y0, d, seed)
    features = _shallow_features(kind)

    def sq_loss(x, w, batch):
        return 0.5 * jnp.mean((features(x, batch["X"]) @ w - batch["Y"]) ** 2)

    def inner(x, w, batch):
        return sq_loss(x, w, batch) + 0.5 * gamma * jnp.sum(w**2)

    X1j, Y1j, X2j, Y2j = (jnp.asarray(a) for a in (X1, Y1, X2, Y2))
    ridge = _ridge_solver(X2j, Y2j, gamma, d)
    if kind == "linear":
        metrics = _linear_metrics(ridge, X1j, Y1j, X2j, Y2j)
    else:
        metrics = _autodiff_metrics(ridge, features, sq_loss, X1j, Y1j, X2j)
    label = "linear" if kind == "linear" else f"2layer, hidden={hidden}"
    return BilevelProblem(
        outer=sq_loss,
        inner=inner,
        x0=x0,
        y0=y0,
        outer_data={"X": X1, "Y": Y1},
        inner_data={"X": X2, "Y": Y2},
        metrics=metrics,
        name=f"hyper_representation({label}, m={m}, d={d}, n_in={n2}, n_out={n1})",
    )


def _check_shallow_data(X_in, Y_in, X_out, Y_out):
    """The checked ``(X2, Y2, X1, Y1)`` of eq. (8): inner (training) then outer data."""
    fn = "hyper_representation"
    X2 = M.check_features(X_in, "X_in", fn)
    n2, m = X2.shape
    Y2 = M.check_features(Y_in, "Y_in", fn, ndim=1, n=n2)
    X1 = M.check_features(X_out, "X_out", fn)
    if X1.shape[1] != m:
        raise ValueError(f"{fn}(X_out=...) has {X1.shape[1]} columns but X_in has {m}.")
    Y1 = M.check_features(Y_out, "Y_out", fn, ndim=1, n=X1.shape[0])
    return X2, Y2, X1, Y1


def _embedding_shapes(kind: str, m: int, d: int, hidden):
    """The shapes of ``x = {"H1", "H2"}`` for ``kind="2layer"``; ``None`` for the linear kind
    (x = H, (m, d))."""
    fn = "hyper_representation"
    if kind == "2layer":
        if isinstance(hidden, bool) or not isinstance(hidden, int | np.integer) or hidden < 1:
            raise ValueError(
                f"{fn}(hidden=...) must be a positive int for kind='2layer', got {hidden!r}."
            )
        return {"H1": (m, int(hidden)), "H2": (int(hidden), d)}
    if hidden is not None:
        raise ValueError(f"{fn}(hidden=...) applies to kind='2layer' only.")
    return None


def _shallow_starts(kind: str, m: int, shapes, x0, y0, d: int, seed: int):
    """``(x0, y0)`` in the float dtype: the given ones (shapes checked) or N(0, 1) entries
    from ``default_rng(seed)``, x0 drawn first."""
    fn = "hyper_representation"
    rng = np.random.default_rng(seed)
    if x0 is None:
        if kind == "linear":
            x0 = rng.standard_normal((m, d))
        else:
            x0 = {k: rng.standard_normal(s) for k, s in shapes.items()}
    else:
        want = (m, d) if kind == "linear" else shapes
        got = jax.tree.map(np.shape, x0)
        if (kind == "linear" and got != want) or (
            kind == "2layer" and (not isinstance(x0, dict) or got != want)
        ):
            raise ValueError(f"{fn}(x0=...) must have shape(s) {want}, got {got}.")
    if y0 is None:
        y0 = rng.standard_normal(d)
    elif np.shape(y0) != (d,):
        raise ValueError(f"{fn}(y0=...) must have shape ({d},), got {np.shape(y0)}.")
    dtype = M.float_dtype()
    return jax.tree.map(lambda a: jnp.asarray(a, dtype), x0), jnp.asarray(y0, dtype)


def _shallow_features(kind: str):
    """T(X; x) of eq. (8): ``X H`` (linear) or ``sigmoid(sigmoid(X H1) H2)`` (2layer)."""
    if kind == "linear":

        def features(x, X):
            return X @ x
    else:

        def features(x, X):
            return _sigmoid_net(x["H1"], x["H2"], X)

    return features


def _ridge_solver(X2j, Y2j, gamma: float, d: int):
    """``ridge(Z) -> (w*, R)``: the inner solution for features Z = T(X2; x) and the
    triangular factor R (R^T R = Z^T Z / n2 + gamma I), by a QR of the stacked least-squares
    matrix [Z / sqrt(n2); sqrt(gamma) I]: no normal equations, so float32 loses only
    cond(R) = sqrt(cond(A)) digits."""
    n2 = X2j.shape[0]
    root_gamma = float(np.sqrt(gamma))
    dtype = M.float_dtype()

    def ridge(Z):
        stacked = jnp.concatenate([Z / np.sqrt(n2), root_gamma * jnp.eye(d, dtype=dtype)])
        Q, R = jnp.linalg.qr(stacked)
        w = jax.scipy.linalg.solve_triangular(R, Q[:n2].T @ (Y2j / np.sqrt(n2)), lower=False)
        return w, R

    return ridge


def _linear_metrics(ridge, X1j, Y1j, X2j, Y2j):
    """Exact ``F`` and ``grad_norm`` of the linear kind: the module docstring's IFT formula
    from residuals (not Gram matrices) and the ridge's triangular factor."""
    n1, n2 = X1j.shape[0], X2j.shape[0]

    def metrics(H, w_cur):
        w, R = ridge(X2j @ H)
        r1 = X1j @ (H @ w) - Y1j  # outer residuals
        a1 = X1j.T @ r1 / n1  # grad_H f = a1 w^T, grad_w f = H^T a1
        u = jax.scipy.linalg.solve_triangular(R, H.T @ a1, trans="T", lower=False)
        v = jax.scipy.linalg.solve_triangular(R, u, lower=False)  # A^{-1} grad_w f
        a2 = X2j.T @ (X2j @ (H @ w) - Y2j) / n2
        b2 = X2j.T @ (X2j @ (H @ v)) / n2
        grad = jnp.outer(a1, w) - jnp.outer(a2, v) - jnp.outer(b2, w)
        return {"F": 0.5 * jnp.mean(r1**2), "grad_norm": jnp.linalg.norm(grad)}

    return metrics


def _autodiff_metrics(ridge, features, sq_loss, X1j, Y1j, X2j):
    """Exact ``F`` and ``grad_norm``: ``f(x, w*(x))`` differentiated through the ridge solve."""

    def F_exact(x):
        w, _ = ridge(features(x, X2j))
        return sq_loss(x, w, {"X": X1j, "Y": Y1j})

    def metrics(x, w_cur):
        F, grad = jax.value_and_grad(F_exact)(x)
        flat = jnp.concatenate([jnp.ravel(g) for g in jax.tree.leaves(grad)])
        return {"F": F, "grad_norm": jnp.linalg.norm(flat)}

    return metrics


def hyper_representation_synthetic(
    kind: str = "linear",
    *,
    m: int | None = None,
    d: int | None = None,
    n: int | None = None,
    hidden: int | None = None,
    gamma: float | None = None,
    seed: int = 0,
) -> BilevelProblem:
    """E1 / E2 in one call: :func:`synthetic_hyperrep_data` then :func:`hyper_representation`.

    Defaults are the notebooks' (E1: m=64, d=128, n=500, gamma=0.1; E2: m=256, hidden=512,
    d=256, n=5000, gamma=0.001, the code's ridge ``b``). The data uses ``seed``; the starts
    use ``seed + 1``.
    """
    data = synthetic_hyperrep_data(kind, m, d, n, seed, hidden)
    if kind == "2layer" and hidden is None:
        hidden = _DEFAULTS["2layer"]["hidden"]
    if gamma is None:
        gamma = 0.1 if kind == "linear" else 1e-3
    return hyper_representation(
        *data,
        kind=kind,
        d=d or _DEFAULTS[kind]["d"],
        hidden=hidden,
        gamma=gamma,
        seed=seed + 1,
    )


# ---- deep hyper-representation (E3) ----------------------------------------------------------
def deep_hyper_representation(
    images_in,
    labels_in,
    images_out,
    labels_out,
    *,
    num_classes: int = 10,
    beta: float = 0.0,
    eval_size: int | None = 1000,
    chunk: int = 1024,
    x0=None,
    seed: int = 0,
) -> BilevelProblem:
    r"""Deep hyper-representation with LeNet-5 features (PZOBO E3, PZOBO-S on MNIST)::

        min_x  (1/|D_out|) sum CE(head*(x) . feat(a; x), b)
        s.t.   head*(x) = argmin_head (1/|D_in|) sum CE(head . feat(a; x), b) + beta/2 ||head||^2

    Args:
        images_in, labels_in: inner data (the code uses the 10k MNIST *test* split here).
        images_out, labels_out: outer data (the code: the 60k *train* split).
            Images are ``(n, 28, 28)`` / ``(n, 32, 32)`` / flat / with a channel axis (see
            ``models.pad_to_32``); 28x28 ones are zero-padded to 32x32. Normalise them
            beforehand (the code: ``(pixel - 0.1307) / 0.3081``).
        num_classes: C.
        beta: ridge on the whole head (W and b). The code uses 0 (no ridge), which leaves g
            convex but not strongly convex; ``beta > 0`` makes it beta-strongly convex (the bias
            is included because softmax is flat along ``b + t 1``).
        eval_size: the ``eval_loss`` / ``eval_acc`` metrics use a fixed seeded subset of this
            many outer samples (``None``: all), so evaluation stays cheap. With a subset,
            ``bl.solve``'s ``outer_loss`` and ``inner_grad_norm`` are also taken on fixed
            subsets (``eval_size`` outer and inner samples) instead of the full data (a full
            pass over 60k images took 15-25 s per evaluation here); ``None`` keeps full data.
        chunk: the feature extractor runs over at most ``chunk`` images at a time
            (``lax.map``), which bounds the memory of full-data evaluations.
        x0: LeNet parameters (default: PyTorch-style init seeded by ``seed``); the head starts
            at zero, as in the code.
        seed: seed of the initialisation and of the evaluation subset.

    Returns:
        A :class:`bilevel.BilevelProblem` with data ``{"X": (n, 1, 32, 32), "y"}`` and
        metrics ``eval_loss`` and ``eval_acc``.

    References:
        Sow, Ji, Liang. "On the Convergence Theory for Hessian-Free Bilevel Algorithms."
        NeurIPS 2022 (Section 4.2, Appendix B.3). LeCun et al. 1998 (LeNet-5).
    """
    fn = "deep_hyper_representation"
    C = M.check_num_classes(num_classes, fn)
    dtype = M.float_dtype()
    Xi, yi, Xo, yo = _check_image_data(images_in, labels_in, images_out, labels_out, C)
    beta = M.check_nonneg(beta, "beta", fn)
    if eval_size is not None and not (isinstance(eval_size, int) and eval_size >= 1):
        raise ValueError(f"{fn}(eval_size=...) must be a positive int or None, got {eval_size!r}.")
    if not (isinstance(chunk, int) and chunk >= 1):
        raise ValueError(f"{fn}(chunk=...) must be a positive int, got {chunk!r}.")
    x0 = _lenet_start(x0, seed, dtype)
    y0 = M.init_linear(M.LENET5_FEATURES, C, dtype)
    features = _chunked_lenet(chunk)

    def ce(x, head, batch):
        logits = M.linear(head, features(x, batch["X"]))
        return jnp.mean(M.softmax_cross_entropy(logits, batch["y"]))

    def inner(x, head, batch):
        return ce(x, head, batch) + 0.5 * beta * M.sum_of_squares(head)

    rng = np.random.default_rng(seed)
    outer_eval = _eval_subset(rng, Xo, yo, eval_size)
    inner_eval = _eval_subset(rng, Xi, yi, eval_size)
    return BilevelProblem(
        outer=ce,
        inner=inner,
        x0=x0,
        y0=y0,
        outer_data={"X": Xo, "y": yo},
        inner_data={"X": Xi, "y": yi},
        metrics=_deep_metrics(features, inner, outer_eval, inner_eval, eval_size is not None),
        name=f"deep_hyper_representation(lenet5, n_in={Xi.shape[0]}, n_out={Xo.shape[0]}, "
        f"C={C}, beta={beta})",
    )


def _check_image_data(images_in, labels_in, images_out, labels_out, C: int):
    """``(Xi, yi, Xo, yo)``: the images as ``(n, 1, 32, 32)`` (28x28 zero-padded), labels
    checked against C."""
    fn = "deep_hyper_representation"
    Xi = M.pad_to_32(images_in, "images_in", fn)
    Xo = M.pad_to_32(images_out, "images_out", fn)
    Xi = M.check_features(Xi, "images_in", fn, ndim=4)
    Xo = M.check_features(Xo, "images_out", fn, ndim=4)
    yi = M.check_labels(labels_in, "labels_in", fn, n=Xi.shape[0], num_classes=C)
    yo = M.check_labels(labels_out, "labels_out", fn, n=Xo.shape[0], num_classes=C)
    return Xi, yi, Xo, yo


def _lenet_start(x0, seed: int, dtype):
    """LeNet-5 parameters: PyTorch-style init seeded by ``seed``, or ``x0`` (shapes checked)."""
    if x0 is None:
        return M.init_lenet5(seed, dtype)
    want = jax.tree.map(np.shape, M.init_lenet5(0, dtype))
    try:
        got = jax.tree.map(np.shape, x0)
    except Exception:
        got = None
    if got != want:
        raise ValueError(
            f"deep_hyper_representation(x0=...) must be LeNet-5 parameters shaped {want}."
        )
    return jax.tree.map(lambda a: jnp.asarray(a, dtype), x0)


def _chunked_lenet(chunk: int):
    """``features(x, images)``: LeNet-5 features over at most ``chunk`` images at a time."""

    def features(x, images):
        n = images.shape[0]
        if n <= chunk:
            return M.lenet5_features(x, images)
        # whole chunks through the network (a per-image map ran 4x slower on XLA:CPU); the
        # zero images padding the last chunk are dropped again
        pad = -n % chunk
        padded = jnp.concatenate([images, jnp.zeros((pad, *images.shape[1:]), images.dtype)])
        chunks = padded.reshape(-1, chunk, *images.shape[1:])
        feats = jax.lax.map(lambda b: M.lenet5_features(x, b), chunks)
        return feats.reshape(-1, feats.shape[-1])[:n]

    return features


def _eval_subset(rng: np.random.Generator, X, y, eval_size: int | None) -> dict:
    """A fixed random subset of ``eval_size`` samples (all when None), in their order."""
    k = X.shape[0] if eval_size is None else min(eval_size, X.shape[0])
    sel = np.sort(rng.permutation(X.shape[0])[:k])
    return {"X": jnp.asarray(X[sel]), "y": jnp.asarray(y[sel])}


def _deep_metrics(features, inner, outer_eval: dict, inner_eval: dict, subsets: bool):
    """``eval_loss``, ``eval_acc`` on the outer subset; with ``subsets``, also ``outer_loss``
    and ``inner_grad_norm`` on the subsets, replacing ``bl.solve``'s full-data ones."""
    X_eval, y_eval = outer_eval["X"], outer_eval["y"]

    def metrics(x, head):
        logits = M.linear(head, features(x, X_eval))
        out = {
            "eval_loss": jnp.mean(M.softmax_cross_entropy(logits, y_eval)),
            "eval_acc": M.accuracy(logits, y_eval),
        }
        if subsets:
            out["outer_loss"] = out["eval_loss"]
            out["inner_grad_norm"] = tree_norm(jax.grad(inner, 1)(x, head, inner_eval))
        return out

    return metrics


def deep_hyper_representation_dataset(
    dataset: str = "fashion_mnist",
    *,
    n_in: int = 10000,
    n_out: int = 60000,
    path=None,
    **options,
) -> BilevelProblem:
    """E3 on (Fashion-)MNIST as in the code: inner = the test split, outer = the train split.

    Takes the first ``n_in`` test and ``n_out`` training images, normalised by the mean and
    standard deviation of the training pixels (MNIST: 0.1307, 0.3081). ``options`` go to
    :func:`deep_hyper_representation`.
    """
    from bilevel import data as bl_data

    fn = "deep_hyper_representation_dataset"
    M.check_choice(dataset, "dataset", fn, ("fashion_mnist", "mnist"))
    load = bl_data.load_fashion_mnist if dataset == "fashion_mnist" else bl_data.load_mnist
    X_out, y_out = load("train", path)
    X_in, y_in = load("test", path)
    X_out, y_out, X_in, y_in = X_out[:n_out], y_out[:n_out], X_in[:n_in], y_in[:n_in]
    mean, std = float(X_out.mean()), float(X_out.std())
    return deep_hyper_representation(
        (X_in - mean) / std, y_in, (X_out - mean) / std, y_out, **options
    )

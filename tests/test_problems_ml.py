"""The machine-learning problems: hyper-cleaning, L2 HPO, hyper-representation (shallow, deep).

Every check runs in float64 (conftest) on a few dozen synthetic samples, so exact answers get
tight tolerances: the IFT hypergradient against a central finite difference of
F(x) = f(x, y*(x)) (truncation O(eps^2) ~ 1e-10 relative at eps = 1e-5, rounding ~ 1e-11; the
test uses rtol 1e-5), closed forms against IFT at 1e-8 (both are exact up to the Newton solve,
converged to ~1e-14).
"""

import importlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import bilevel as bl
from bilevel import oracles

# the modules (bl.problems.hyper_cleaning etc. are the factory functions of the same names)
hc = importlib.import_module("bilevel.problems.hyper_cleaning")
hr = importlib.import_module("bilevel.problems.hyper_representation")
l2_hpo = importlib.import_module("bilevel.problems.l2_hpo")
models = importlib.import_module("bilevel.problems.models")

N_TR, N_VAL, D, C = 30, 21, 5, 3


def _data(seed=0):
    rng = np.random.default_rng(seed)
    X, Xv, Xt = (rng.standard_normal((n, D)) for n in (N_TR, N_VAL, 10))
    y, yv, yt = (rng.integers(0, C, n) for n in (N_TR, N_VAL, 10))
    return rng, X, y, Xv, yv, Xt, yt


def _pm1(labels):
    return 2 * (labels % 2) - 1


def _build(name):
    rng, X, y, Xv, yv, Xt, yt = _data()
    if name == "hyper_cleaning":
        return hc.hyper_cleaning(
            X, y, Xv, yv, num_classes=C, X_test=Xt, y_test=yt, corrupted=rng.random(N_TR) < 0.3
        )
    if name == "hyper_cleaning_mlp":
        return hc.hyper_cleaning(X, y, Xv, yv, num_classes=C, model="mlp", hidden=4)
    if name in ("l2_xy2", "l2_exp"):
        return l2_hpo.l2_hpo_logistic(
            X, _pm1(y), Xv, _pm1(yv), form=name[3:], X_test=Xt, y_test=_pm1(yt)
        )
    if name in ("l2_linear_feature", "l2_linear_weight"):
        per = name.rsplit("_", 1)[1]
        return l2_hpo.l2_hpo_linear(X, y, Xv, yv, num_classes=C, per=per, X_test=Xt, y_test=yt)
    if name == "hyperrep_linear":
        data = hr.synthetic_hyperrep_data("linear", m=6, d=3, n=30, seed=0)
        return hr.hyper_representation(*data, kind="linear", d=3)
    if name == "hyperrep_2layer":
        data = hr.synthetic_hyperrep_data("2layer", m=6, d=3, n=30, seed=0, hidden=4)
        return hr.hyper_representation(*data, kind="2layer", d=3, hidden=4, gamma=0.05)
    raise KeyError(name)


SMALL = [
    "hyper_cleaning",
    "hyper_cleaning_mlp",
    "l2_xy2",
    "l2_exp",
    "l2_linear_feature",
    "l2_linear_weight",
    "hyperrep_linear",
    "hyperrep_2layer",
]
CONVEX = [n for n in SMALL if n != "hyper_cleaning_mlp"]
_CACHE = {}


def problem(name):
    if name not in _CACHE:
        _CACHE[name] = _build(name)
    return _CACHE[name]


def _random_like(tree, seed, scale=1.0):
    flat, unravel = ravel_pytree(tree)
    return unravel(jnp.asarray(scale * np.random.default_rng(seed).standard_normal(flat.shape)))


def _perturbed_x(p, seed=1):
    """A generic x near x0 (inside x_set)."""
    x = jax.tree.map(jnp.add, p.x0, _random_like(p.x0, seed, 0.3))
    return p.project_x(x)


EPS = 1e-5  # central-difference step


@jax.jit
def _reference(p, x, u):
    """F at x and x +- EPS u, the IFT hypergradient and y*(x), in one compiled program."""

    def F(t):
        xt = jax.tree.map(lambda a, b: a + t * b, x, u)
        y_star = bl.metrics.inner_solution(p, xt, newton_steps=25)
        return p.outer(xt, y_star, p.outer_data), y_star

    values, ys = jax.vmap(F)(jnp.array([0.0, EPS, -EPS]))
    y_star = jax.tree.map(lambda a: a[0], ys)
    return values, bl.metrics.hypergradient(p, x, newton_steps=25), y_star


def _unit(tree, seed):
    u = _random_like(tree, seed)
    norm = jnp.linalg.norm(ravel_pytree(u)[0])
    return jax.tree.map(lambda a: a / norm, u)


# ---- structure -------------------------------------------------------------------------------
@jax.jit
def _structure(p, x, y, parts_outer, parts_inner):
    """Losses at (x0, y0), every metric, and the full vs batch-averaged losses at (x, y)."""
    values = (p.outer(p.x0, p.y0, p.outer_data), p.inner(p.x0, p.y0, p.inner_data))
    metrics = bl.metrics.default_metrics(p, p.x0, p.y0)
    pairs = []
    for fn, data, parts in (
        (p.outer, p.outer_data, parts_outer),
        (p.inner, p.inner_data, parts_inner),
    ):

        def on_batch(idx, fn=fn, data=data):
            return fn(x, y, jax.tree.map(lambda a: a[idx], data))

        per_batch = jax.vmap(on_batch)(parts)
        pairs.append((jnp.mean(per_batch), fn(x, y, data)))
    return values, metrics, pairs


@pytest.mark.parametrize("name", SMALL)
def test_scalar_losses_unbiased_batches_finite_metrics(name):
    """f, g are scalar; the full-data loss equals the mean over a partition into 3 batches."""
    p = problem(name)
    x, y = _perturbed_x(p), _random_like(p.y0, 2, 0.5)
    parts = []
    for n in (p.n_outer, p.n_inner):
        assert n % 3 == 0
        parts.append(np.random.default_rng(3).permutation(n).reshape(3, n // 3))
    values, metrics, pairs = _structure(p, x, y, *parts)
    for val in values:
        assert val.shape == () and val.dtype == jnp.float64 and np.isfinite(val)
    assert metrics and all(np.isfinite(v) and np.shape(v) == () for v in metrics.values())
    for avg, full in pairs:
        np.testing.assert_allclose(avg, full, rtol=1e-12)


@pytest.mark.parametrize("name", CONVEX)
def test_inner_strongly_convex_at_x0(name):
    p = problem(name)
    diag = bl.diagnose(p)
    assert diag.mu_g > 1e-6
    expected = {
        "hyper_cleaning": 2 * 0.01,  # the ridge c||y||^2, exact (softmax has flat directions)
        "l2_linear_weight": 1.0 / (D * C),  # 0.5 mean(w^2 exp(0)): 1/(dC), same flat directions
        "l2_linear_feature": 1.0 / (D * C),
    }
    if name in expected:
        np.testing.assert_allclose(diag.mu_g, expected[name], rtol=1e-6)
    if name == "l2_xy2":
        assert diag.mu_g >= 2 * 0.1 - 1e-9  # 2 min_i x_i at x0 = 0.1
    if name.startswith("hyperrep"):  # ridge gamma/2 ||w||^2 plus a PSD Gram matrix
        assert diag.mu_g >= (0.1 if name == "hyperrep_linear" else 0.05) - 1e-9


@pytest.mark.parametrize("name", [n for n in CONVEX if n != "l2_linear_weight"])
def test_ift_hypergradient_matches_finite_difference(name):
    """(l2_linear_weight is l2_linear_feature with lambda repeated over the classes, see
    test_l2_linear_per_feature_equals_per_weight_with_repeated_columns.)"""
    p = problem(name)
    x, u = _perturbed_x(p), _unit(p.x0, 7)
    (_, f_plus, f_minus), grad, _ = _reference(p, x, u)
    fd = (f_plus - f_minus) / (2 * EPS)
    ift = ravel_pytree(grad)[0] @ ravel_pytree(u)[0]
    assert abs(float(ift)) > 1e-6  # a meaningful direction
    np.testing.assert_allclose(float(fd), float(ift), rtol=1e-5)


# ---- hyper-cleaning --------------------------------------------------------------------------
def test_hyper_cleaning_per_sample_weight_gradient():
    """d g / d x_i = sigmoid'(x_i) CE_i(y) / n on the full data; f does not depend on x."""
    p = problem("hyper_cleaning")
    x, y = _perturbed_x(p, 4), _random_like(p.y0, 5)
    idx = np.array([3, 7, 11])

    @jax.jit
    def grads(p, x, y):
        data = p.inner_data
        ce = models.softmax_cross_entropy(models.linear(y, data["X"]), data["y"])
        batch = jax.tree.map(lambda a: a[idx], data)
        return (
            oracles.grad_x(p.inner, x, y, data),
            oracles.grad_x(p.outer, x, y, p.outer_data),
            oracles.grad_x(p.inner, x, y, batch),
            ce,
        )

    gx, gx_outer, gb, ce = grads(p, x, y)
    s = jax.nn.sigmoid(x)
    np.testing.assert_allclose(gx, s * (1 - s) * ce / N_TR, rtol=1e-12, atol=1e-15)
    assert not np.any(gx_outer)
    # a minibatch: non-zero only on its samples, each with factor 1/|B|
    want = np.zeros(N_TR)
    want[idx] = (s * (1 - s) * ce)[idx] / 3
    np.testing.assert_allclose(gb, want, rtol=1e-12, atol=1e-15)


def test_hyper_cleaning_metrics_and_baseline():
    p = problem("hyper_cleaning")
    # weight 0.5 reproduces argmin_y g(x0, y) (weight 1, the default, is plain noisy training)
    y_half = hc.train_without_bilevel(p, weight=0.5, steps=500)
    m, grad = jax.jit(
        lambda p, y: (p.metrics(p.x0, p.y0), oracles.grad_y(p.inner, p.x0, y, p.inner_data))
    )(p, y_half)
    assert set(m) == {
        "val_loss",
        "val_acc",
        "test_loss",
        "test_acc",
        "weight_corrupted",
        "weight_clean",
    }
    np.testing.assert_allclose(m["weight_corrupted"], 0.5)
    np.testing.assert_allclose(m["val_loss"], np.log(C))
    assert float(jnp.linalg.norm(ravel_pytree(grad)[0])) < 1e-10


def test_retrain_fits_y_star_of_the_learned_weights():
    p = problem("hyper_cleaning")
    x = jax.random.normal(jax.random.PRNGKey(3), p.x0.shape) * 2.0  # weights spread over (0, 1)
    y = hc.retrain(p, x, steps=800)
    # y*(x): the full-data gradient of g(x, .) vanishes there (strongly convex, so unique)
    grad = oracles.grad_y(p.inner, x, y, p.inner_data)
    assert float(jnp.linalg.norm(ravel_pytree(grad)[0])) < 1e-10
    # and the x matters: at x = 0 it is the weight-0.5 fit, a different model
    y0 = hc.retrain(p, p.x0, steps=800)
    y_half = hc.train_without_bilevel(p, weight=0.5, steps=800)
    np.testing.assert_allclose(ravel_pytree(y0)[0], ravel_pytree(y_half)[0], rtol=1e-9)
    assert float(jnp.linalg.norm(ravel_pytree(y)[0] - ravel_pytree(y0)[0])) > 1e-3
    with pytest.raises(ValueError, match=r"retrain\(x=...\) must have shape"):
        hc.retrain(p, x[:-1])
    with pytest.raises(ValueError, match="non-finite"):
        hc.retrain(p, x.at[0].set(jnp.nan))


# ---- L2 HPO ----------------------------------------------------------------------------------
def test_l2_logistic_forms_and_exact_F():
    p = problem("l2_xy2")
    assert isinstance(p.x_set, bl.sets.Box) and bool(p.x_set.contains(p.x0))
    np.testing.assert_allclose(p.x0, 0.1)
    assert problem("l2_exp").x_set is None
    np.testing.assert_allclose(problem("l2_exp").x0, 0.0)
    x, y = _perturbed_x(p), _random_like(p.y0, 3)
    q = problem("l2_exp")
    m, gx, gx_exp = jax.jit(
        lambda p, q, x, y: (
            p.metrics(x, y),
            oracles.grad_x(p.inner, x, y, p.inner_data),
            oracles.grad_x(q.inner, x, y, q.inner_data),
        )
    )(p, q, x, y)
    (F, _, _), _, y_star = _reference(p, x, _unit(p.x0, 7))
    np.testing.assert_allclose(m["F"], F, rtol=1e-10)
    np.testing.assert_allclose(m["y_err"], jnp.linalg.norm(y - y_star), rtol=1e-8)
    # the x-gradient of g is y^2 (xy2) and exp(x) y^2 (exp), deterministic
    np.testing.assert_allclose(gx, y**2, rtol=1e-12)
    np.testing.assert_allclose(gx_exp, jnp.exp(x) * y**2, rtol=1e-12)


def test_l2_linear_per_feature_equals_per_weight_with_repeated_columns():
    pf, pw = problem("l2_linear_feature"), problem("l2_linear_weight")
    assert pf.x0.shape == (D,) and pw.x0.shape == (D, C) and pw.y0.shape == (D, C)
    lam = jnp.asarray(np.random.default_rng(0).standard_normal(D))
    w = _random_like(pf.y0, 1)
    lam_w = jnp.broadcast_to(lam[:, None], (D, C))
    g_f, g_w, f_f = jax.jit(
        lambda pf, pw: (
            pf.inner(lam, w, pf.inner_data),
            pw.inner(lam_w, w, pw.inner_data),
            pf.outer(lam, w, pf.inner_data),
        )
    )(pf, pw)
    np.testing.assert_allclose(g_f, g_w, rtol=1e-14)
    reg = g_f - f_f
    np.testing.assert_allclose(reg, 0.5 * np.mean(np.asarray(w) ** 2 * np.exp(lam)[:, None]))


# ---- hyper-representation --------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["linear", "2layer"])
def test_hyperrep_exact_metrics_match_ift(kind):
    p = problem(f"hyperrep_{kind}")
    x = _perturbed_x(p, 9)
    m = jax.jit(p.metrics)(x, p.y0)
    (F, _, _), grad, _ = _reference(p, x, _unit(p.x0, 7))  # g quadratic in y: Newton is exact
    np.testing.assert_allclose(m["grad_norm"], jnp.linalg.norm(ravel_pytree(grad)[0]), rtol=1e-8)
    np.testing.assert_allclose(m["F"], F, rtol=1e-8)


def test_synthetic_hyperrep_data():
    a = hr.synthetic_hyperrep_data("linear", m=4, d=3, n=7, seed=1, n_out=5)
    b = hr.synthetic_hyperrep_data("linear", m=4, d=3, n=7, seed=1, n_out=5)
    assert [t.shape for t in a] == [(7, 4), (7,), (5, 4), (5,)]
    for s, t in zip(a, b, strict=True):
        np.testing.assert_array_equal(s, t)
    c = hr.synthetic_hyperrep_data("2layer", m=4, d=3, n=6, seed=1, hidden=5)
    assert [t.shape for t in c] == [(6, 4), (6,), (6, 4), (6,)]
    p = hr.hyper_representation(*c, kind="2layer", d=3, hidden=5)
    assert set(p.x0) == {"H1", "H2"} and p.x0["H1"].shape == (4, 5) and p.y0.shape == (3,)


# ---- deep hyper-representation ---------------------------------------------------------------
def test_lenet5_shapes():
    params = models.init_lenet5(0)
    assert sum(a.size for a in jax.tree.leaves(params)) == 60856
    imgs = models.pad_to_32(np.zeros((2, 784)))
    assert imgs.shape == (2, 1, 32, 32)
    assert jax.eval_shape(models.lenet5_features, params, imgs).shape == (2, 84)


def test_lenet_layers_equal_their_xla_references():
    """The fast forms of LeNet's layers (window matrix products for the convolutions, max of
    strided sub-grids for pooling) against lax.conv / lax.reduce_window: values and both
    first derivatives (random inputs: no ties in the max), for one and several channels."""
    rng = np.random.default_rng(0)

    def conv_ref(x, p):
        out = jax.lax.conv_general_dilated(
            x,
            jnp.transpose(p["w"], (2, 3, 1, 0)),
            (1, 1),
            "VALID",
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
        )
        return out + p["b"][None, None, None, :]

    def pool_ref(x, p):
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")

    def pool_fast(x, p):
        return models._maxpool2(x)

    for cin in (1, 3):
        x = jnp.asarray(rng.standard_normal((3, 12, 10, cin)))  # NHWC
        p = {"w": jnp.asarray(rng.standard_normal((4, cin, 5, 5))), "b": jnp.arange(1.0, 5.0)}
        for fast, ref in ((models._conv_nhwc, conv_ref), (pool_fast, pool_ref)):
            np.testing.assert_allclose(fast(x, p), ref(x, p), rtol=1e-12, atol=1e-12)
            for argnum in (0, 1):
                g_fast = jax.grad(lambda *a, fn=fast: jnp.sum(jnp.sin(fn(*a))), argnum)(x, p)
                g_ref = jax.grad(lambda *a, fn=ref: jnp.sum(jnp.sin(fn(*a))), argnum)(x, p)
                for a, b in zip(jax.tree.leaves(g_fast), jax.tree.leaves(g_ref), strict=True):
                    np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_lenet5_features_equal_an_nchw_reference():
    """The NHWC network equals PyTorch's NCHW LeNet-5 written with lax.conv (OIHW kernels as
    PyTorch stores them), so parameters keep PyTorch's meaning."""
    params = models.init_lenet5(3, dtype=np.float64)
    imgs = jnp.asarray(np.random.default_rng(1).standard_normal((2, 1, 32, 32)))

    def conv(x, p):
        dn = ("NCHW", "OIHW", "NCHW")
        return (
            jax.lax.conv_general_dilated(x, p["w"], (1, 1), "VALID", dimension_numbers=dn)
            + p["b"][None, :, None, None]
        )

    def pool(x):
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    h = pool(jax.nn.relu(conv(imgs, params["conv1"])))
    h = pool(jax.nn.relu(conv(h, params["conv2"])))
    h = jax.nn.relu(conv(h, params["conv3"])).reshape(2, 120)
    ref = jax.nn.relu(h @ params["fc"]["w"] + params["fc"]["b"][None, :])
    np.testing.assert_allclose(models.lenet5_features(params, imgs), ref, rtol=1e-10, atol=1e-12)


def test_problem_metrics_may_replace_the_full_data_defaults():
    rng = np.random.default_rng(0)
    imgs = rng.standard_normal((8, 28, 28))
    labels = rng.integers(0, 3, 8)
    args = (imgs[:5], labels[:5], imgs[5:], labels[5:])
    sub = hr.deep_hyper_representation(*args, num_classes=3, beta=0.1, eval_size=2)
    full = hr.deep_hyper_representation(*args, num_classes=3, beta=0.1, eval_size=None)
    head = _random_like(sub.y0, 1)
    m_sub = bl.metrics.default_metrics(sub, sub.x0, head)
    m_full = bl.metrics.default_metrics(full, full.x0, head)
    # eval_size: outer_loss is the loss on the fixed evaluation subset, not the full data
    np.testing.assert_allclose(m_sub["outer_loss"], m_sub["eval_loss"])
    np.testing.assert_allclose(m_full["outer_loss"], full.outer(full.x0, head, full.outer_data))
    assert not np.isclose(m_sub["outer_loss"], m_full["outer_loss"])
    grad = oracles.grad_y(full.inner, full.x0, head, full.inner_data)
    np.testing.assert_allclose(m_full["inner_grad_norm"], np.linalg.norm(ravel_pytree(grad)[0]))
    assert np.isfinite(m_sub["inner_grad_norm"]) and m_sub["inner_grad_norm"] > 0


def test_deep_hyper_representation_ift_and_metrics():
    rng = np.random.default_rng(0)
    imgs = rng.standard_normal((8, 28, 28))
    labels = rng.integers(0, 3, 8)
    p = hr.deep_hyper_representation(
        imgs[:5], labels[:5], imgs[5:], labels[5:], num_classes=3, beta=0.1, eval_size=2
    )
    assert p.y0["W"].shape == (84, 3) and not np.any(ravel_pytree(p.y0)[0])
    x, u = p.x0, _unit(p.x0, 3)

    @jax.jit
    def F(p, x, u, t):  # f(x + t u, y*(x + t u)) (not vmapped: batched convolutions are slow)
        xt = jax.tree.map(lambda a, b: a + t * b, x, u)
        ys = bl.metrics.inner_solution(p, xt, newton_steps=12)
        return p.outer(xt, ys, p.outer_data), ys

    @jax.jit
    def ift(p, x, u, y_star):
        """<grad F(x), u> = <grad_x f, u> - <(d^2 g/dy dx) u, H^{-1} grad_y f> (IFT), in the
        directional form: forward-mode in x (a dense Jacobian in x would be 60,856 wide, and
        reverse-over-reverse through LeNet is slow to compile)."""
        _, dfx = jax.jvp(lambda xx: p.outer(xx, y_star, p.outer_data), (x,), (u,))
        gy_f = ravel_pytree(oracles.grad_y(p.outer, x, y_star, p.outer_data))[0]
        v = jnp.linalg.solve(oracles.hessian_yy(p.inner, x, y_star, p.inner_data), gy_f)
        cross = ravel_pytree(oracles.cross_yx(p.inner, x, y_star, p.inner_data, u))[0]
        return dfx - cross @ v, p.metrics(x, p.y0)

    _, y_star = F(p, x, u, 0.0)
    fd = (F(p, x, u, EPS)[0] - F(p, x, u, -EPS)[0]) / (2 * EPS)
    ift, m = ift(p, x, u, y_star)
    np.testing.assert_allclose(float(fd), float(ift), rtol=1e-5)
    np.testing.assert_allclose(m["eval_loss"], np.log(3))
    # the chunked feature pass (lax.map over chunks of 2) gives the same losses
    q = hr.deep_hyper_representation(
        imgs[:5], labels[:5], imgs[5:], labels[5:], num_classes=3, beta=0.1, chunk=2
    )
    head = _random_like(p.y0, 1)
    both = jax.jit(
        lambda p, q, x, head: (p.inner(x, head, p.inner_data), q.inner(x, head, q.inner_data))
    )(p, q, x, head)
    np.testing.assert_allclose(*both, rtol=1e-12)


# ---- argument errors -------------------------------------------------------------------------
def _bad_calls():
    rng, X, y, Xv, yv, Xt, yt = _data()
    lin = hr.synthetic_hyperrep_data("linear", m=4, d=2, n=6, seed=0)
    img = rng.standard_normal((4, 28, 28))
    lab = rng.integers(0, 3, 4)
    kw = {"num_classes": C}
    return [
        ("X_train", lambda: hc.hyper_cleaning(X[:, 0], y, Xv, yv, **kw)),
        ("y_train_noisy", lambda: hc.hyper_cleaning(X, y[:-1], Xv, yv, **kw)),
        ("X_val", lambda: hc.hyper_cleaning(X, y, Xv[:, :2], yv, **kw)),
        ("y_val", lambda: hc.hyper_cleaning(X, y, Xv, yv + C, **kw)),
        ("y_test", lambda: hc.hyper_cleaning(X, y, Xv, yv, X_test=Xt, **kw)),
        ("corrupted", lambda: hc.hyper_cleaning(X, y, Xv, yv, corrupted=np.ones(3, bool), **kw)),
        ("model", lambda: hc.hyper_cleaning(X, y, Xv, yv, model="cnn", **kw)),
        ("hidden", lambda: hc.hyper_cleaning(X, y, Xv, yv, model="mlp", **kw)),
        ("c", lambda: hc.hyper_cleaning(X, y, Xv, yv, c=-1.0, **kw)),
        ("num_classes", lambda: hc.hyper_cleaning(X, y, Xv, yv, num_classes=1)),
        ("y_train", lambda: l2_hpo.l2_hpo_logistic(X, y % 2, Xv, _pm1(yv))),
        ("X_val", lambda: l2_hpo.l2_hpo_logistic(X, _pm1(y), Xv[:, :2], _pm1(yv))),
        ("form", lambda: l2_hpo.l2_hpo_logistic(X, _pm1(y), Xv, _pm1(yv), form="x2")),
        ("x_min", lambda: l2_hpo.l2_hpo_logistic(X, _pm1(y), Xv, _pm1(yv), x_min=0.0)),
        ("x0", lambda: l2_hpo.l2_hpo_logistic(X, _pm1(y), Xv, _pm1(yv), x0=np.ones(2))),
        ("per", lambda: l2_hpo.l2_hpo_linear(X, y, Xv, yv, per="class", **kw)),
        ("X_test", lambda: l2_hpo.l2_hpo_linear(X, y, Xv, yv, X_test=Xt[:, :1], y_test=yt, **kw)),
        ("Y_in", lambda: hr.hyper_representation(lin[0], lin[1][:-1], *lin[2:], d=2)),
        ("X_out", lambda: hr.hyper_representation(*lin[:2], lin[2][:, :1], lin[3], d=2)),
        ("hidden", lambda: hr.hyper_representation(*lin, kind="2layer", d=2)),
        ("x0", lambda: hr.hyper_representation(*lin, d=2, x0=np.zeros((2, 2)))),
        ("y0", lambda: hr.hyper_representation(*lin, d=2, y0=np.zeros(3))),
        ("gamma", lambda: hr.hyper_representation(*lin, d=2, gamma=0.0)),
        ("m", lambda: hr.synthetic_hyperrep_data("linear", m=0)),
        ("images_in", lambda: hr.deep_hyper_representation(img[:, :27], lab, img, lab)),
        ("labels_out", lambda: hr.deep_hyper_representation(img, lab, img, lab[:2])),
    ]


@pytest.mark.parametrize("i", range(len(_bad_calls())))
def test_bad_arguments_raise_value_error_naming_them(i):
    arg, call = _bad_calls()[i]
    with pytest.raises(ValueError, match=re.escape(f"({arg}=")):
        call()


def test_hyper_cleaning_with_a_small_cnn():
    """model="cnn": LeNet-5 features and a linear head on flat 28x28 rows (zero-padded to 32),
    the sample weights acting as for the logistic model; without-BO training lowers g."""
    rng = np.random.default_rng(0)
    X, Xv = rng.standard_normal((6, 784)), rng.standard_normal((4, 784))
    y, yv = rng.integers(0, 3, 6), rng.integers(0, 3, 4)
    p = hc.hyper_cleaning(X, y, Xv, yv, num_classes=3, model="cnn", c=0.01)
    assert set(p.y0) == {"features", "head"} and "cnn" in p.name
    imgs = models.pad_to_32(X.reshape(6, 28, 28))
    feats = models.lenet5_features(p.y0["features"], jnp.asarray(imgs))
    logits = models.linear(p.y0["head"], feats)
    np.testing.assert_allclose(p.reference.apply(p.y0, jnp.asarray(X)), logits, rtol=1e-10)
    # g at x: weights sigmoid(x_i) on the per-sample cross-entropies, plus c ||y||^2
    x = jnp.asarray(rng.standard_normal(6))
    ce = models.softmax_cross_entropy(logits, jnp.asarray(y))
    want = jnp.mean(jax.nn.sigmoid(x) * ce) + 0.01 * models.sum_of_squares(p.y0)
    np.testing.assert_allclose(p.inner(x, p.y0, p.inner_data), want, rtol=1e-10)
    fitted = hc.train_without_bilevel(p, steps=20)
    assert p.inner(p.x0, fitted, p.inner_data) < p.inner(p.x0, p.y0, p.inner_data)

"""bfloat16 compute for the neural hyper-cleaning models (``compute_dtype="bfloat16"``).

The option stores the features in bfloat16 and runs the network in it, with y, x, the losses
and every gradient in the default float dtype. Tolerances, on a batch of 32 at the models'
initialisation, in units of bfloat16's unit roundoff u = 2^-9 (8 significand bits): the batch
loss within u and grad_x (one sigmoid-weighted loss per sample) within 2u; grad_y, which passes
through every layer twice, within a tenth of the minibatch noise, the difference between the
same gradient on two disjoint batches of 32 -- the error SGD already tolerates. Measured
(MLP / CNN): loss 0.002u / 0.004u, grad_x 0.2u / 0.07u, grad_y 14u / 22u (2.7% / 4.4%) against
a batch-to-batch difference of 860u / 570u.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import bilevel as bl
from bilevel import oracles

U = 2.0**-9  # bfloat16 unit roundoff
MODELS = [pytest.param("mlp", {"hidden": 32}, id="mlp"), pytest.param("cnn", {}, id="cnn")]


def pair(model, options, n=96):
    """The same problem in the default dtype and with bfloat16 compute, at a random y."""
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((n + 16, 784)), rng.integers(0, 10, n + 16)
    problems = [
        bl.problems.hyper_cleaning(
            X[:n], y[:n], X[n:], y[n:], num_classes=10, model=model, compute_dtype=dt, **options
        )
        for dt in (None, "bfloat16")
    ]
    y0 = problems[0].y0
    if "head" in y0:  # the CNN's head starts at 0, where every logit is 0 in any dtype: draw
        # it like the other layers (PyTorch's default, uniform in +-1/sqrt(fan_in))
        bound = 1 / np.sqrt(y0["head"]["W"].shape[0])
        head = jax.tree.map(lambda a: rng.uniform(-bound, bound, a.shape), y0["head"])
        y0 = {**y0, "head": head}
    x = jnp.asarray(rng.standard_normal(n), problems[0].x0.dtype)
    return [p.with_start(x, y0) for p in problems]


def rel(a, b):
    a, b = ravel_pytree(a)[0], ravel_pytree(b)[0]
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(a))


@pytest.mark.parametrize(("model", "options"), MODELS)
def test_bfloat16_batch_loss_and_gradients_match_the_default_dtype(model, options):
    exact, low = pair(model, options)
    assert low.inner_data["X"].dtype == jnp.bfloat16
    oracle = jax.jit(oracles.value_and_grads, static_argnums=0)

    def at(p, rows):
        return oracle(p.inner, p.x0, p.y0, jax.tree.map(lambda a: a[rows], p.inner_data))

    (v, (gx, gy)), (v_low, (gx_low, gy_low)) = at(exact, slice(32)), at(low, slice(32))
    gy_other = at(exact, slice(32, 64))[1][1]  # the same oracle on the next 32 samples
    default = exact.x0.dtype
    assert v_low.dtype == default and gx_low.dtype == default
    assert {a.dtype for a in jax.tree.leaves(gy_low)} == {default}
    assert abs(float(v_low - v)) <= U * abs(float(v))
    assert rel(gx, gx_low) <= 2 * U
    assert rel(gy, gy_low) <= 0.1 * rel(gy, gy_other)


def test_bfloat16_solve_runs_and_stays_finite():
    _, low = pair("mlp", {"hidden": 32})
    solver = bl.solvers.make("f2sa", lr_outer=0.01, lr_inner=0.05, batch_size=16, inner_steps=2)
    with pytest.warns(bl.NotStronglyConvexWarning):  # the MLP is not convex in y; run anyway
        res = bl.solve(low, solver, steps=4, eval_every=2, progress=False)
    history = res.history
    assert len(history) == 3 and np.isfinite(history["val_loss"]).all()
    assert res.x.dtype == low.x0.dtype


@pytest.mark.parametrize(
    ("compute_dtype", "model", "match"),
    [
        ("float16", "mlp", "must be None .* or 'bfloat16', got 'float16'"),
        ("nonsense", "cnn", "compute_dtype=...\\) must be None"),
        (jnp.int8, "mlp", "compute_dtype=...\\) must be None"),
        ("bfloat16", "logistic", "is for model='mlp' or 'cnn'"),
    ],
)
def test_compute_dtype_is_validated(compute_dtype, model, match):
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((20, 784)), rng.integers(0, 10, 20)
    hidden = 8 if model == "mlp" else 0
    with pytest.raises(ValueError, match=match):
        bl.problems.hyper_cleaning(
            X, y, X, y, num_classes=10, model=model, hidden=hidden, compute_dtype=compute_dtype
        )

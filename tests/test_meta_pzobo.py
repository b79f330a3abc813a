"""PZOBO's multi-task meta-learner (bilevel.meta.pzobo) and the meta-training loop (meta.train).

The exact test (issue #16): with a linear backbone phi (features = flattened images @ phi) and a
ridge head under the squared loss, the inner solution w_i*(phi) solves the normal equations, so
the meta-objective (1/B) sum_i L_{D_i}(phi, w_i*(phi)) and its exact hypergradient (autodiff
through the closed form) are known; PZOBO's meta-gradient must match it within its documented
error (a forward difference's O(mu) with the identity basis, the Isserlis bound with Gaussian
directions).
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from bilevel.core.tree import tree_vdot
from bilevel.meta.episodes import Episodes
from bilevel.meta.heads import LinearHead, fit_head, head_loss, support_loss
from bilevel.meta.pzobo import PZOBOMeta, code_outer_schedule, task_features
from bilevel.meta.train import HISTORY_COLUMNS, mean_ci95, meta_train
from bilevel.solvers.base import optimizer_transform
from bilevel.solvers.zeroth_order.pzobo import sample_directions

WAYS, SHOTS, QUERIES, TASKS = 3, 2, 2, 3
IMAGE = (1, 2, 2)  # C, H, W: 4 pixels
FEATURES = 3  # p = 4 * 3 = 12 backbone parameters
REG = 0.5  # the code's ridge weight


class LinearBackbone(eqx.Module):
    """features = flattened images @ phi: the backbone whose ridge head has a closed form."""

    phi: jax.Array  # (pixels, features)

    def __call__(self, images):
        return images.reshape(images.shape[0], -1) @ self.phi

    @property
    def feature_dim(self) -> int:
        return self.phi.shape[1]


def random_episodes(key, tasks=TASKS, image=IMAGE) -> Episodes:
    k_s, k_q = jax.random.split(key)
    support = jax.random.normal(k_s, (tasks, WAYS * SHOTS, *image))
    query = jax.random.normal(k_q, (tasks, WAYS * QUERIES, *image))
    labels_s = jnp.tile(jnp.tile(jnp.arange(WAYS, dtype=jnp.int32), SHOTS), (tasks, 1))
    labels_q = jnp.tile(jnp.tile(jnp.arange(WAYS, dtype=jnp.int32), QUERIES), (tasks, 1))
    return Episodes(support, labels_s, query, labels_q)


def task(episodes: Episodes, i: int) -> Episodes:
    """Task i of a meta-batch, as a meta-batch of one."""
    return Episodes(*(leaf[i : i + 1] for leaf in episodes))


# ---- the closed form -------------------------------------------------------------------------
def ridge_head(features, labels):
    """argmin_w 0.5 mean ||W f + b - onehot||^2 + 0.5 REG (||W||^2 + ||b||^2): with z = [f, 1],
    (Z^T Z / n + REG I) theta = Z^T Y / n (normal equations)."""
    n = features.shape[0]
    z = jnp.concatenate([features, jnp.ones((n, 1), features.dtype)], axis=1)
    y = jax.nn.one_hot(labels, WAYS, dtype=features.dtype)
    theta = jnp.linalg.solve(z.T @ z / n + REG * jnp.eye(z.shape[1]), z.T @ y / n)
    return LinearHead(theta[:-1].T, theta[-1])


def exact_heads(backbone, episodes):
    return jax.vmap(ridge_head)(
        task_features(backbone, episodes.support_images), episodes.support_labels
    )


def query_objective(backbone, heads, episodes):
    """(1/B) sum_i L_{D_i}(phi, w_i) with the squared loss."""
    feats = task_features(backbone, episodes.query_images)
    losses = jax.vmap(lambda h, f, y: head_loss(h, f, y, "squared"))(
        heads, feats, episodes.query_labels
    )
    return jnp.mean(losses)


def meta_objective(backbone, episodes):
    """Phi(phi) = (1/B) sum_i L_{D_i}(phi, w_i*(phi)): its autodiff gradient is exact."""
    return query_objective(backbone, exact_heads(backbone, episodes), episodes)


def smoothness(backbone, episodes) -> jax.Array:
    """L: the largest eigenvalue of the support losses' head Hessians Z^T Z / n + REG I."""
    feats = task_features(backbone, episodes.support_images)
    z = jnp.concatenate([feats, jnp.ones(feats.shape[:2] + (1,), feats.dtype)], axis=2)
    gram = jnp.einsum("bni,bnj->bij", z, z) / z.shape[1]
    return jnp.max(jnp.linalg.eigvalsh(gram)) + REG


class ClosedForm(NamedTuple):
    """The exact problem of the tests below and its exact answers."""

    backbone: LinearBackbone
    episodes: Episodes
    heads: LinearHead  # w_i*(phi), leading axis B
    v: LinearHead  # grad_w f(phi, w*): the (1/B)-weighted per-task query gradients
    exact: jax.Array  # grad Phi(phi), the exact hypergradient (shaped like phi)
    indirect: jax.Array  # a = J^T v: the part the path difference estimates
    curvature: jax.Array  # (p,) s_j'' = e_j^T Hess_phi <w*(phi), v> e_j
    stationarity: jax.Array  # max |grad_w L_{S_i}(phi, w_i*)|: 0 up to rounding
    L: jax.Array  # largest head Hessian eigenvalue of the support losses


@jax.jit
def closed_form_answers(backbone: LinearBackbone, episodes: Episodes) -> ClosedForm:
    heads = exact_heads(backbone, episodes)
    feats = task_features(backbone, episodes.support_images)
    stationarity = jax.vmap(jax.grad(support_loss), in_axes=(0, 0, 0, None, None))(
        heads, feats, episodes.support_labels, REG, "squared"
    )
    exact = jax.grad(meta_objective)(backbone, episodes).phi
    direct, v = jax.grad(query_objective, argnums=(0, 1))(backbone, heads, episodes)

    def s(phi):  # <w*(phi'), v> with v fixed: the map whose forward difference PZOBO takes
        return tree_vdot(exact_heads(LinearBackbone(phi), episodes), v)

    p = backbone.phi.size
    curvature = jnp.diag(jax.hessian(s)(backbone.phi).reshape(p, p))
    return ClosedForm(
        backbone,
        episodes,
        heads,
        v,
        exact,
        exact - direct.phi,
        curvature,
        jnp.max(jnp.abs(ravel_pytree(stationarity)[0])),
        smoothness(backbone, episodes),
    )


@pytest.fixture(scope="module")
def closed_form() -> ClosedForm:
    """A linear backbone, a meta-batch of 3 tasks, the exact hypergradient and its parts."""
    k_phi, k_ep = jax.random.split(jax.random.key(0))
    backbone = LinearBackbone(0.4 * jax.random.normal(k_phi, (math.prod(IMAGE), FEATURES)))
    cf = closed_form_answers(backbone, random_episodes(k_ep))
    # the closed form is the inner minimiser: the support loss's head gradient vanishes there
    assert float(cf.stationarity) < 1e-13
    # the tests have power: the indirect part is a sizable share of the hypergradient
    assert jnp.linalg.norm(cf.indirect) > 0.1 * jnp.linalg.norm(cf.exact)
    return cf


def gd_learner(L: float, smoothing: float, target: float = 1e-20):
    """PZOBO with plain GD at alpha = 0.9 / L and N steps with q^N <= target, q = 1 - alpha REG:
    GD on a quadratic with Hessian eigenvalues in [REG, L'] (L' <= L / 0.9 at the perturbed
    point too, whose features move by O(mu)) contracts ||w^t - w*|| by q per step."""
    alpha = 0.9 / float(L)
    q = 1.0 - alpha * REG
    steps = math.ceil(math.log(target) / math.log(q))
    learner = PZOBOMeta(
        inner_steps=steps,
        lr_inner=alpha,
        inner_optimizer="gd",
        reg=REG,
        smoothing=smoothing,
        loss="squared",
        outer_optimizer="sgd",
    )
    return learner, q**steps


def zero_head(backbone):
    return LinearHead(jnp.zeros((WAYS, backbone.feature_dim)), jnp.zeros((WAYS,)))


def test_identity_directions_give_the_exact_hypergradient_to_O_mu(closed_form):
    """Identity basis of R^p as the directions, c/Q = 1: the indirect term's component j is the
    forward difference <w^N(phi + mu e_j) - w^N(phi), v> / mu.

    Error budget (float64), component j:
      * forward difference: (mu / 2) s_j'' + O(mu^2), s_j'' = e_j^T Hess<w*, v> e_j computed by
        autodiff of the closed form; allowed: mu |s_j''| (twice the leading term);
      * N-step bias: ||w^N - w*|| <= q^N ||w*|| on each path, so <= 2 q^N max||w*|| ||v|| / mu
        on the difference (asserted negligible below);
      * rounding: ~eps ||w*|| ||v|| / mu per component; allowed 100 eps ||w*|| ||v|| / mu.
    The allowed error is < 1e-4 ||a|| (a the indirect part), while a sign error, a missing 1/B
    (3 tasks) or perturbed features taken at phi all err by >= ||a||.
    """
    cf = closed_form
    mu = 1e-6
    learner, q_n = gd_learner(cf.L, mu)
    backbone, episodes = cf.backbone, cf.episodes
    flat, unravel = ravel_pytree(backbone)
    p = flat.size
    basis = jax.vmap(unravel)(jnp.eye(p))
    got = jax.jit(learner.meta_gradient)(backbone, zero_head(backbone), episodes, basis, float(p))
    err = jnp.abs(got.grad.phi - cf.exact).ravel()

    w_norm = float(jnp.linalg.norm(ravel_pytree(cf.heads)[0]))
    v_norm = float(jnp.linalg.norm(ravel_pytree(cf.v)[0]))
    bias = 2 * q_n * w_norm * v_norm / mu
    rounding = 100 * jnp.finfo(jnp.float64).eps * w_norm * v_norm / mu
    allowed = mu * jnp.abs(cf.curvature) + rounding
    a_norm = float(jnp.linalg.norm(cf.indirect))
    assert bias < 1e-12 * a_norm  # the N-step bias is negligible
    assert float(jnp.linalg.norm(allowed)) < 1e-4 * a_norm  # the check is tight
    assert bool(jnp.all(err <= allowed + bias)), (err, allowed)
    # the adapted heads are the closed form's (N steps converged)
    assert jnp.allclose(got.heads.weight, cf.heads.weight, atol=1e-12)
    assert jnp.isclose(got.loss, meta_objective(backbone, episodes), rtol=1e-12)


def test_gaussian_directions_within_the_isserlis_bound(closed_form):
    """Q Gaussian directions (fixed key), c = 1: the estimate of a = J^T v has error covariance
    (||a||^2 I + a a^T) / Q, so E||error||^2 = (p + 1) ||a||^2 / Q (Isserlis; solvers/pzobo.py).
    For Q = 2000 the error is close to Gaussian, so Q ||error||^2 / ||a||^2 is close to
    chi2(p - 1) + 2 chi2(1) (mean p + 1 = 13), which exceeds 4 times its mean with probability
    ~1e-6: the test allows twice the RMS bound, 2 sqrt(13 / 2000) ||a|| = 0.16 ||a|| (seeds 0-4
    measured 0.79 to 1.36 times the RMS bound). The forward difference adds O(mu) = O(1e-6),
    negligible; a sign error errs by 2 ||a||, a missing 1/B by 2 ||a|| (3 tasks).
    """
    cf = closed_form
    learner, _ = gd_learner(cf.L, 1e-6)
    backbone, episodes = cf.backbone, cf.episodes
    p, q = ravel_pytree(backbone)[0].size, 2000
    u, scale = sample_directions(jax.random.key(1), backbone, q, "gaussian")
    got = jax.jit(learner.meta_gradient)(backbone, zero_head(backbone), episodes, u, scale)
    bound = math.sqrt((p + 1) / q) * float(jnp.linalg.norm(cf.indirect))
    assert float(jnp.linalg.norm(got.grad.phi - cf.exact)) <= 2 * bound


# ---- the meta-step -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cross_entropy_batch():
    k_phi, k_ep = jax.random.split(jax.random.key(2))
    backbone = LinearBackbone(0.4 * jax.random.normal(k_phi, (math.prod(IMAGE), FEATURES)))
    return backbone, random_episodes(k_ep)


def test_step_shares_one_direction_across_tasks_and_warm_starts(cross_entropy_batch):
    """One SGD step with lr 1 exposes gradhat = phi_k - phi_{k+1}. It must be the mean over the
    tasks of each task's own meta-gradient with the SAME u drawn from the step key (ONE u for the
    meta-batch, P7, and the 1/B average), and the next w0 the mean of the tasks' adapted heads
    (fitted here by heads.fit_head, the code's warm start); without warm start w0 stays 0."""
    backbone, episodes = cross_entropy_batch
    learner = PZOBOMeta(inner_steps=7, outer_optimizer="sgd", lr_outer=1.0)
    key = jax.random.key(3)
    state = learner.init(backbone, WAYS, jax.random.key(4))
    new, loss = jax.jit(learner.step)(state, episodes, key)

    u, scale = sample_directions(key, backbone, 1, learner.directions)
    meta_gradient = jax.jit(learner.meta_gradient)
    per_task = [
        meta_gradient(backbone, state.head0, task(episodes, i), u, scale) for i in range(TASKS)
    ]
    expected = jnp.mean(jnp.stack([g.grad.phi for g in per_task]), axis=0)
    assert jnp.allclose(state.params.phi - new.params.phi, expected, rtol=1e-10, atol=1e-13)
    assert jnp.isclose(loss, jnp.mean(jnp.stack([g.loss for g in per_task])), rtol=1e-12)
    assert int(new.k) == 1

    feats = task_features(backbone, episodes.support_images)
    fit = jax.jit(
        lambda f, y: fit_head(
            f, y, state.head0, steps=7, lr=0.01, reg=0.5, transform=optimizer_transform("momentum")
        )
    )
    adapted = [fit(feats[i], episodes.support_labels[i]) for i in range(TASKS)]
    for field in ("weight", "bias"):
        want = jnp.mean(jnp.stack([getattr(h, field) for h in adapted]), axis=0)
        assert jnp.allclose(getattr(new.head0, field), want, rtol=1e-12, atol=1e-15)
    assert float(jnp.abs(new.head0.weight).max()) > 1e-3  # the warm start moved w0

    cold = dataclasses.replace(learner, warm_start=False)
    new_cold, _ = jax.jit(cold.step)(state, episodes, key)
    assert jnp.array_equal(new_cold.params.phi, new.params.phi)
    assert not jnp.any(new_cold.head0.weight) and not jnp.any(new_cold.head0.bias)


def test_step_cost_counts_the_backbone_passes(cross_entropy_batch):
    """Count the backbone's passes with a tap on its features (a debug callback sized by the
    batch it sees): B (Q + 1) forward passes on support sets and B query passes, and only the
    B query passes are differentiated (P16: no backward pass for the perturbed solve)."""
    backbone, episodes = cross_entropy_batch
    seen = {"forward": 0, "backward": 0}
    per_pass = WAYS * SHOTS * FEATURES  # support and query sets have the same size here

    def count(kind):
        def callback(x):
            seen[kind] += x.size // per_pass

        return callback

    @jax.custom_vjp
    def tap(x):
        jax.debug.callback(count("forward"), x)
        return x

    def tap_fwd(x):
        jax.debug.callback(count("forward"), x)
        return x, None

    def tap_bwd(_, g):
        jax.debug.callback(count("backward"), g)
        return (g,)

    tap.defvjp(tap_fwd, tap_bwd)

    class Tapped(LinearBackbone):
        def __call__(self, images):
            return tap(super().__call__(images))

    learner = PZOBOMeta(inner_steps=3, num_directions=2)
    tapped = Tapped(backbone.phi)
    state = learner.init(tapped, WAYS, jax.random.key(0))
    jax.block_until_ready(jax.jit(learner.step)(state, episodes, jax.random.key(1)))
    jax.effects_barrier()
    cost = learner.step_cost(TASKS)
    assert cost.head_gradients == TASKS * 3 * 3
    assert seen == {
        "forward": cost.support_forwards + cost.query_backwards,
        "backward": cost.query_backwards,
    }


def test_code_outer_schedule_drops_after_steps_1500_and_3500():
    """The code lowers Adam's rate once meta-step k >= 1500 (3500) is done: from k = 1501."""
    schedule = code_outer_schedule()
    rates = [float(schedule(k)) for k in (0, 1500, 1501, 3500, 3501)]
    assert rates == pytest.approx([1e-2, 1e-2, 1e-3, 1e-3, 1e-4], rel=1e-6)
    hash(PZOBOMeta(lr_outer=schedule))  # hashable: jit can close over it statically


def test_options_are_checked():
    with pytest.raises(ValueError, match="smoothing"):
        PZOBOMeta(smoothing=0.0)
    with pytest.raises(ValueError, match="directions"):
        PZOBOMeta(directions="uniform")
    with pytest.raises(ValueError, match="inner_optimizer"):
        PZOBOMeta(inner_optimizer="rmsprop")
    with pytest.raises(ValueError, match="float arrays"):
        PZOBOMeta().init(lambda x: x, WAYS, jax.random.key(0))
    with pytest.raises(ValueError, match="feature_dim"):
        PZOBOMeta().init(eqx.nn.Linear(4, 3, key=jax.random.key(0)), WAYS, jax.random.key(0))


# ---- the meta-training loop ---------------------------------------------------------------------
class BlobSampler(NamedTuple):
    """Tasks over Gaussian classes: the class signal lives in the first 2 of 8 pixels, the other
    6 carry loud noise, so a backbone that learns to ignore them generalises to new classes."""

    prototypes: jax.Array  # (classes, 8), zero beyond the first 2 entries
    meta_batch: int
    ways: int = 2
    shots: int = 2
    queries: int = 5

    def sample(self, key) -> Episodes:
        noise = jnp.array([0.3, 0.3] + [3.0] * 6)

        def one(k):
            k_c, k_s, k_q = jax.random.split(k, 3)
            classes = jax.random.permutation(k_c, self.prototypes.shape[0])[: self.ways]

            def draw(k, count):
                labels = jnp.tile(jnp.arange(self.ways, dtype=jnp.int32), count)
                x = self.prototypes[classes[labels]]
                x = x + noise[None, :] * jax.random.normal(k, x.shape)
                return x.reshape(-1, 1, 2, 4), labels

            return (*draw(k_s, self.shots), *draw(k_q, self.queries))

        return Episodes(*jax.vmap(one)(jax.random.split(key, self.meta_batch)))


def blob_samplers():
    protos = 2.0 * jax.random.normal(jax.random.key(5), (10, 2))
    protos = jnp.concatenate([protos, jnp.zeros((10, 6))], axis=1)
    return BlobSampler(protos[:6], meta_batch=4), BlobSampler(protos[6:], meta_batch=16)


def test_meta_train_raises_test_accuracy_above_chance():
    """Meta-training a linear backbone with PZOBO on 6 classes lifts 2-way accuracy on 4 unseen
    classes well above both chance (0.5) and the untrained backbone's accuracy; the history has
    its columns, one row before training, one every eval_every steps and one at the end."""
    train, test = blob_samplers()
    backbone = LinearBackbone(0.5 * jax.random.normal(jax.random.key(6), (8, 4)))
    learner = PZOBOMeta(inner_steps=10, lr_inner=0.1, lr_outer=0.05)
    lines = []
    trace = meta_train(
        learner,
        backbone,
        train_sampler=train,
        test_sampler=test,
        ways=2,
        steps=25,
        eval_every=10,
        eval_tasks=40,
        key=jax.random.key(7),
        log=lines.append,
    )
    h = trace.history
    assert tuple(h.columns) == HISTORY_COLUMNS
    assert h["step"].tolist() == [0, 10, 20, 25]
    assert len(lines) == 4 and trace.stopped is None
    assert np.all(np.isfinite(h["train_loss"]))  # row 0: the first meta-batch at the start
    assert np.all(np.diff(h["seconds"]) > 0) and h["seconds"].iloc[0] == 0
    first, last = h["test_accuracy"].iloc[0], h["test_accuracy"].iloc[-1]
    assert last > max(0.5, first) + 0.1, h
    assert np.all(h["test_ci95"] > 0) and int(trace.state.k) == 25


@dataclasses.dataclass(frozen=True)
class Diverging:
    """A stand-in learner (cheap to compile) whose loss is 1 / (k + 1) and NaN from k = 2 on, and
    whose prediction is constant (accuracy 1 / ways on every task)."""

    name: ClassVar[str] = "diverging"

    def init(self, backbone, ways, key):
        return jnp.zeros((), jnp.int32)

    def step(self, k, episodes, key):
        return k + 1, jnp.where(k >= 2, jnp.nan, 1.0 / (k + 1.0))

    def query_logits(self, k, episodes):
        return jnp.zeros(episodes.query_labels.shape + (2,))


def run_diverging(**kwargs):
    train, test = blob_samplers()
    return meta_train(
        Diverging(),
        None,
        train_sampler=train,
        test_sampler=test,
        ways=2,
        eval_tasks=16,
        key=jax.random.key(0),
        log=None,
        **{"eval_every": 1, **kwargs},
    )


def test_meta_train_stops_on_a_non_finite_loss_or_at_the_time_limit():
    trace = run_diverging(steps=5)
    assert "non-finite" in trace.stopped
    assert trace.history["step"].tolist() == [0, 1, 2]  # the history so far is kept
    assert trace.history["train_loss"].tolist() == [1.0, 1.0, 0.5]  # row 0: step 1 at k = 0
    assert trace.history["test_accuracy"].tolist() == [0.5] * 3
    assert int(trace.state) == 2  # the last state whose loss was finite
    trace = run_diverging(steps=5, time_limit=1e-12)  # any step outlasts it
    assert "time limit" in trace.stopped and trace.history["step"].tolist() == [0, 1]


def test_meta_train_evaluates_by_training_seconds_too():
    assert run_diverging(steps=2, eval_every=100).history["step"].tolist() == [0, 2]
    trace = run_diverging(steps=2, eval_every=100, eval_every_seconds=1e-12)
    assert trace.history["step"].tolist() == [0, 1, 2]  # every step outlasts 1e-12 s
    with pytest.raises(ValueError, match="eval_every_seconds"):
        run_diverging(steps=2, eval_every_seconds=0)


def test_mean_ci95_exact():
    mean, ci = mean_ci95([0.0, 1.0, 1.0, 0.0])
    assert mean == 0.5 and ci == pytest.approx(1.96 * math.sqrt(1 / 3) / 2, rel=1e-15)
    with pytest.raises(ValueError, match="at least 2"):
        mean_ci95([1.0])

"""Tests for bilevel.sets against NumPy references written independently of the library code.

References: closed forms for Box / L2Ball, bisection on the soft-threshold for L1Ball / Simplex,
SVD + bisection on the singular values for NuclearBall. Every projection is also checked by the
variational inequality <x - P(x), s - P(x)> <= 0 on random points and vertices of the set, and by
the exact certificate <x - P, P> >= h_C(x - P) with h_C the (closed-form) support function.
"""

import itertools
import os
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bilevel import sets as S

jax.config.update("jax_enable_x64", True)

N = 7  # dimension of the vector cases (= entries of the pytree used below, to share compiles)
MAT = (3, 4)  # shape of the matrix case


# ---------------------------------------------------------------------------------------------
# NumPy references
# ---------------------------------------------------------------------------------------------
def np_simplex(v, r, iters=200):
    """Projection onto {s >= 0, sum s = r}: bisection on theta in sum(max(v - theta, 0)) = r."""
    lo, hi = v.min() - r, v.max()
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if np.maximum(v - mid, 0).sum() > r:
            lo = mid
        else:
            hi = mid
    return np.maximum(v - 0.5 * (lo + hi), 0)


def np_l1(v, r, iters=200):
    if np.abs(v).sum() <= r:
        return v.copy()
    lo, hi = 0.0, np.abs(v).max()
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if np.maximum(np.abs(v) - mid, 0).sum() > r:
            lo = mid
        else:
            hi = mid
    return np.sign(v) * np.maximum(np.abs(v) - 0.5 * (lo + hi), 0)


def np_nuclear(m, r):
    u, s, vt = np.linalg.svd(m, full_matrices=False)
    return (u * np_l1(s, r)) @ vt


def unit_rows(rng, k, n):
    d = rng.normal(size=(k, n))
    return d / np.linalg.norm(d, axis=1, keepdims=True)


@dataclass
class Case:
    """A set plus everything needed to check it without the library."""

    name: str
    set: Any
    shape: tuple
    ref_project: Any  # np array -> np array
    sample: Any  # (rng, k) -> (k, *shape) points of the set
    extreme: Any  # rng -> (m, *shape) extreme points (all vertices for polytopes)
    min_linear: Any  # g -> min_{s in C} <g, s>
    diameter: float
    polytope: bool


def _cases():
    rng = np.random.default_rng(1234)
    lo = rng.uniform(-1.0, 0.0, N)
    up = lo + rng.uniform(0.2, 1.5, N)
    c = rng.normal(size=N) * 0.5
    cases = []

    def box_case(name, lower, upper):
        lb, ub = np.broadcast_to(lower, (N,)), np.broadcast_to(upper, (N,))
        return Case(
            name=name,
            set=S.Box(lower, upper),
            shape=(N,),
            ref_project=lambda x: np.clip(x, lb, ub),
            sample=lambda g, k: g.uniform(lb, ub, size=(k, N)),
            extreme=lambda g: np.array(
                [np.where(bits, ub, lb) for bits in itertools.product([0, 1], repeat=N)]
            ),
            min_linear=lambda g: np.minimum(g * lb, g * ub).sum(),
            diameter=float(np.linalg.norm(ub - lb)),
            polytope=True,
        )

    cases.append(box_case("box", lo, up))
    cases.append(box_case("box_scalar", -0.5, 1.0))

    def l2_case(name, r, center):
        cc = np.zeros(N) if center is None else center
        return Case(
            name=name,
            set=S.L2Ball(r, center=None if center is None else jnp.asarray(center)),
            shape=(N,),
            ref_project=lambda x: cc + (x - cc) * min(1.0, r / np.linalg.norm(x - cc)),
            sample=lambda g, k: cc + r * unit_rows(g, k, N) * g.uniform(0, 1, (k, 1)) ** (1 / N),
            extreme=lambda g: cc + r * unit_rows(g, 64, N),
            min_linear=lambda g: g @ cc - r * np.linalg.norm(g),
            diameter=2 * r,
            polytope=False,
        )

    cases.append(l2_case("l2", 1.3, c))
    cases.append(l2_case("l2_origin", 0.7, None))

    r1 = 1.7
    cases.append(
        Case(
            name="l1",
            set=S.L1Ball(r1),
            shape=(N,),
            ref_project=lambda x: np_l1(x, r1),
            sample=lambda g, k: (
                r1
                * g.uniform(0, 1, (k, 1))
                * (lambda w: w / np.abs(w).sum(1, keepdims=True))(g.laplace(size=(k, N)))
            ),
            extreme=lambda g: np.concatenate([r1 * np.eye(N), -r1 * np.eye(N)]),
            min_linear=lambda g: -r1 * np.abs(g).max(),
            diameter=2 * r1,
            polytope=True,
        )
    )

    rs = 2.0
    cases.append(
        Case(
            name="simplex",
            set=S.Simplex(rs),
            shape=(N,),
            ref_project=lambda x: np_simplex(x, rs),
            sample=lambda g, k: rs * g.dirichlet(np.ones(N), size=k),
            extreme=lambda g: rs * np.eye(N),
            min_linear=lambda g: rs * g.min(),
            diameter=np.sqrt(2) * rs,
            polytope=True,
        )
    )

    rn = 1.5

    def nuc_sample(g, k):
        m = g.normal(size=(k, *MAT))
        nuc = np.linalg.svd(m, compute_uv=False).sum(-1)
        return m / nuc[:, None, None] * rn * g.uniform(0, 1, (k, 1, 1))

    def nuc_extreme(g):
        u, v = unit_rows(g, 64, MAT[0]), unit_rows(g, 64, MAT[1])
        return rn * np.einsum("ki,kj->kij", u, v)

    cases.append(
        Case(
            name="nuclear",
            set=S.NuclearBall(rn),
            shape=MAT,
            ref_project=lambda x: np_nuclear(x, rn),
            sample=nuc_sample,
            extreme=nuc_extreme,
            min_linear=lambda g: -rn * np.linalg.svd(g, compute_uv=False)[0],
            diameter=2 * rn,
            polytope=False,
        )
    )
    return cases


CASES = _cases()
ids = [c.name for c in CASES]


@jax.jit
def all3(c, x):
    """project / lmo / contains in one program (compilation dominates this file's runtime)."""
    return c.project(x), c.lmo(x), c.contains(x)


def proj(c, x):
    return np.asarray(all3(c, x)[0])


def lmo(c, g):
    return np.asarray(all3(c, g)[1])


def inside(c, x) -> bool:
    return bool(all3(c, x)[2])


def np_flat(tree):
    return np.concatenate([np.ravel(leaf) for leaf in jax.tree.leaves(tree)])


def random_points(case, seed, k=12):
    """Points at several scales, so some fall inside the set and some far outside."""
    rng = np.random.default_rng(seed)
    scales = np.resize([0.05, 0.3, 1.0, 4.0], k)
    return rng.normal(size=(k, *case.shape)) * scales.reshape(-1, *([1] * len(case.shape)))


def test_reference_projections_are_sound():
    """The NumPy references themselves land in the sets they project onto."""
    v = np.random.default_rng(0).normal(size=N) * 3
    assert np.isclose(np_simplex(v, 2.0).sum(), 2.0) and np_simplex(v, 2.0).min() >= 0
    assert np.isclose(np.abs(np_l1(v, 1.0)).sum(), 1.0)


# ---------------------------------------------------------------------------------------------
# projection
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_project_matches_reference(case):
    for x in random_points(case, seed=1):
        np.testing.assert_allclose(proj(case.set, x), case.ref_project(x), atol=1e-10, rtol=0)


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_project_variational_inequality(case):
    rng = np.random.default_rng(2)
    pts = np.concatenate([case.sample(rng, 300), case.extreme(rng)])
    flat_pts = pts.reshape(len(pts), -1)
    for x in random_points(case, seed=3):
        p = proj(case.set, x)
        d = (x - p).ravel()
        # <x - P, s - P> <= 0 for every sampled s in C and every vertex ...
        assert np.max((flat_pts - p.ravel()) @ d) <= 1e-8
        # ... and over all of C at once: max_s <d, s> = h_C(d) = -min_s <-d, s>.
        assert -case.min_linear(-(x - p)) <= d @ p.ravel() + 1e-8


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_project_idempotent_contained_and_fixes_inside_points(case):
    for x in random_points(case, seed=4):
        p = proj(case.set, x)
        assert inside(case.set, p)
        np.testing.assert_allclose(proj(case.set, p), p, atol=1e-12, rtol=0)
    for s in case.sample(np.random.default_rng(5), 10):
        assert inside(case.set, s)
        np.testing.assert_allclose(proj(case.set, s), s, atol=1e-12, rtol=0)


@pytest.mark.parametrize("case", [c for c in CASES if c.name in ("l1", "nuclear", "box")])
def test_project_returns_inside_points_exactly(case):
    for s in case.sample(np.random.default_rng(6), 5):
        np.testing.assert_array_equal(proj(case.set, s), s)


def test_contains_rejects_outside_points():
    for case in CASES:
        assert not inside(case.set, 10.0 * np.ones(case.shape)), case.name


# ---------------------------------------------------------------------------------------------
# linear minimization oracle
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_lmo_is_optimal_and_feasible(case):
    rng = np.random.default_rng(7)
    pts = np.concatenate([case.sample(rng, 300), case.extreme(rng)]).reshape(
        -1, np.prod(case.shape)
    )
    for g in rng.normal(size=(10, *case.shape)):
        s = lmo(case.set, g)
        assert s.shape == g.shape
        assert inside(case.set, s)
        val = float(np.vdot(g, s))
        assert val <= np.min(pts @ g.ravel()) + 1e-12
        np.testing.assert_allclose(val, case.min_linear(g), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("center", [None, np.arange(N, dtype=float)], ids=["origin", "center"])
def test_l2_lmo_zero_gradient_returns_center(center):
    s = lmo(S.L2Ball(2.0, center=center), np.zeros(N))
    np.testing.assert_array_equal(s, np.zeros(N) if center is None else center)


def test_box_lmo_ties_pick_upper():
    g = np.zeros(N)
    g[0], g[2] = 1.0, -1.0
    s = lmo(S.Box(-1.0, 2.0), g)
    np.testing.assert_array_equal(s[:3], [-1.0, 2.0, 2.0])


# ---------------------------------------------------------------------------------------------
# pytrees
# ---------------------------------------------------------------------------------------------
def _tree(rng, scale=1.0):
    return {
        "a": jnp.asarray(rng.normal(size=3) * scale),
        "b": {"c": jnp.asarray(rng.normal(size=(2, 2)) * scale)},
    }


TREE_SETS = {
    "box": S.Box(-0.3, 0.4),
    "box_tree_bounds": S.Box(
        {"a": np.array([-1.0, 0.0, 0.5]), "b": {"c": -0.2}},
        {"a": np.array([0.0, 0.1, 2.0]), "b": {"c": np.full((2, 2), 0.3)}},
    ),
    "l2": S.L2Ball(0.8),
    "l2_tree_center": S.L2Ball(0.8, center={"a": np.ones(3), "b": {"c": 0.5}}),
    "l1": S.L1Ball(0.9),
    "simplex": S.Simplex(1.5),
}


def _flat_twin(s, tree):
    """The same set written for the flattened vector (tree-valued parameters flattened alike)."""

    def flat(p):
        if not isinstance(p, dict):
            return p
        return np_flat(jax.tree.map(lambda t, q: np.broadcast_to(q, t.shape), tree, p))

    if isinstance(s, S.Box):
        return S.Box(flat(s.lower), flat(s.upper))
    if isinstance(s, S.L2Ball):
        return S.L2Ball(s.radius, center=flat(s.center))
    return s


@pytest.fixture(scope="module")
def tree_results():
    """All TREE_SETS on three pytrees, computed in one program (one compilation)."""
    rng = np.random.default_rng(8)
    xs = [_tree(rng, scale) for scale in (0.05, 1.0, 3.0)]
    run = jax.jit(
        lambda sets, x: {k: all3(c, x) + (all3(c, all3(c, x)[1])[2],) for k, c in sets.items()}
    )
    return xs, [run(TREE_SETS, x) for x in xs]


@pytest.mark.parametrize("name", list(TREE_SETS))
def test_pytree_matches_flattened_computation(name, tree_results):
    s = TREE_SETS[name]
    for x, results in zip(*tree_results, strict=True):
        p, l, inside_x, lmo_inside = results[name]
        twin = _flat_twin(s, x)
        pf, lf, inside_f = all3(twin, np_flat(x))
        assert jax.tree.structure(p) == jax.tree.structure(x) == jax.tree.structure(l)
        np.testing.assert_allclose(np_flat(p), pf, atol=1e-12, rtol=0)
        np.testing.assert_allclose(np_flat(l), lf, atol=1e-12, rtol=0)
        assert bool(inside_x) == bool(inside_f)
        assert bool(lmo_inside) and inside(twin, np_flat(p))


def test_nuclear_accepts_single_leaf_pytree():
    m = np.random.default_rng(9).normal(size=MAT) * 2
    ball = S.NuclearBall(1.0)
    p, l, m_inside = all3(ball, {"W": m})
    assert set(p) == {"W"} and set(l) == {"W"} and not bool(m_inside)
    np.testing.assert_allclose(p["W"], np_nuclear(m, 1.0), atol=1e-12)


# ---------------------------------------------------------------------------------------------
# jit / vmap / dtypes / gradients
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_jit_and_vmap(case):
    xs = random_points(case, seed=10, k=5)
    # The set is a jit argument here (its parameters are traced) and x is batched.
    batched = jax.jit(jax.vmap(all3, in_axes=(None, 0)))(case.set, xs)
    loop = [all3(case.set, x) for x in xs]
    for i in range(3):
        np.testing.assert_allclose(batched[i], np.stack([out[i] for out in loop]), atol=1e-12)
    np.testing.assert_allclose(batched[0], np.stack([case.ref_project(x) for x in xs]), atol=1e-10)


def test_set_parameters_are_traced_leaves():
    traces = []

    @jax.jit
    def project_once(ball, x):
        traces.append(None)
        return ball.project(x)

    x = np.full(4, 3.0)
    a, b = project_once(S.L2Ball(1.0), x), project_once(S.L2Ball(2.0), x)
    assert len(traces) == 1  # a new radius is new data, not a new program
    np.testing.assert_allclose(np.linalg.norm(a), 1.0)
    np.testing.assert_allclose(np.linalg.norm(b), 2.0)


def test_vmap_over_set_parameters():
    radii = np.array([0.5, 1.0, 2.0])
    x = np.full(4, 3.0)
    l1, simplex = jax.jit(
        jax.vmap(lambda r, b: (S.L1Ball(r).project(x), b.project(x)), in_axes=(0, 0))
    )(radii, S.Simplex(radii))
    np.testing.assert_allclose(np.abs(l1).sum(1), radii, atol=1e-12)
    np.testing.assert_allclose(np.asarray(simplex).sum(1), radii, atol=1e-12)


def test_float32_input_keeps_float32_with_float64_parameters():
    sets = [
        S.Box(jnp.asarray(-0.1), jnp.asarray(0.2)),
        S.L2Ball(jnp.asarray(0.5), center=jnp.asarray(0.1)),
        S.L1Ball(jnp.asarray(0.5)),
        S.Simplex(jnp.asarray(0.5)),
    ]
    x = {"a": np.arange(3.0, dtype=np.float32), "b": np.ones((2, 2), np.float32)}
    outs = jax.jit(lambda sets, x: [all3(c, x)[:2] for c in sets])(sets, x)
    assert jnp.asarray(0.5).dtype == jnp.float64
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(outs))


def test_l2_projection_gradient_is_finite_at_center():
    g = jax.jit(jax.grad(lambda x: S.L2Ball(1.0).project(x).sum()))(np.zeros(3))
    np.testing.assert_array_equal(g, np.ones(3))


# ---------------------------------------------------------------------------------------------
# diameter
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=ids)
def test_diameter(case):
    like = np.zeros(case.shape)
    d = float(case.set.diameter(like=like))
    np.testing.assert_allclose(d, case.diameter, rtol=1e-12)
    rng = np.random.default_rng(11)
    pts = np.concatenate([case.sample(rng, 100), case.extreme(rng)]).reshape(
        -1, np.prod(case.shape)
    )
    pair = np.sqrt(np.max(np.sum((pts[:, None] - pts[None]) ** 2, -1)))
    assert pair <= d + 1e-12
    if case.polytope:  # attained between two vertices
        np.testing.assert_allclose(pair, d, rtol=1e-12)


def test_diameter_without_like():
    assert float(S.Box(np.zeros(3), 2.0).diameter()) == pytest.approx(2 * np.sqrt(3))
    assert S.L2Ball(1.5).diameter() == 3.0
    with pytest.raises(ValueError, match="Box.diameter"):
        S.Box(0.0, 1.0).diameter()


# ---------------------------------------------------------------------------------------------
# Reals, validation, errors
# ---------------------------------------------------------------------------------------------
def test_reals():
    r = S.Reals()
    x = {"a": np.arange(3.0), "b": np.ones((2, 2))}
    assert r.project(x) is x
    assert bool(r.contains(x))
    assert r.diameter() == np.inf
    with pytest.raises(ValueError, match="LMO of Reals is unbounded"):
        r.lmo(x)
    assert jax.jit(lambda s, x: s.project(x))(r, x)["a"].shape == (3,)


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: S.L2Ball(0.0), "L2Ball"),
        (lambda: S.L2Ball(-1.0), "L2Ball"),
        (lambda: S.L1Ball(-2), "L1Ball"),
        (lambda: S.L1Ball(float("nan")), "L1Ball"),
        (lambda: S.Simplex(0.0), "Simplex"),
        (lambda: S.NuclearBall(-1.0), "NuclearBall"),
        (lambda: S.L2Ball(np.array([1.0, -1.0])), "L2Ball"),
        (lambda: S.Box(1.0, 0.0), "Box"),
        (lambda: S.Box(np.zeros(3), np.array([1.0, -1.0, 1.0])), "Box"),
        (lambda: S.Box({"a": 0.0, "b": 1.0}, 0.5), "Box"),
    ],
)
def test_bad_parameters_raise(make, name):
    with pytest.raises(ValueError, match=name):
        make()


def test_box_broadcasts_a_scalar_bound_over_the_other_bounds_tree():
    """A scalar bound pairs with every leaf of a pytree bound, whichever side is the scalar:
    valid boxes build, and lower > upper on one leaf is refused with the box's message (a
    mutant that dropped the lower scalar's broadcast survived every test)."""
    tree = {"a": np.ones(2), "b": np.full(3, 2.0)}
    S.Box(0.0, tree)
    S.Box(jax.tree.map(lambda v: -v, tree), 0.5)
    with pytest.raises(ValueError, match=r"Box\(lower, upper\) needs lower <= upper"):
        S.Box(1.5, tree)
    with pytest.raises(ValueError, match=r"Box\(lower, upper\) needs lower <= upper"):
        S.Box(tree, 1.5)


def test_validation_skipped_for_tracers_and_pytree_rebuilds():
    out = jax.jit(lambda r, x: S.L2Ball(r).project(x))(0.5, np.full(4, 1.0))
    np.testing.assert_allclose(np.linalg.norm(out), 0.5)
    # JAX rebuilds pytrees with placeholder leaves; that must not trip the radius check.
    zeros = jax.tree.map(lambda _: 0, S.L2Ball(1.0))
    assert isinstance(zeros, S.L2Ball) and zeros.radius == 0


@pytest.mark.parametrize(
    "x",
    [np.ones(3), np.ones((2, 2, 2)), {"a": np.ones((2, 2)), "b": np.ones((2, 2))}],
    ids=["1d", "3d", "two_leaves"],
)
def test_nuclear_rejects_non_matrix(x):
    ball = S.NuclearBall(1.0)
    for method in (ball.project, ball.lmo, ball.contains):
        with pytest.raises(ValueError, match="NuclearBall.*shapes"):
            method(x)


@pytest.mark.skipif(
    "MUTANT_UNDER_TEST" in os.environ,
    reason="mutmut (benchmarks/mutation.py) rewrites every method of a mutated class into a "
    "trampoline, which a runtime Protocol's isinstance check does not recognise",
)
def test_sets_follow_the_protocol():
    for s in [S.Reals(), S.Box(), S.L2Ball(), S.L1Ball(), S.Simplex(), S.NuclearBall()]:
        assert isinstance(s, S.ConvexSet)
    assert set(S.__all__) == {
        "ConvexSet",
        "Reals",
        "Box",
        "L2Ball",
        "L1Ball",
        "Simplex",
        "NuclearBall",
        "is_bounded",
    }


# ---------------------------------------------------------------------------------------------
# the nuclear-ball LMO by Lanczos (not a full SVD)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(250, 250), (120, 40), (40, 120)])
def test_nuclear_lmo_matches_dense_svd(shape):
    """48 Lanczos steps on the Gram matrix against the dense SVD. Gaussian matrices are a hard
    case: the relative gap of sigma_1^2 is only ~4e-3 to 3e-2 at 250x250, where the worst-case
    Chebyshev bound (Saad 2011, Thm. 6.4: error ~ exp(-4 k sqrt(gap))) promises only ~1e-5;
    Lanczos converges superlinearly on the rest of the spectrum and reaches rounding (measured
    ~2e-15 at 48 steps, ~1e-9 at 32), so rtol 1e-11 on the LMO's value leaves margin. The
    vector error is ~sqrt(value error / gap) <= 1e-6."""
    rng = np.random.default_rng(3)
    ball = S.NuclearBall(2.0)
    for _ in range(3):
        g = rng.normal(size=shape)
        u, sv, vt = np.linalg.svd(g)
        s = np.asarray(ball.lmo(g))
        np.testing.assert_allclose(np.vdot(g, s), -2.0 * sv[0], rtol=1e-11)
        ref = -2.0 * np.outer(u[:, 0], vt[0])
        sign = np.sign(np.vdot(s, ref))  # singular vectors are defined up to sign
        assert np.linalg.norm(s - sign * ref) <= 1e-6 * 2.0
        np.testing.assert_allclose(np.linalg.norm(s), 2.0, rtol=1e-12)  # rank one, on the ball


def test_nuclear_lmo_few_steps_is_inexact_and_warm_start_fixes_it():
    """Too few steps is visibly inexact on a small gap; a warm start at the answer is exact
    after them (the point of warm-starting across FW steps, where the gradient moves little)."""
    rng = np.random.default_rng(4)
    g = rng.normal(size=(250, 250))
    _, sv, vt = np.linalg.svd(g)
    few = S.NuclearBall(1.0, lanczos_steps=4)
    cold = float(np.vdot(g, few.lmo(g)))
    warm = float(np.vdot(g, few.lmo(g, start=jnp.asarray(vt[0]))))
    assert cold > -sv[0] * (1 - 1e-4)
    np.testing.assert_allclose(warm, -sv[0], rtol=1e-12)
    # a zero start falls back to the fixed start vector
    np.testing.assert_allclose(few.lmo(g, start=jnp.zeros(250)), few.lmo(g), rtol=1e-10)


def test_nuclear_lmo_rank_deficient_and_zero_gradient():
    """Lanczos breaks down on a rank-one G after one step (an invariant subspace): the guard
    keeps the basis finite. G = 0 has no direction: S = 0 (the center), like L2Ball."""
    rng = np.random.default_rng(5)
    a, b = rng.normal(size=30), rng.normal(size=20)
    g = np.outer(a, b)
    s = np.asarray(S.NuclearBall(1.0).lmo(g))
    np.testing.assert_allclose(s, -np.outer(a, b) / np.linalg.norm(a) / np.linalg.norm(b))
    np.testing.assert_array_equal(S.NuclearBall(1.0).lmo(np.zeros((5, 4))), np.zeros((5, 4)))


def test_nuclear_lanczos_steps_is_static_and_checked():
    ball = S.NuclearBall(1.0, lanczos_steps=8)
    leaves, treedef = jax.tree.flatten(ball)
    assert len(leaves) == 1  # only the radius is traced
    assert jax.tree.unflatten(treedef, leaves).lanczos_steps == 8
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="lanczos_steps"):
            S.NuclearBall(1.0, lanczos_steps=bad)


def test_is_bounded():
    assert S.is_bounded(S.L2Ball(1.0)) and S.is_bounded(S.NuclearBall(1.0))
    assert S.is_bounded(S.Box(0.0, 1.0), like=np.zeros(3))
    assert not S.is_bounded(S.Box(0.0, np.inf), like=np.zeros(3))
    assert not S.is_bounded(S.Reals()) and not S.is_bounded(None)


@pytest.mark.parametrize("cls", ["L1Ball", "L2Ball", "NuclearBall"])
@pytest.mark.parametrize("radius", [0.0, -1.0, float("nan")])
def test_a_non_positive_radius_is_refused_naming_the_set(cls, radius):
    """The error names the set the user built (a mutation run found the NuclearBall's name
    unchecked)."""
    with pytest.raises(ValueError, match=rf"^{cls}\(radius=\.\.\.\) must be positive"):
        getattr(S, cls)(radius)

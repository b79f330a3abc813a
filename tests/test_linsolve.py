"""Tests of bilevel.core.linsolve against numpy and exact closed forms (float64 throughout).

XLA compilation dominates the run time here, so the solvers are called through a few jitted
wrappers that take H and the step sizes as *arguments* (one compilation is reused across
matrices and step sizes) and related checks share one compiled program.
"""

from functools import partial

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402

from bilevel.core.linsolve import cg, dense_solve, fixed_point, neumann  # noqa: E402

N = 30


def random_spd(n: int, cond: float, seed: int) -> np.ndarray:
    """Q diag(λ) Qᵀ with a random orthogonal Q and eigenvalues evenly spread on [1, cond]."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    eigs = np.linspace(1.0, cond, n)
    h = (q * eigs) @ q.T
    return 0.5 * (h + h.T)  # exactly symmetric despite round-off


def random_vec(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n)


def matvec_of(h):
    return lambda v: h @ v


def rel_err(x, ref) -> float:
    return float(np.linalg.norm(np.asarray(x) - ref) / np.linalg.norm(ref))


# Jitted wrappers: H, tol and lr are traced, only the iteration counts are static.
@partial(jax.jit, static_argnames="num_iters")
def cg_h(h, b, tol, *, num_iters):
    return cg(matvec_of(h), b, num_iters=num_iters, tol=tol)


@partial(jax.jit, static_argnames="num_iters")
def cg_init_h(h, b, init, *, num_iters):
    return cg(matvec_of(h), b, num_iters=num_iters, init=init)


@partial(jax.jit, static_argnames="num_terms")
def neumann_h(h, b, lr, *, num_terms):
    return neumann(matvec_of(h), b, lr=lr, num_terms=num_terms)


@partial(jax.jit, static_argnames="num_iters")
def fixed_point_h(h, b, lr, init, *, num_iters):
    return fixed_point(matvec_of(h), b, lr=lr, num_iters=num_iters, init=init)


@partial(jax.jit, static_argnames="num_iters")
def fixed_point_none_h(h, b, lr, *, num_iters):
    return fixed_point(matvec_of(h), b, lr=lr, num_iters=num_iters)


@jax.jit
def dense_h(h, b):
    return dense_solve(matvec_of(h), b)


def numpy_cg(h: np.ndarray, b: np.ndarray, num_iters: int, init=None) -> np.ndarray:
    """Textbook CG in numpy: an independent reference for non-converged iterates."""
    x = np.zeros_like(b) if init is None else np.array(init, dtype=float)
    r = b - h @ x
    p, rs = r.copy(), r @ r
    for _ in range(num_iters):
        if rs == 0.0:
            break
        hp = h @ p
        alpha = rs / (p @ hp)
        x, r = x + alpha * p, r - alpha * hp
        rs_new = r @ r
        p, rs = r + (rs_new / rs) * p, rs_new
    return x


@pytest.fixture(params=[10.0, 100.0], ids=["cond10", "cond100"])
def problem(request):
    cond = request.param
    h = random_spd(N, cond, seed=0)
    b = random_vec(N, seed=1)
    return jnp.asarray(h), jnp.asarray(b), np.linalg.solve(h, b), cond


# ---------------------------------------------------------------------------------- CG


def test_cg_n_iterations_solves(problem):
    h, b, u_star, _ = problem
    u = cg_h(h, b, 0.0, num_iters=N)
    # Exact arithmetic terminates in n = 30 steps. In float64 the attainable accuracy is
    # about cond * eps ~ 1e-14 (cond <= 100); loss of orthogonality can delay termination
    # (with geometrically spaced eigenvalues and cond = 100 it costs ~10 extra steps, as
    # for a plain numpy CG), but with evenly spread eigenvalues the n-step error is
    # ~1e-15, so 1e-8 leaves a wide margin while still failing a solver that is a few
    # steps short (numpy CG at cond = 100: 8e-7 after 25 steps, 2e-8 after 28).
    assert rel_err(u, u_star) <= 1e-8


# Every third count: a non-increasing sequence stays non-increasing on a subsequence, and
# each count is a separate scan to compile (one program, still among the costliest here).
CG_COUNTS = list(range(0, N + 1, 3))


@jax.jit
def cg_iterates(h, b):
    return jnp.stack([cg(matvec_of(h), b, num_iters=k) for k in CG_COUNTS])


def test_cg_error_monotone_in_h_norm(problem):
    h, b, u_star, _ = problem
    errs_vec = np.asarray(cg_iterates(h, b)) - u_star
    errs = np.einsum("ki,ij,kj->k", errs_vec, np.asarray(h), errs_vec)  # ||e_k||_H^2
    assert errs[0] > 0 and errs[-1] < 1e-20 * errs[0]
    # ||e_k||_H is non-increasing; a slack of 1e-12 ||e_0||_H^2 absorbs round-off once the
    # error has reached the noise floor.
    assert np.all(np.diff(errs) <= 1e-12 * errs[0]), np.diff(errs)
    # ... and strictly decreasing before that (k <= 15).
    assert np.all(np.diff(errs[:6]) < 0)


def test_cg_warm_start(problem):
    h, b, u_star, _ = problem
    init = u_star + 1e-3 * random_vec(N, seed=7)
    u = cg_init_h(h, b, jnp.asarray(init), num_iters=N)
    assert rel_err(u, u_star) <= 1e-8
    # Starting at the solution: the recomputed residual is ~eps, the iterate stays put.
    u = cg_init_h(h, b, jnp.asarray(u_star), num_iters=N)
    assert rel_err(u, u_star) <= 1e-12


def test_cg_tol_stops_early_without_nan(problem):
    h, b, u_star, _ = problem
    tol = 1e-6
    u_short = cg_h(h, b, tol, num_iters=N)
    u_long = cg_h(h, b, tol, num_iters=5 * N)
    assert np.all(np.isfinite(np.asarray(u_long)))
    # Frozen after convergence: 4N extra iterations change nothing, bit for bit.
    np.testing.assert_array_equal(np.asarray(u_long), np.asarray(u_short))
    # The tolerance was met (true residual; the recursive one differs by ~cond * eps).
    bn, hn = np.asarray(b), np.asarray(h)
    assert np.linalg.norm(bn - hn @ np.asarray(u_long)) <= 1.01 * tol * np.linalg.norm(bn)
    # ... and it stopped early: running all N iterations is strictly more accurate.
    assert rel_err(cg_h(h, b, 0.0, num_iters=N), u_star) < 1e-3 * rel_err(u_long, u_star)


def test_cg_many_iterations_tol_zero_no_nan(problem):
    # Far past convergence with tol = 0: residuals underflow towards 0, guards must hold.
    h, b, u_star, _ = problem
    u = cg_h(h, b, 0.0, num_iters=5 * N)
    assert np.all(np.isfinite(np.asarray(u)))
    assert rel_err(u, u_star) <= 1e-8


def test_cg_zero_rhs():
    h = jnp.asarray(random_spd(N, 10.0, seed=0))
    for tol in (0.0, 1e-6):
        u = cg_h(h, np.zeros(N), tol, num_iters=N)
        np.testing.assert_array_equal(np.asarray(u), np.zeros(N))


def test_cg_nan_propagates_and_singular_direction_is_guarded():
    h = jnp.asarray(random_spd(N, 10.0, seed=0))
    b = random_vec(N, seed=1)
    b[3] = np.nan
    # A NaN residual is not "converged": it must show up in the output, not be frozen away.
    assert np.all(np.isnan(np.asarray(cg_h(h, b, 0.0, num_iters=N))))
    # Singular H with b in its null space: p^T H p = 0 at a nonzero residual. The step is
    # skipped (no division by zero) and the iterate stays at 0.
    h_sing = np.diag(np.arange(N, dtype=np.float64))  # eigenvalue 0 on e_0
    e0 = np.eye(N)[0]
    np.testing.assert_array_equal(np.asarray(cg_h(h_sing, e0, 0.0, num_iters=N)), np.zeros(N))


def test_cg_grad_finite_at_zero_rhs():
    # The guarded divisions must also keep reverse-mode derivatives finite.
    h = jnp.asarray(random_spd(N, 10.0, seed=0))
    loss = lambda b: jnp.sum(cg(matvec_of(h), b, num_iters=5, tol=1e-6))  # noqa: E731
    g = jax.jit(jax.grad(loss))(np.zeros(N))
    assert np.all(np.isfinite(np.asarray(g)))


# ------------------------------------------------------------------------------ Neumann


@pytest.mark.parametrize("num_terms", [1, 20])
def test_neumann_closed_form(problem, num_terms):
    h, b, u_star, cond = problem
    lr = 1.0 / cond  # = 1/L since the eigenvalues span [1, cond]
    u = np.asarray(neumann_h(h, b, lr, num_terms=num_terms))
    # Exact identity: u_Q - H^{-1} b = -(I - lr H)^Q H^{-1} b.
    contraction = np.linalg.matrix_power(np.eye(N) - lr * np.asarray(h), num_terms)
    np.testing.assert_allclose(u - u_star, -contraction @ u_star, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(
        np.linalg.norm(u - u_star), np.linalg.norm(contraction @ u_star), rtol=1e-10
    )


def test_neumann_indexed_chained_product():
    num_terms, lr = 5, 0.05
    hs = np.stack([random_spd(N, 10.0, seed=s) for s in range(10, 10 + num_terms - 1)])
    b = random_vec(N, seed=3)
    hs_j = jnp.asarray(hs)
    seen = []

    def mv(v, q):
        seen.append(q)
        return hs_j[q - 1] @ v  # q runs over 1..num_terms-1

    u = neumann(mv, jnp.asarray(b), lr=lr, num_terms=num_terms, indexed=True)
    term, total = b.copy(), b.copy()
    for q in range(1, num_terms):
        term = (np.eye(N) - lr * hs[q - 1]) @ term  # H_q applied to the previous term
        total += term
    np.testing.assert_allclose(np.asarray(u), lr * total, rtol=1e-12, atol=1e-12)
    # The index is a traced int32 scalar (one trace of the scan body).
    assert len(seen) == 1 and seen[0].dtype == jnp.int32 and seen[0].shape == ()


def test_cg_and_fixed_point_indexed_use_matrix_i_at_iteration_i():
    """indexed=True (a fresh Hessian sample per product, hypertorch's stochastic=True): the
    iteration i applies H_i, checked against numpy loops to 1e-12 (8 float64 iterations)."""
    k, lr = 8, 0.05
    hs = np.stack([random_spd(N, 10.0, seed=s) for s in range(20, 20 + k)])
    b, hs_j = random_vec(N, seed=4), jnp.asarray(hs)
    u_cg = cg(lambda v, i: hs_j[i] @ v, jnp.asarray(b), num_iters=k, indexed=True)
    u_fp = fixed_point(lambda v, i: hs_j[i] @ v, jnp.asarray(b), lr=lr, num_iters=k, indexed=True)
    u, r, v = np.zeros(N), b.copy(), np.zeros(N)
    p = r.copy()
    for i in range(k):
        hp = hs[i] @ p
        alpha = (r @ r) / (p @ hp)
        u, r_new = u + alpha * p, r - alpha * hp
        p, r = r_new + (r_new @ r_new) / (r @ r) * p, r_new
        v = v - lr * (hs[i] @ v - b)
    np.testing.assert_allclose(np.asarray(u_cg), u, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(u_fp), v, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="indexed"):
        cg(lambda v, i: v, jnp.asarray(b), num_iters=1, init=jnp.asarray(b), indexed=True)


# -------------------------------------------------------------------------- fixed point


@pytest.mark.parametrize("num_iters", [0, 25])
def test_fixed_point_closed_form(problem, num_iters):
    h, b, u_star, cond = problem
    lr = 1.5 / cond
    contraction = np.linalg.matrix_power(np.eye(N) - lr * np.asarray(h), num_iters)
    for init in (np.zeros(N), random_vec(N, seed=5)):
        u = fixed_point_h(h, b, lr, jnp.asarray(init), num_iters=num_iters)
        # Exact identity: u_k = (I - lr H)^k (u_0 - H^{-1} b) + H^{-1} b.
        expected = contraction @ (init - u_star) + u_star
        np.testing.assert_allclose(np.asarray(u), expected, rtol=1e-10, atol=1e-10)


def test_fixed_point_from_none_equals_neumann(problem):
    # init=None starts at 0, where the iterates are the Neumann partial sums.
    h, b, _, cond = problem
    u_fp = fixed_point_none_h(h, b, 1.0 / cond, num_iters=20)
    u_ns = neumann_h(h, b, 1.0 / cond, num_terms=20)
    np.testing.assert_allclose(np.asarray(u_fp), np.asarray(u_ns), rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------- dense solve


def test_dense_solve_matches_numpy(problem):
    h, b, u_star, _ = problem
    u = dense_h(h, b)
    np.testing.assert_allclose(np.asarray(u), u_star, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------ matvec counts


def test_matvec_counts():
    h = jnp.asarray(random_spd(8, 10.0, seed=0))
    b = jnp.asarray(random_vec(8, seed=1))
    calls = {}

    def counting(tag):
        def mv(v):
            # A host callback runs once per *execution* (a Python side effect at trace time
            # would count the scan body only once).
            jax.debug.callback(lambda: calls.__setitem__(tag, calls.get(tag, 0) + 1))
            return h @ v

        return mv

    @jax.jit
    def run_all(b):
        return (
            cg(counting("cg_init"), b, num_iters=6, init=b),
            cg(counting("cg_tol"), b, num_iters=6, tol=0.5),
            neumann(counting("neumann"), b, lr=0.1, num_terms=6),
            neumann(counting("neumann1"), b, lr=0.1, num_terms=1),
            # A numpy integer is accepted as a static count.
            fixed_point(counting("fixed_point"), b, lr=0.1, num_iters=np.int64(6)),
        )

    jax.block_until_ready(run_all(b))
    jax.effects_barrier()
    # tol > 0 does not shorten the loop: the cost is static.
    assert calls == {"cg_init": 7, "cg_tol": 6, "neumann": 5, "fixed_point": 6}


# ----------------------------------------------------------------------------- pytrees


def test_pytree_rhs_matches_flattened():
    ha = random_spd(4, 10.0, seed=20)
    hc = random_spd(6, 10.0, seed=21)
    rng = np.random.default_rng(22)
    b = {
        "a": jnp.asarray(rng.standard_normal(4)),
        "b": {"c": jnp.asarray(rng.standard_normal((2, 3)))},
    }

    def mv_tree(v):
        c = v["b"]["c"]
        return {"a": ha @ v["a"], "b": {"c": (hc @ c.ravel()).reshape(c.shape)}}

    init = jax.tree.map(np.ones_like, b)
    lr = 0.1

    @jax.jit
    def run_all(b, init):
        return {
            "cg": cg(mv_tree, b, num_iters=7),
            "neumann": neumann(mv_tree, b, lr=lr, num_terms=12),
            "fixed_point": fixed_point(mv_tree, b, lr=lr, num_iters=12, init=init),
            "dense": dense_solve(mv_tree, b),
        }

    # The flattened problem: ravel_pytree orders the leaves "a" then "b"/"c", so H is
    # block-diagonal in that order. References are computed in numpy on flat vectors.
    h = np.zeros((10, 10))
    h[:4, :4], h[4:, 4:] = ha, hc
    flat_b, flat_init = np.asarray(ravel_pytree(b)[0]), np.ones(10)
    u_star = np.linalg.solve(h, flat_b)
    contraction = np.eye(10) - lr * h
    expected = {
        "cg": numpy_cg(h, flat_b, 7),
        # u_Q - u* = -(I - lr H)^Q u* and u_k - u* = (I - lr H)^k (u_0 - u*).
        "neumann": u_star - np.linalg.matrix_power(contraction, 12) @ u_star,
        "fixed_point": u_star + np.linalg.matrix_power(contraction, 12) @ (flat_init - u_star),
        "dense": u_star,
    }
    results = run_all(b, init)
    assert set(results) == set(expected)
    for name, u_tree in results.items():
        assert jax.tree.structure(u_tree) == jax.tree.structure(b), name
        assert u_tree["b"]["c"].shape == (2, 3), name
        np.testing.assert_allclose(
            np.asarray(ravel_pytree(u_tree)[0]),
            expected[name],
            rtol=1e-9,
            atol=1e-12,
            err_msg=name,
        )


# ----------------------------------------------------------------------- jit and vmap


def test_jit_vmap_over_rhs_matches_loop():
    cond = 100.0
    h = jnp.asarray(random_spd(N, cond, seed=0))
    rng = np.random.default_rng(30)
    bs = rng.standard_normal((5, N))
    bs[2] = 0.0  # one row is converged from the start: per-row freezing under vmap
    inits = 0.5 * bs
    lr = 1.0 / cond

    @jax.jit
    @partial(jax.vmap, in_axes=(0, 0))
    def batched(b, init):
        mv = matvec_of(h)
        return (
            cg(mv, b, num_iters=5 * N, tol=1e-7),
            cg(mv, b, num_iters=N, init=init),
            neumann(mv, b, lr=lr, num_terms=20),
            dense_solve(mv, b),
        )

    def one(b, init):
        # The same solvers through the module-level wrappers (compiled once, shared).
        return (
            cg_h(h, b, 1e-7, num_iters=5 * N),
            cg_init_h(h, b, init, num_iters=N),
            neumann_h(h, b, lr, num_terms=20),
            dense_h(h, b),
        )

    got = batched(bs, inits)
    looped = [one(b, init) for b, init in zip(bs, inits, strict=True)]
    for i, got_i in enumerate(got):
        want = np.stack([np.asarray(out[i]) for out in looped])
        assert np.all(np.isfinite(np.asarray(got_i)))
        # Batched and single matmuls may round differently; CG amplifies that slightly.
        np.testing.assert_allclose(np.asarray(got_i), want, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(np.asarray(got[0][2]), np.zeros(N))


def test_vmap_over_closed_over_parameters():
    # Batch over the matrix (closed over by matvec) and over a traced lr.
    hs_np = np.stack([random_spd(N, 10.0, seed=s) for s in range(40, 43)])
    lrs = np.array([0.05, 0.1, 0.15])
    b = jnp.asarray(random_vec(N, seed=4))
    init = jnp.zeros(N)

    @jax.jit
    @jax.vmap
    def batched(h, lr):
        mv = matvec_of(h)
        return (
            cg(mv, b, num_iters=N),
            neumann(mv, b, lr=lr, num_terms=20),
            fixed_point(mv, b, lr=lr, num_iters=25, init=init),
        )

    got = batched(hs_np, lrs)
    for i in range(3):
        want = (
            cg_h(hs_np[i], b, 0.0, num_iters=N),
            # float(): a Python float, like elsewhere, so the compiled wrappers are reused.
            neumann_h(hs_np[i], b, float(lrs[i]), num_terms=20),
            fixed_point_h(hs_np[i], b, float(lrs[i]), init, num_iters=25),
        )
        for got_k, want_k in zip(got, want, strict=True):
            np.testing.assert_allclose(np.asarray(got_k[i]), np.asarray(want_k), rtol=1e-9)


def test_inside_outer_scan():
    h = jnp.asarray(random_spd(N, 10.0, seed=0))
    b = jnp.asarray(random_vec(N, seed=1))

    def body(u, _):  # warm-started AID-style inner solves inside an outer loop
        return cg(matvec_of(h), b, num_iters=3, init=u), None

    u, _ = jax.jit(lambda u0: jax.lax.scan(body, u0, None, length=15))(np.zeros(N))
    assert rel_err(u, np.linalg.solve(np.asarray(h), np.asarray(b))) <= 1e-8


# ------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda mv, b: cg(mv, b, num_iters=-1), "num_iters"),
        (lambda mv, b: cg(mv, b, num_iters=2.0), "num_iters"),
        (lambda mv, b: cg(mv, b, num_iters=True), "num_iters"),
        (lambda mv, b: cg(mv, b, num_iters=jnp.asarray(3)), "num_iters"),
        (lambda mv, b: cg(mv, b, num_iters=3, tol=-1e-3), "tol"),
        (lambda mv, b: neumann(mv, b, lr=0.1, num_terms=0), "num_terms"),
        (lambda mv, b: neumann(mv, b, lr=0.1, num_terms="3"), "num_terms"),
        (lambda mv, b: neumann(mv, b, lr=0.0, num_terms=3), "lr"),
        (lambda mv, b: neumann(mv, b, lr=-0.1, num_terms=3), "lr"),
        (lambda mv, b: neumann(mv, b, lr=float("nan"), num_terms=3), "lr"),
        (lambda mv, b: fixed_point(mv, b, lr=-1.0, num_iters=3), "lr"),
        (lambda mv, b: fixed_point(mv, b, lr=jnp.asarray(0.0), num_iters=3), "lr"),
        (lambda mv, b: fixed_point(mv, b, lr=0.1, num_iters=-2), "num_iters"),
    ],
)
def test_bad_arguments_raise(call, name):
    # Validation happens before any array is touched, so plain numpy inputs suffice.
    mv = matvec_of(np.eye(3))
    with pytest.raises(ValueError, match=name):
        call(mv, np.ones(3))

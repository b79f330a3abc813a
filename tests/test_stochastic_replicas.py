"""Stochastic replicas (issue #34): a solver step recomputed in numpy from the rows of the
minibatches it drew, rebuilt from the state's key, so that a draw reused, misplaced or not reused
where the paper reuses it changes the result (docs/testing.md, "Replicas").

Every replica runs on the finite-sum quadratic of ``tests/sampled_problems.py``, where every
oracle a step uses (values and gradients of f and g, Hessian-vector and cross products) depends
on the sample, from a mid-run state (y, v, w, d != 0 and, for the momentum methods, an iteration
count past the steps where the momentum weight is 1), and compares every carried variable after
two to four steps at float64 tolerance. The oracles are written out from the data
(``QuadraticOracles``), not taken from ``bilevel.oracles``.

This file holds the replicas the per-solver files lack: SBFW; the implicit presets' draws not
replayed there (TTSA's default Neumann sum and its growing length, BSA's randomised product);
IBCG's two adjoints on a ball; PZOBO with minibatches under its own name, the inner-path
variants of PZOBO-S and HOZOG with a draw per path or the paths one after another. The last
test checks that every offline solver taking ``batch_size`` has a stochastic replica here or in
its own file (``REPLICAS``).
"""

from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sampled_problems import (
    BATCH,
    DX,
    DY,
    QuadraticOracles,
    moved,
    step_draws,
    stochastic_quadratic,
)

import bilevel as bl

RADIUS = 2.0  # the ball the Frank-Wolfe solvers run in; the moved x (norm ~ 0.9) lies inside


def _as_k(state, k: int):
    """``state`` at iteration count k (an int32, as ``init`` makes it: one compiled step)."""
    return state._replace(k=jnp.asarray(k, jnp.int32))


def _assert_state(new, expected: dict, rtol: float) -> None:
    for name, want in expected.items():
        np.testing.assert_allclose(getattr(new, name), want, rtol=rtol, atol=1e-14, err_msg=name)


def _ball_lmo(d):
    """The L2 ball's linear minimization oracle, argmin_{|s| <= R} <s, d> = -R d / |d|."""
    return -RADIUS * d / np.linalg.norm(d)


# ---- SBFW --------------------------------------------------------------------------------------
@pytest.mark.parametrize("hessian_inverse", ["neumann", "exact", "series"])
def test_sbfw_replays_one_sample_at_both_points_of_its_momentum(hessian_inverse):
    """SBFW (IBCG paper, App. G.1): inner draw 0 feeds the y step at (x_{k-1}, y_{k-1}); outer
    draw 0 (both partials of f), inner draw 1 (every Hessian product of M, or the dense Hessian
    of the exact variant) and inner draw 2 (the cross product) feed BOTH evaluations of h, at
    (x_{k-1}, y_{k-1}) and at (x_k, y_k), with the same Neumann length l ~ U{1..k} from the
    third key of the split: the STORM-like d_k differences one sample at two points. Steps at
    paper k = 6, 7 (rho_k = 2/sqrt(k) < 1, so the old point's h matters), in a ball (its LMO
    is continuous in d). rtol 1e-11: the same float64 algebra in another order, a solve for
    the exact variant. The default ``"series"`` (the random product's mean, N = 4 terms) uses
    the same one Hessian draw for its N - 1 products; ``inner_decay=0.5`` here (the default
    "auto" takes it with minibatches too: tests/test_sbfw.py)."""
    p = stochastic_quadratic(bl.sets.L2Ball(RADIUS))
    o = QuadraticOracles.of(p)
    eta_1, a_0, lr_neumann = 1.0, 0.2, 0.1
    solver = bl.solvers.make(
        "sbfw",
        lr_outer=eta_1,
        lr_inner=a_0,
        neumann_lr=lr_neumann,
        hessian_inverse=hessian_inverse,
        neumann_steps=4,
        batch_size=BATCH,
    )
    state = moved(solver.init(p, jax.random.PRNGKey(11)), x=DX, x_prev=DX, y=DY, d=DX)
    state = _as_k(state, 5)
    step = jax.jit(solver.step)
    for _ in range(2):
        dr = step_draws(p, state.key, BATCH, outer=1, inner=3, splits=3)
        dr.assert_distinct()
        k = int(state.k) + 1  # the paper's iteration
        rho, delta = min(1.0, 2 / math.sqrt(k)), a_0 / math.sqrt(k)
        eta = min(1.0, eta_1 * (2 / (k + 1)) ** 0.75)
        rows_f, (rows_y, rows_hessian, rows_cross) = dr.outer[0], dr.inner
        l = int(jax.random.randint(dr.others[0], (), 1, k + 1))  # l ~ U{1..k}, one per step
        x, x_prev, y_prev, d = (np.asarray(a) for a in (state.x, state.x_prev, state.y, state.d))

        def h(x_, y_, rows_f=rows_f, rows_hessian=rows_hessian, rows_cross=rows_cross, l=l, k=k):
            gx, gy = o.grads_f(x_, y_, rows_f)
            if hessian_inverse == "exact":
                v = np.linalg.solve(o.hessian_yy(rows_hessian), gy)
            elif hessian_inverse == "series":  # lr sum_{q<4} (I - lr H)^q gy, one Hessian draw
                term, v = gy, np.zeros_like(gy)
                for _ in range(4):
                    v, term = v + lr_neumann * term, term - lr_neumann * o.hvp(rows_hessian, term)
            else:  # M's product (k/L_g) prod_{i<=l} (I - H/L_g), one Hessian sample for all l
                v = gy
                for _ in range(l):
                    v = v - lr_neumann * o.hvp(rows_hessian, v)
                v = k * lr_neumann * v
            return gx - o.cross(rows_cross, v)

        y = y_prev - delta * o.grad_y_g(x_prev, y_prev, rows_y)
        d = (1 - rho) * (d - h(x_prev, y_prev)) + h(x, y)
        s = _ball_lmo(d)
        new = step(p, state)
        expected = dict(x=x + eta * (s - x), y=y, x_prev=x, d=d, fw_gap_estimate=d @ (x - s))
        _assert_state(new, expected, rtol=1e-11)
        assert np.array_equal(jax.random.key_data(new.key), jax.random.key_data(dr.next_key))
        used = new.counts._asdict()
        before = state.counts._asdict()
        assert used["samples_inner"] - before["samples_inner"] == 3 * BATCH
        assert used["samples_outer"] - before["samples_outer"] == BATCH
        kind, calls = {"exact": ("dense", 2), "series": ("hvp", 2 * 3)}.get(
            hessian_inverse, ("hvp", 2 * l)
        )
        assert used[kind] - before[kind] == calls
        state = new


# ---- the implicit presets: TTSA's Neumann sum and growing length, BSA's random product -------
SA_CASES = {
    # eq. (7): phi^k (inner draw 0) feeds the y step and the cross term, draws 1..N-1 the factors
    "ttsa-sum": ("ttsa", dict(neumann_steps=4)),
    # the IBCG paper's TTSA: t_max(k) = ceil(2 log(k + 1)) = 4, 4, 5, 5 of 6 declared terms
    "ttsa-growing": ("ttsa", dict(neumann_steps="growing", max_neumann=6, condition_number=2.0)),
    # Ghadimi & Wang's Alg. 2-3: T inner draws, then factor j on draw T + j, cross on T + N - 1
    "bsa-random": ("bsa", dict(inner_steps=2, neumann_steps=4, hessian_inverse="random")),
}


def _stochastic_approximation_step(o, solver, dr, x, y, k, lr):
    """TTSA (STABLE paper eq. (7)) or BSA (Ghadimi & Wang, Alg. 2 with Alg. 3's estimate) on
    the rows of ``dr``: ``(x_new, y_new, Hessian samples used)``."""
    rows_f = dr.outer[0]
    if solver.name == "ttsa":
        steps, first_hessian, rows_cross = 1, 1, dr.inner[0]  # the y step's sample phi^k
        terms = solver.max_neumann if solver.growing else solver.neumann_steps
        if solver.growing:
            terms = min(max(1, math.ceil(solver.condition_number * math.log(k + 1))), terms)
    else:
        steps, first_hessian = solver.inner_steps, solver.inner_steps
        rows_cross = dr.inner[steps + solver.neumann_steps - 1]  # its own draw
    y_new = y
    for t in range(steps):
        y_new = y_new - lr * o.grad_y_g(x, y_new, dr.inner[t])
    y_eval = y if solver.name == "ttsa" else y_new  # (7): both updates at (x^k, y^k)
    gx, gy = o.grads_f(x, y_eval, rows_f)
    if solver.hessian_inverse == "random":  # N eta prod_{j<=p} (I - eta H_j) gy, p ~ U{0..N-1}
        n = solver.neumann_steps
        used = int(jax.random.randint(dr.others[0], (), 0, n))
        v = gy
        for j in range(used):
            v = v - lr * o.hvp(dr.inner[first_hessian + j], v)
        v = n * lr * v
    else:  # eta sum_{q<terms} prod_{j<=q} (I - eta H_j) gy, factor j on its own draw
        used, term, total = terms - 1, gy, gy
        for j in range(used):
            term = term - lr * o.hvp(dr.inner[first_hessian + j], term)
            total = total + term
        v = lr * total
    x_new = x - lr * (gx - o.cross(rows_cross, v))
    return x_new, y_new, used


@pytest.mark.parametrize("case", sorted(SA_CASES))
def test_stochastic_approximation_factors_draw_their_own_samples(case):
    """TTSA with its default Neumann sum and with the growing length t_max(k) (only the first
    t_max(k) - 1 of the declared Hessian draws are used, and counted), and BSA with Ghadimi &
    Wang's randomised product (p from the third key of the split): every Hessian factor on its
    own inner draw, the cross term on TTSA's y-step sample phi^k (eq. (7b)) or on BSA's own
    draw, one outer draw for both partials of f. Four steps from a moved (x, y) at k = 5; for
    BSA some step must draw p = N - 1, so that every declared factor draw is used. rtol
    1e-11: the same float64 products summed in another order."""
    name, options = SA_CASES[case]
    p = stochastic_quadratic()
    o = QuadraticOracles.of(p)
    lr = 0.1
    solver = bl.solvers.make(
        name, lr_outer=lr, lr_inner=lr, neumann_lr=lr, batch_size=BATCH, **options
    )
    declared = solver.draws()
    state = _as_k(moved(solver.init(p, jax.random.PRNGKey(3)), x=DX, y=DY), 5)
    step = jax.jit(solver.step)
    used_per_step = []
    for _ in range(4):
        dr = step_draws(p, state.key, BATCH, outer=1, inner=declared.inner, splits=3)
        dr.assert_distinct()
        x_new, y_new, used = _stochastic_approximation_step(
            o, solver, dr, np.asarray(state.x), np.asarray(state.y), int(state.k), lr
        )
        new = step(p, state)
        _assert_state(new, dict(x=x_new, y=y_new), rtol=1e-11)
        steps = 1 if name == "ttsa" else solver.inner_steps
        cross_draws = 0 if name == "ttsa" else 1
        assert int(new.counts.hvp - state.counts.hvp) == used
        assert int(new.counts.samples_inner - state.counts.samples_inner) == BATCH * (
            steps + used + cross_draws
        )
        used_per_step.append(used)
        state = new
    if case == "bsa-random":
        assert max(used_per_step) == solver.neumann_steps - 1, used_per_step
    if case == "ttsa-growing":
        assert used_per_step == [3, 3, 4, 4]


# ---- IBCG on a ball ------------------------------------------------------------------------------
@pytest.mark.parametrize("averaging", ["none", "sfw"])
@pytest.mark.parametrize("hessian_inverse", ["recursion", "exact"])
def test_ibcg_adjoint_cross_and_inner_step_use_three_draws(hessian_inverse, averaging):
    """IBCG (Algorithm 1) with minibatches: outer draw 0 for both partials of f, inner draw 0
    for line 4 (the HVP of the w recursion, or the dense Hessian of eq. (6)'s exact adjoint),
    draw 1 for the cross product of line 5, draw 2 for the y step of line 8 at the NEW x.
    tests/test_ibcg.py replays the recursion on the simplex, whose LMO is piecewise constant;
    here the ball's LMO is continuous in F_k, so a changed F_k moves x. Two steps from a moved
    (x, y, w). ``averaging="sfw"`` (the minibatch default): the LMO takes d_k = (1 - rho_k)
    d_{k-1} + rho_k F_k with rho_k = 4/(k+8)^(2/3), so rho_0 = 1. rtol 1e-11."""
    p = stochastic_quadratic(bl.sets.L2Ball(RADIUS))
    o = QuadraticOracles.of(p)
    gamma, alpha, eta = 0.3, 0.1, 0.1
    solver = bl.solvers.make(
        "ibcg",
        lr_outer=gamma,
        lr_inner=alpha,
        lr_adjoint=eta,
        batch_size=BATCH,
        hessian_inverse=hessian_inverse,
        averaging=averaging,
    )
    state = moved(solver.init(p, jax.random.PRNGKey(8)), x=DX, y=DY, w=DY)
    d = np.zeros(DX)
    step = jax.jit(solver.step)
    for _ in range(2):
        dr = step_draws(p, state.key, BATCH, outer=1, inner=3)
        dr.assert_distinct()
        rows_hvp, rows_cross, rows_step = dr.inner
        x, y, w = (np.asarray(a) for a in (state.x, state.y, state.w))
        gx, gy = o.grads_f(x, y, dr.outer[0])
        if hessian_inverse == "exact":
            w = np.linalg.solve(o.hessian_yy(rows_hvp), gy)
        else:
            w = w - eta * (o.hvp(rows_hvp, w) - gy)  # line 4
        F = gx - o.cross(rows_cross, w)  # line 5
        k = int(state.k)
        rho = min(1.0, 4 / (k + 8) ** (2 / 3)) if averaging == "sfw" else 1.0
        d = (1 - rho) * d + rho * F
        s = _ball_lmo(d)  # line 6
        x_new = x + gamma * (s - x)  # line 7
        y_new = y - alpha * o.grad_y_g(x_new, y, rows_step)  # line 8
        new = step(p, state)
        expected = dict(x=x_new, y=y_new, w=w, direction=d, fw_gap_estimate=d @ (x - s))
        _assert_state(new, expected, rtol=1e-11)
        assert int(new.counts.samples_inner - state.counts.samples_inner) == 3 * BATCH
        state = new


# ---- the two-path methods: PZOBO, PZOBO-S, HOZOG ---------------------------------------------
PATH_CASES = {
    # Algorithm 1 with minibatches under the name "pzobo", Q = 1 (the paper's setting, which runs
    # its perturbed path without vmap): one inner draw per step for both paths (Alg. 2's S_t)
    "pzobo-one-direction": ("pzobo", dict(num_directions=1)),
    # the paths one after another (lax.map), each drawing the shared batch itself
    "pzobo-s-sequential": ("pzobo-s", dict(num_directions=2, parallel_directions=False)),
    # the ablation: path j (0 = unperturbed) on inner draws j N .. j N + N - 1
    "pzobo-s-own-draws": ("pzobo-s", dict(num_directions=2, shared_batches=False)),
    "hozog-own-draws": (
        "hozog",
        dict(num_directions=2, shared_batches=False, parallel_directions=False),
    ),
}


@pytest.mark.parametrize("case", sorted(PATH_CASES))
def test_two_path_estimates_replay_their_inner_and_outer_draws(case):
    """PZOBO (Algorithm 1, eq. (5)/(7)) and HOZOG rebuilt from the step's draws: directions
    u_j ~ N(0, I) from the third key of the split, every inner path from the carried y (warm
    start) on its inner draws (draw t at step t for all Q + 1 paths, Algorithm 2 lines 3-6; or
    path j on its own draws with ``shared_batches=False``), one outer draw D_F (Algorithm 2,
    line 13) for both partials of f at (x, y^N) (PZOBO) or for all Q + 1 values of f (HOZOG).
    tests/test_pzobo.py and tests/test_hozog.py replay the default layout (shared draws, paths
    in parallel, Q = 2) from the start x = 0. Two steps from a moved (x, y). rtol 1e-10: the
    path differences are divided by mu = 0.1."""
    name, options = PATH_CASES[case]
    p = stochastic_quadratic()
    o = QuadraticOracles.of(p)
    N, lr_in, lr_out, mu = 3, 0.1, 0.1, 0.1
    solver = bl.solvers.make(
        name,
        lr_outer=lr_out,
        lr_inner=lr_in,
        batch_size=BATCH,
        inner_steps=N,
        smoothing=mu,
        **options,
    )
    Q, shared = solver.num_directions, solver.shared_batches
    state = moved(solver.init(p, jax.random.PRNGKey(6)), x=DX, y=DY)
    step = jax.jit(solver.step)
    for _ in range(2):
        dr = step_draws(p, state.key, BATCH, outer=1, inner=N * (1 if shared else Q + 1), splits=3)
        dr.assert_distinct()
        u = np.asarray(jax.random.normal(dr.others[0], (Q, DX), dtype=jnp.float64))
        x, y0, rows_f = np.asarray(state.x), np.asarray(state.y), dr.outer[0]

        def path(x_, j, y0=y0, dr=dr):  # path j = 0 (unperturbed), 1..Q
            y, first = y0, 0 if shared else j * N
            for t in range(N):
                y = y - lr_in * o.grad_y_g(x_, y, dr.inner[first + t])
            return y

        y_n = path(x, 0)
        ends = [path(x + mu * u[j], j + 1) for j in range(Q)]
        if name == "hozog":  # values of f at both arguments perturbed
            f0 = o.f(x, y_n, rows_f)
            coeffs = [(o.f(x + mu * u[j], ends[j], rows_f) - f0) / mu for j in range(Q)]
            direct = np.zeros(DX)
        else:  # <delta_j, grad_y f(x, y^N)>, eq. (4)-(5)
            direct, gy = o.grads_f(x, y_n, rows_f)
            coeffs = [(ends[j] - y_n) / mu @ gy for j in range(Q)]
        hypergradient = direct + sum(c * u_j for c, u_j in zip(coeffs, u, strict=True)) / Q
        new = step(p, state)
        _assert_state(new, dict(x=x - lr_out * hypergradient, y=y_n), rtol=1e-10)
        drawn = int(new.counts.samples_inner - state.counts.samples_inner)
        assert drawn == BATCH * N * (1 if shared else Q + 1)
        state = new


# ---- every solver with minibatches has a stochastic replica ------------------------------------
#: offline solver -> the tests ("file::function") that rebuild its step's draws from the state's
#: key and replay the step on a sample-dependent problem
REPLICAS = {
    "aid-cg": [
        "test_aid_itd.py::test_stochastic_aid_uses_a_minibatch_for_every_oracle",
        "test_aid_itd.py::test_fresh_hessian_draws_a_minibatch_for_every_product",
    ],
    "aid-fp": [
        "test_aid_itd.py::test_stochastic_aid_uses_a_minibatch_for_every_oracle",
        "test_aid_itd.py::test_fresh_hessian_draws_a_minibatch_for_every_product",
    ],
    "itd": ["test_aid_itd.py::test_itd_backward_pass_is_the_adjoint_recursion_on_minibatches"],
    "bsa": [
        "test_ttsa_bsa.py::test_stochastic_steps_use_the_declared_samples",
        "test_stochastic_replicas.py::test_stochastic_approximation_factors_draw_their_own_samples",
    ],
    "ttsa": [
        "test_ttsa_bsa.py::test_stochastic_steps_use_the_declared_samples",
        "test_stochastic_replicas.py::test_stochastic_approximation_factors_draw_their_own_samples",
    ],
    "stocbio": ["test_stocbio.py::test_stochastic_step_draws_a_fresh_hessian_sample_per_factor"],
    "stable": ["test_stable.py::test_stochastic_step_reuses_one_inner_sample"],
    "soba": ["test_soba_saba.py::test_soba_uses_one_inner_and_one_outer_sample"],
    "saba": ["test_soba_saba.py::test_saba_saga_estimates_and_memory"],
    "f2sa": ["test_f2sa.py::test_stochastic_step_uses_a_fresh_sample_per_oracle"],
    "f3sa": ["test_f3sa.py::test_momentum_evaluates_the_same_sample_at_both_points"],
    "pzobo": [
        "test_stochastic_replicas.py::test_two_path_estimates_replay_their_inner_and_outer_draws"
    ],
    "pzobo-s": [
        "test_pzobo.py::test_pzobo_s_feeds_one_minibatch_to_all_paths",
        "test_stochastic_replicas.py::test_two_path_estimates_replay_their_inner_and_outer_draws",
    ],
    "hozog": [
        "test_hozog.py::test_stochastic_paths_share_inner_draws_and_values_share_the_outer_draw",
        "test_stochastic_replicas.py::test_two_path_estimates_replay_their_inner_and_outer_draws",
    ],
    "ibcg": [
        "test_ibcg.py::test_stochastic_step_uses_its_declared_draws",
        "test_stochastic_replicas.py::test_ibcg_adjoint_cross_and_inner_step_use_three_draws",
    ],
    "sbfw": [
        "test_stochastic_replicas.py::test_sbfw_replays_one_sample_at_both_points_of_its_momentum"
    ],
}


def test_every_offline_solver_with_minibatches_has_a_stochastic_replica():
    """Issue #34: each registered offline solver with a ``batch_size`` field is listed in
    ``REPLICAS``, and each test listed there exists (a module-level function of that file), so
    a new solver with minibatches fails here until its stochastic replica is written."""
    takes_batches = {
        name
        for name in bl.solvers.names()
        if "batch_size" in {f.name for f in dataclasses.fields(bl.solvers.get(name))}
    }
    assert set(REPLICAS) == takes_batches, sorted(set(REPLICAS) ^ takes_batches)
    here = Path(__file__).parent
    defined = {}
    for name, refs in REPLICAS.items():
        for ref in refs:
            file, function = ref.split("::")
            if file not in defined:
                tree = ast.parse((here / file).read_text())
                defined[file] = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
            assert function in defined[file], f"{name}: {ref} does not exist"

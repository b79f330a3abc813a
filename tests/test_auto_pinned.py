"""Every "auto" value pinned (issue #34): each solver's data- and horizon-dependent defaults,
resolved on problems whose inner constants are known, against the rule its docstring states.

The problems are built so that the constants are exact: an offline problem with
``d^2 g/dy^2 = diag(1, 3, 10)`` (mu_g = 1, L_g = 10) and ``d^2 f/dy^2 = diag(20, 2, 0.5)``
(L_f = 20, so that PZOBO's ``max(L_f, L_g)`` differs from L_g), and a drifting quadratic stream
with ``cond=10`` (eigenvalues 1, 5.5, 10 in dimension 3). Every expected value below is written
from the formula of the docstring (and the paper it cites), with these constants, not read
back from the solver's code (but for the online stable bound, below). What is pinned:

* offline ``lr_inner``: ``1/L_g`` (AID-CG, AID-FP, BSA, F2SA, HOZOG, ITD, SABA, SOBA, STABLE,
  stocBiO, TTSA), ``0.5/L_g`` (F3SA), ``1/max(L_f, L_g)`` (PZOBO), ``2/(max(L_f, L_g) + mu_g)``
  (PZOBO-S; ``1/L`` when g is not strongly convex), ``2/(mu_g + L_g)`` (IBCG),
  ``min(2/(3 mu_g), mu_g/(2 L_g^2))`` (SBFW's a_0); the adjoint steps derived from it (BSA's,
  TTSA's and SBFW's ``neumann_lr = 1/L_g``, stocBiO's Neumann and AID-FP's fixed-point step
  ``= lr_inner``, IBCG's ``lr_adjoint = 0.99 * 2/(mu_g + L_g)``);
* horizon rules: IBCG's gamma (``1/sqrt(K)`` kept for K/10 steps then ``~1/sqrt(k)``,
  ``1/sqrt(K)``, ``log K / K``), TTSA's growing Neumann length ``ceil(kappa log(k + 1))``,
  F2OBO's K (Theorem 3.1: least K with ``lam_T^2 rho^K <= 1`` and ``2 rho^K <= rho``), OBBO's
  and SOBBO's K (least K with ``T rho^K <= 1``), AF2OBO's ``(T^-1/2, T^-(1 + 2 tau)/2)``,
  SF2OBO's kappa_g, K_t, B_t and batch schedule;
* schedules built on the resolved values: SBFW's (rho_k, eta_k, delta_k), STABLE's tau_k and its
  eigenvalue floor ``mu_g/2``, F2SA's and F3SA's regime exponents by the problem's noise and
  their y step on the g part (``0.5/L_g`` for both), the penalty methods' ``beta_t =
  1/(2 lam_t L_g)`` (``lr_lagrangian=None``) and the online linear-system steps ``= lr_inner``;
* online ``lr_outer``: ``resolve`` alone takes a quarter of the stable bound of the round map
  (``OnlineSolver.resolve``). The bound itself is a numerical eigenvalue search
  (``solvers/online/auto.py``), not a formula of mu_g and L_g, so only the quarter is pinned
  here (``tests/test_online_defaults.py`` checks that the bound is where F2OBO diverges).

Not pinned: the offline ``lr_outer="auto"``, which ``bl.solve`` chooses by a tuning run on the
problem (``tuned_step_sizes``), not by a formula; the main test checks it is all that is left.
"""

import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bilevel as bl
from bilevel.analysis.diagnose import diagnose, outer_smoothness
from bilevel.solvers.frank_wolfe.ibcg import LastIterateGamma
from bilevel.solvers.frank_wolfe.sbfw import PAPER as SBFW_PAPER
from bilevel.solvers.frank_wolfe.sbfw import sbfw_weights

MU_G, L_G, L_F = 1.0, 10.0, 20.0
#: the estimates are exact up to rounding: Lanczos with full reorthogonalisation over the whole
#: 3-dimensional y space, in float64 (observed errors ~1e-15); a rule changed by a factor or an
#: exponent moves a value by far more than this
RTOL = 1e-9
#: IBCG's offline horizon K, and the online stream's horizon T
K, T = 400, 100
LAM1 = 5.0  # the penalty methods' default lambda_1


def _problem(inner_eigenvalues=(MU_G, 3.0, L_G)) -> bl.BilevelProblem:
    A = jnp.diag(jnp.asarray(inner_eigenvalues))
    C = jnp.diag(jnp.asarray([L_F, 2.0, 0.5]))
    B = jnp.asarray([[1.0, 0.5], [-0.3, 2.0], [0.7, -1.0]])

    def inner(x, y, batch):
        return 0.5 * y @ A @ y - y @ (B @ x) + 0.05 * x @ x

    def outer(x, y, batch):
        r = y - 1.0
        return 0.5 * r @ C @ r + 0.05 * x @ x

    return bl.BilevelProblem(
        outer=outer, inner=inner, x0=jnp.zeros(2), y0=jnp.zeros(3), name="known constants"
    )


@pytest.fixture(scope="module")
def offline():
    return _problem()


@pytest.fixture(scope="module")
def stream():
    return bl.problems.drifting_quadratic(dx=2, dy=3, horizon=T, cond=L_G)


def least(holds) -> int:
    """The least K >= 1 for which ``holds(K)``: a rule 'the least K with ...' by search, so the
    expected K does not repeat the code's closed form in logarithms."""
    return next(k for k in itertools.count(1) if holds(k))


def f2obo_steps(tau: float) -> int:
    """Theorem 3.1's K (F2OBO's docstring and ``solvers/online/auto.py``): the least K with
    ``2 rho^K <= rho`` and ``lam_T^2 rho^K <= 1``, lam_T = lam1 T^tau, rho = max(rho_z, rho_y),
    rho_z = 1 - alpha mu_g, rho_y = 1 - beta_t lam_t mu_g / 2, at alpha = 1/L_g and
    beta_t lam_t = alpha / 2 (both steps within 1/smoothness, so the proof's linear rates)."""
    alpha = 1 / L_G
    rho = max(1 - alpha * MU_G, 1 - (alpha / 2) * MU_G / 2)
    lam_T = LAM1 * T**tau
    return least(lambda k: 2 * rho**k <= rho and lam_T**2 * rho**k <= 1)


#: OBBO's K: the least K with T rho^K <= 1, rho = 1 - alpha mu_g at alpha = 1/L_g
OBBO_STEPS = least(lambda k: T * (1 - MU_G / L_G) ** k <= 1)

#: the fields ``resolve`` fills, with their rules (docstrings), on the offline problem
OFFLINE_RULES = {
    "aid-cg": {"lr_inner": 1 / L_G},
    "aid-fp": {"lr_inner": 1 / L_G},
    "bsa": {"lr_inner": 1 / L_G, "neumann_lr": 1 / L_G},  # Ghadimi & Wang's eta = 1/L_g
    "f2sa": {"lr_inner": 1 / L_G},
    "f3sa": {"lr_inner": 0.5 / L_G},  # auto_inner_factor = 0.5
    # L_g alone, not PZOBO's max(L_f, L_g); N starts at 20 ("auto": it follows the step)
    "hozog": {"lr_inner": 1 / L_G, "inner_steps": 20, "num_directions": 3},  # p + 1, p = 2
    "ibcg": {
        "lr_outer": LastIterateGamma(1 / math.sqrt(K), K),  # gamma_rule="last-iterate"
        "lr_inner": 2 / (MU_G + L_G),  # Lemma B.1
        "lr_adjoint": 0.99 * 2 / (MU_G + L_G),  # strictly below 2/(mu_g + L_g) (Lemma 3.1)
    },
    "itd": {"lr_inner": 1 / L_G, "inner_steps": 20},
    # Theorem 1: alpha <= 1/L, L = max(L_f, L_g); N = 20 to start (Appendix B.2)
    "pzobo": {"lr_inner": 1 / max(L_F, L_G), "inner_steps": 20, "num_directions": 3},
    "pzobo-s": {  # Theorem 2's step; Q = p + 1 (auto_directions) for the p = 2 numbers of x
        "lr_inner": 2 / (max(L_F, L_G) + MU_G),
        "inner_steps": 20,
        "num_directions": 3,
    },
    "saba": {"lr_inner": 1 / L_G},
    "sbfw": {"lr_inner": 1 / L_G, "neumann_lr": 1 / L_G},  # not App. G.1's a_0 (PAPER's)
    "soba": {"lr_inner": 1 / L_G},
    "stable": {"lr_inner": 1 / L_G, "mu_g_init": 0.5 * MU_G},  # half of lambda_min at (x0, y0)
    "stocbio": {"lr_inner": 1 / L_G, "neumann_steps": 5, "inner_steps": 10},  # Q = 5: F2SA paper's
    "ttsa": {"lr_inner": 1 / L_G, "neumann_lr": 1 / L_G},  # c_h = 1
}

#: the same on the stream; every online solver's ``lr_outer`` is added by the test (a quarter of
#: its stable bound)
ONLINE_RULES = {
    "af2obo": {  # Theorem 4.1's thresholds over kappa_g
        "lr_inner": 1 / L_G,
        "delta_y": T**-0.5 * MU_G / L_G,
        "delta_z": T ** -((1 + 2 * 0.5) / 2) * MU_G / L_G,
    },
    "aobo": {"lr_inner": 1 / L_G, "tolerance": T**-0.5 * MU_G / L_G},
    "f2obo": {"lr_inner": 1 / L_G, "inner_steps": f2obo_steps(tau=0.5)},
    "f2obo-sl": {"lr_inner": 1 / L_G},  # K = 1 and no horizon rule (Theorem 3.2)
    "fsobo": {"lr_inner": 1 / L_G},
    "oagd": {"lr_inner": 1 / L_G},
    "obbo": {"lr_inner": 1 / L_G, "inner_steps": OBBO_STEPS},
    "sf2obo": {  # a deterministic stream: whole rounds; K_t by the theory schedule
        "lr_inner": 1 / L_G,
        "kappa_g": L_G / MU_G,
        "batch_schedule": "constant",
    },
    "sobbo": {"lr_inner": 1 / L_G, "inner_steps": OBBO_STEPS},
    "sobow": {"lr_inner": 1 / L_G},
    "sogd": {"lr_inner": 1 / L_G},
}


def assert_rule(actual, expected, what: str) -> None:
    """``actual`` follows ``expected``: ints and strings exactly (a K, a schedule name),
    floats to RTOL, IBCG's last-iterate gamma by its two numbers."""
    if isinstance(expected, LastIterateGamma):
        assert isinstance(actual, LastIterateGamma), (what, actual)
        np.testing.assert_allclose(actual.gamma, expected.gamma, rtol=RTOL, err_msg=what)
        np.testing.assert_allclose(actual.horizon, expected.horizon, rtol=RTOL, err_msg=what)
    elif isinstance(expected, str | int):
        assert actual == expected and type(actual) is type(expected), (what, actual, expected)
    else:
        np.testing.assert_allclose(actual, expected, rtol=RTOL, err_msg=what)


def test_the_constants_are_estimated_exactly(offline, stream):
    """The premise of the file: bl.diagnose finds the constants the problems are built with."""
    d = diagnose(offline)
    np.testing.assert_allclose([d.mu_g, d.L_g], [MU_G, L_G], rtol=RTOL)
    np.testing.assert_allclose(outer_smoothness(offline), L_F, rtol=RTOL)
    first = diagnose(stream.round_problem(1))  # the round the online rules diagnose
    np.testing.assert_allclose([first.mu_g, first.L_g], [MU_G, L_G], rtol=RTOL)


@pytest.mark.parametrize("name", bl.solvers.names("all"))
def test_every_auto_value_follows_its_rule(name, offline, stream):
    """Told the horizon, then resolved (as ``bl.solve`` does; ``bl.solve_online`` tunes the
    online ``lr_outer`` instead of taking resolve's quarter), each solver's defaults change
    exactly the fields listed above, each to its rule, and nothing but a tuned ``lr_outer`` is
    left "auto"."""
    online = bl.solvers.get(name).online
    table = ONLINE_RULES if online else OFFLINE_RULES
    assert name in table, f"{name!r} is a new solver: pin its 'auto' values in this file"
    problem = stream if online else offline
    before = bl.solvers.make(name).with_horizon(T if online else K)
    after = before.resolve(problem)
    rules = dict(table[name])
    if online:  # a quarter of the stable bound: gamma = 1/(2 L_F) for an exact gradient step
        bound = after.stable_outer_step(problem).bound  # cached by resolve: the same search
        assert bound is not None and bound > 0
        rules["lr_outer"] = 0.25 * bound
    changed = {
        f.name
        for f in dataclasses.fields(after)
        if repr(getattr(before, f.name)) != repr(getattr(after, f.name))
    }
    assert changed == set(rules), f"{name}: resolve filled {sorted(changed)}"
    for field, expected in rules.items():
        assert_rule(getattr(after, field), expected, f"{name}.{field}")
    assert after.unresolved() == after.untuned()  # only a tuning run's lr_outer is left


# ---- IBCG: gamma from the horizon --------------------------------------------------------------
@pytest.mark.parametrize("given", ["with_horizon", "field"])
@pytest.mark.parametrize("rule", ["last-iterate", "nonconvex", "convex"])
def test_ibcg_gamma_follows_the_horizon(rule, given, offline):
    """Corollary 4.4's 1/sqrt(K) ("nonconvex"), Corollary 4.2's log K / K ("convex"), and the
    default "last-iterate": 1/sqrt(K) for the first K/10 steps, then gamma (K/10 / (k+1))^1.5."""
    if given == "with_horizon":  # bl.solve's steps
        solver = bl.solvers.make("ibcg", gamma_rule=rule).with_horizon(K)
    else:  # a horizon given as a field wins over the run's length
        solver = bl.solvers.make("ibcg", gamma_rule=rule, horizon=K).with_horizon(7 * K)
    gamma = solver.resolve(offline).lr_outer
    if rule == "convex":
        assert_rule(gamma, math.log(K) / K, rule)
    elif rule == "nonconvex":
        assert_rule(gamma, 1 / math.sqrt(K), rule)
    else:
        assert_rule(gamma, LastIterateGamma(1 / math.sqrt(K), K), rule)
        steps = np.array([0, K // 10 - 1, K // 10, K // 2, K - 1])
        expected = np.where(steps + 1 <= K / 10, 1.0, ((K / 10) / (steps + 1)) ** 1.5)
        np.testing.assert_allclose(gamma(steps), expected / math.sqrt(K), rtol=RTOL)


# ---- offline steps derived from the resolved ones -----------------------------------------------
@pytest.mark.parametrize("name", ["stocbio", "aid-fp", "soba"])
def test_adjoint_steps_default_to_the_inner_step(name, offline):
    """stocBiO's ``neumann_lr=None`` and AID-FP's ``fp_lr=None`` are ``lr_inner``; SOBA's v runs
    with the y step rho_k of the same iteration: all 1/L_g with the "auto" inner step."""
    solver = bl.solvers.make(name, lr_outer=0.01).resolve(offline)
    adjoint = solver.adjoint()
    if name == "soba":
        adjoint = adjoint.at_inner_step(solver.step_sizes(0)[1])
    assert_rule(adjoint.lr, 1 / L_G, f"{name} adjoint step")


def test_ttsa_growing_neumann_length(offline):
    """``neumann_steps="growing"`` (the IBCG paper's TTSA): condition_number = L_g/mu_g from
    bl.diagnose, and t_max(k) = max(1, ceil((L_g/mu_g) log(k + 1))), at most max_neumann."""
    solver = bl.solvers.make("ttsa", neumann_steps="growing", max_neumann=40).resolve(offline)
    assert_rule(solver.condition_number, L_G / MU_G, "condition_number")
    steps = [0, 1, 9, 30, 99]
    expected = [min(max(1, math.ceil(L_G / MU_G * math.log(k + 1))), 40) for k in steps]
    assert [int(solver.neumann_length(k)) for k in steps] == expected  # 1, 7, 24, 35, 40


def test_sbfw_weights_start_from_a0(offline):
    """App. G.1 at paper iteration k = steps + 1 (``PAPER``'s settings): rho_k = 2/k^(1/2),
    eta_k = 2/(k+1)^(3/4) (eta_1 = 2/2^(3/4)), both clipped to 1, and delta_k = a_0/k^(1/2)
    with ``lr_inner="a0"`` resolved to a_0 = min(2/(3 mu_g), mu_g/(2 L_g^2))."""
    solver = bl.solvers.make("sbfw", **SBFW_PAPER).resolve(offline)
    assert_rule(solver.lr_outer, 2 / 2**0.75, "eta_1")
    assert solver.inner_power(offline) == 0.5
    a0 = min(2 / (3 * MU_G), MU_G / (2 * L_G**2))
    done = np.arange(12)
    k = done + 1.0
    rho, eta, delta = sbfw_weights(jnp.asarray(done), solver.lr_outer, solver.lr_inner)
    np.testing.assert_allclose(rho, np.minimum(1.0, 2 / np.sqrt(k)), rtol=RTOL)
    np.testing.assert_allclose(eta, np.minimum(1.0, 2 / (k + 1) ** 0.75), rtol=RTOL)
    np.testing.assert_allclose(delta, a0 / np.sqrt(k), rtol=RTOL)


def test_sbfw_a0_where_l_g_is_below_one():
    """``a_0 = min{2/(3 mu_g), mu_g/(2 L_g^2)}``: the second term is the smaller whenever
    mu_g <= L_g, so with L_g >= 1 a changed first term is invisible; at mu_g = 0.1, L_g = 0.2
    a first term shrunk to 2 mu_g/3 or 6 mu_g would win the min (a_0 = 1.25 against 0.067)."""
    small = _problem(inner_eigenvalues=(0.1, 0.15, 0.2))
    solver = bl.solvers.make("sbfw", **SBFW_PAPER).resolve(small)
    assert_rule(solver.lr_inner, min(2 / (3 * 0.1), 0.1 / (2 * 0.2**2)), "a_0")  # 1.25
    assert_rule(solver.neumann_lr, 1 / 0.2, "1/L_g")


@pytest.mark.parametrize("regime", ["constant", "strongly-convex"])
def test_stable_tau_and_steps(regime, offline):
    """``tau=None``: tau_k = (k + 1)^(-1/2) under "constant" (Theorem 2's order), k0/(k0 + k)
    under "strongly-convex" (Theorem 3), which also decays beta_k = (1/L_g) k0/(k0 + k)."""
    solver = bl.solvers.make("stable", lr_outer=0.01, regime=regime).resolve(offline)
    k = np.array([0.0, 1.0, 3.0, 99.0, 1000.0])
    _, beta, tau = solver.step_sizes(jnp.asarray(k))
    if regime == "constant":
        np.testing.assert_allclose(tau, (k + 1) ** -0.5, rtol=RTOL)
        np.testing.assert_allclose(beta, np.full_like(k, 1 / L_G), rtol=RTOL)
    else:
        decay = 100.0 / (100.0 + k)  # the default k0 = 100
        np.testing.assert_allclose(tau, decay, rtol=RTOL)
        np.testing.assert_allclose(beta, decay / L_G, rtol=RTOL)


def test_stable_floor_is_half_the_sampled_lambda_min(offline):
    """``mu_g="auto"``: each step's floor is half the smallest eigenvalue of its sampled Hessian,
    the previous floor when the sample is not positive definite."""
    solver = bl.solvers.make("stable", lr_outer=0.01).resolve(offline)
    previous = jnp.asarray(0.123)
    hessian = jnp.diag(jnp.asarray([MU_G, 3.0, L_G]))
    _, _, floor = solver.project_hessian(hessian, hessian, previous)
    # bisection on a 3x3 tridiagonal matrix: lambda_min to rounding
    assert_rule(float(floor), 0.5 * MU_G, "floor")
    singular = jnp.diag(jnp.asarray([0.0, 3.0, L_G]))
    _, _, floor = solver.project_hessian(hessian, singular, previous)
    assert float(floor) == float(previous)


def test_pzobo_s_without_strong_convexity_takes_one_over_L():
    """PZOBO-S: ``2/(L + mu_g)`` needs mu_g > 0; otherwise ``1/L``, L = max(L_f, L_g)."""
    flat = _problem(inner_eigenvalues=(0.0, 3.0, L_G))
    with pytest.warns(bl.NotStronglyConvexWarning):
        solver = bl.solvers.make("pzobo-s").resolve(flat)
    assert_rule(solver.lr_inner, 1 / max(L_F, L_G), "pzobo-s lr_inner")


# ---- the penalty methods -------------------------------------------------------------------
#: ``regime="auto"``: Corollary 4.2 (F2SA) and 4.4 (F3SA) exponents (a, c) by the noise
REGIMES = {
    "f2sa": {
        "deterministic": (1 / 3, 0.0),
        "outer-noise": (3 / 5, 2 / 5),
        "stochastic": (5 / 7, 4 / 7),
    },
    "f3sa": {
        "deterministic": (1 / 3, 0.0),
        "outer-noise": (1 / 2, 1 / 4),
        "stochastic": (3 / 5, 2 / 5),
    },
}


@pytest.mark.parametrize("name", ["f2sa", "f3sa"])
@pytest.mark.parametrize(
    ("levels", "batch_size", "regime"),
    [
        ((), None, "deterministic"),
        (("outer", "inner"), None, "deterministic"),  # full batches count as exact
        (("outer",), 2, "outer-noise"),
        (("inner",), 2, "stochastic"),
        (("outer", "inner"), 2, "stochastic"),
    ],
)
def test_penalty_regime_follows_the_noise(name, levels, batch_size, regime, offline):
    """``regime="auto"``: "stochastic" when the inner level is sampled, "outer-noise" when only
    the outer one is, else "deterministic"."""
    data = {"s": jnp.zeros((4, 1))}  # the functions ignore it: only its presence counts
    problem = offline.replace(**{f"{level}_data": data for level in levels})
    solver = bl.solvers.make(name, batch_size=batch_size)
    np.testing.assert_allclose(solver.exponents(problem), REGIMES[name][regime], rtol=RTOL)


@pytest.mark.parametrize("name", ["f2sa", "f3sa"])
def test_penalty_y_step_on_g_is_half_over_L(name, offline):
    """The first z step is the "auto" gamma_0 (1/L_g, F3SA 0.5/L_g) and the y step on the g part
    beta_0 = alpha_0 lam_0 is gamma_0/2 (F2SA, eq. (6)) or gamma_0 (F3SA, (9b)): 0.5/L_g for both,
    the equality F3SA's docstring gives for its factor 0.5."""
    solver = bl.solvers.make(name, lr_outer=0.01).resolve(offline)
    sched = solver.schedule(offline, 0)
    assert_rule(float(sched.gamma), OFFLINE_RULES[name]["lr_inner"], f"{name} gamma_0")
    assert_rule(float(sched.alpha * sched.lam), 0.5 / L_G, f"{name} beta_0")


@pytest.mark.parametrize(("name", "tau"), [("f2obo", 0.5), ("af2obo", 0.5), ("f2obo-sl", 0.1)])
def test_online_penalty_steps(name, tau, stream):
    """``lr_lagrangian=None`` is ``lr_inner / 2``: beta_t = 1/(2 lam_t L_g), lam_t = lam1 t^tau
    (Theorem 3.1's y step); F2OBO-SL's x step decays as gamma_t = lr_outer t^-tau (Theorem 3.2)."""
    solver = bl.solvers.make(name, lr_outer=0.01).resolve(stream)
    for t in (1, 7, T):
        sched, lam = solver.schedule(t), LAM1 * t**tau
        assert_rule(float(sched.lam), lam, f"{name} lam_{t}")
        assert_rule(float(sched.alpha), 1 / L_G, f"{name} alpha_{t}")
        assert_rule(float(sched.beta), 1 / (2 * lam * L_G), f"{name} beta_{t}")
        gamma = 0.01 * t**-tau if name == "f2obo-sl" else 0.01
        assert_rule(float(sched.gamma), gamma, f"{name} gamma_{t}")


def test_sf2obo_theory_schedules(stream):
    """Corollary 5.2's defaults: K_t = ceil(4 kappa_g log t) in [1, max_inner_steps] with the
    estimated kappa_g, alpha_t = 1/L_g, beta_t = 1/(2 lam1 L_g t^b) (b = 1/6), lam_t = lam1 t^tau;
    with ``inner_schedule="constant"`` F2OBO's Theorem 3.1 K at tau = 1/6."""
    solver = bl.solvers.make("sf2obo", lr_outer=0.01).resolve(stream)
    rounds, cap = [1, 2, 3, 4, T], 50  # the default max_inner_steps
    expected = [min(max(1, math.ceil(4 * L_G / MU_G * math.log(t))), cap) for t in rounds]
    assert [int(solver.inner_steps_at(t)) for t in rounds] == expected  # 1, 28, 44, 50, 50
    for t in (1, 7, T):
        sched = solver.schedule(t)
        assert_rule(float(sched.lam), LAM1 * t ** (1 / 6), f"lam_{t}")
        assert_rule(float(sched.alpha), 1 / L_G, f"alpha_{t}")
        assert_rule(float(sched.beta), 1 / (2 * LAM1 * L_G * t ** (1 / 6)), f"beta_{t}")
    constant = bl.solvers.make("sf2obo", lr_outer=0.01, inner_schedule="constant")
    assert constant.resolve(stream).inner_steps == f2obo_steps(tau=1 / 6)
    # kappa_g is estimated only for the theory K_t that reads it (a mutant estimating it for
    # every schedule survived): the constant schedule leaves it unset
    assert constant.resolve(stream).kappa_g is None


def test_sf2obo_batches_grow_on_held_samples():
    """``batch_schedule="auto"`` is "theory" on a stream with held per-round samples:
    B_t = ceil(t^(2/3)), at most the cap."""
    noisy = bl.problems.drifting_quadratic(
        dx=2, dy=3, horizon=T, cond=L_G, stochastic=True, n_samples=16
    )
    solver = bl.solvers.make("sf2obo", lr_outer=0.01).resolve(noisy)
    assert solver.batch_schedule == "theory"
    rounds, cap = [1, 5, 10, 50], 12
    expected = [min(max(1, math.ceil(t ** (2 / 3))), cap) for t in rounds]
    assert [int(solver.batch_size_at(t, cap)) for t in rounds] == expected  # 1, 3, 5, 12


@pytest.mark.parametrize(
    ("name", "field"),
    [("sobow", "lr_linsys"), ("aobo", "lr_linear"), ("fsobo", "lr_linear"), ("sogd", "lr_linear")],
)
def test_online_linear_system_step_is_the_inner_step(name, field, stream):
    """``None`` (the default) is ``lr_inner``: one round plays exactly as with the linear-system
    step given as the "auto" inner step 1/L_g, and differently with half of it (so the round
    reads the step: v_2 moves from v_1 = 0 along it)."""
    solver = bl.solvers.make(name, lr_outer=0.01).resolve(stream)
    assert getattr(solver, field) is None
    key = jax.random.key(0)

    def adjoint_after_round(s):
        return np.asarray(s.round(stream, s.init(stream, key)).v)

    default = adjoint_after_round(solver)
    same = adjoint_after_round(dataclasses.replace(solver, **{field: solver.lr_inner}))
    half = adjoint_after_round(dataclasses.replace(solver, **{field: 0.5 * solver.lr_inner}))
    np.testing.assert_array_equal(default, same)
    assert not np.allclose(default, half)


def test_an_inner_step_that_lands_on_the_minimiser_needs_one_step():
    """rho = 0 (mu_g = L_g and the step 1/L_g: one step is exact) gives K = 1 for both horizon
    rules, not a refusal (0 < rho was once required)."""
    from bilevel.solvers.online import auto

    assert auto.unrolled_inner_steps(T, 0.0) == 1
    assert auto.penalty_inner_steps(LAM1 * T**0.5, 0.0) == 1
    with pytest.raises(ValueError, match="contract"):
        auto.unrolled_inner_steps(T, 1.0)

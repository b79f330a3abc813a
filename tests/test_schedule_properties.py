"""Property tests of the solvers' schedules over their whole range (issue #34).

Every step-size, penalty, momentum, inner-iteration, batch and threshold schedule below is
called with random parameters drawn by ``hypothesis`` and compared with a DIRECT transcription
of the paper's formula, written out here in the paper's own parametrisation (its constants
``c_gamma``, ``c_alpha``, ``K_0``, its iteration index) rather than by calling the library's
helpers (``step_size``, ``round_step_size``) a second time. The draws cover the regions where a
formula changes its active term: k = 0, 1, 2 and the first rounds, clipping active and
inactive, both terms of a ``max``, caps of ``ceil`` counts, each named regime and random
exponents between them.

Where the library deliberately departs from the printed formula (a typo, or a case the paper
leaves open, documented in the solver's docstring), the transcription follows the corrected
formula and says so, citing that docstring.

Comparisons are in float64 (x64 on; every schedule returns the default float dtype, checked)
at ``rtol = 1e-12``: both sides are a handful of float64 operations (powers, logs, products),
each within a few ulp, so 1e-12 leaves three orders of magnitude of margin and still fails on
any change of an exponent, an index or a constant. Integer schedules (``ceil`` counts) must
agree exactly, except where the real value lies within 1e-9 of an integer, where float
rounding may legitimately take either neighbour. No jit: eager calls, so the file runs in a
few seconds.
"""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from bilevel.core.schedules import step_size
from bilevel.solvers.frank_wolfe.ibcg import IBCG, LastIterateGamma, horizon_step
from bilevel.solvers.frank_wolfe.sbfw import sbfw_weights
from bilevel.solvers.hypergradient.bsa import BSA
from bilevel.solvers.hypergradient.soba import SOBA
from bilevel.solvers.hypergradient.ttsa import TTSA
from bilevel.solvers.online import auto
from bilevel.solvers.online.af2obo import AF2OBO
from bilevel.solvers.online.f2obo import F2OBO
from bilevel.solvers.online.f2obo_sl import F2OBOSingleLoop
from bilevel.solvers.online.sf2obo import SF2OBO
from bilevel.solvers.penalty.f2sa import F2SA
from bilevel.solvers.penalty.f3sa import F3SA, momentum_weight
from bilevel.solvers.second_order.stable import STABLE

jax.config.update("jax_enable_x64", True)

# On a failure, hypothesis's pytest plugin imports libcst (when installed) to write its
# failing-example patch; in some environments that import emits a DeprecationWarning
# (mypy_extensions.TypedDict), which the suite's ``filterwarnings = error`` turns into an
# INTERNALERROR that hides the falsifying example. Importing it once here, quietly, avoids that.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    try:
        import libcst  # noqa: F401
    except ImportError:
        pass

RTOL = 1e-12
#: ~10 s for the file on the 2-core CI machine; no example database (failures are not replayed
#: from .hypothesis/ across runs: each run draws afresh, and prints its falsifying example)
SETTINGS = settings(max_examples=80, deadline=None, database=None)


def _close(value, expected) -> None:
    """``value`` (a library float64 scalar) equals ``expected`` to ``RTOL``."""
    array = np.asarray(value)
    assert array.dtype == np.float64, array.dtype
    np.testing.assert_allclose(array, expected, rtol=RTOL, atol=0.0)


def _ceil_agrees(value, real: float) -> None:
    """``value`` (an int count) is ``ceil(real)``; within 1e-9 (relative) of an integer n, the
    float rounding of ``real`` may give either n or n + 1."""
    value = int(value)
    nearest = round(real)
    if abs(real - nearest) <= 1e-9 * max(1.0, abs(real)):
        assert value in (nearest, nearest + 1), (value, real)
    else:
        assert value == math.ceil(real), (value, real)


def _clamped_ceil_agrees(value, real: float, cap: int) -> None:
    """``value`` is ``ceil(real)`` clamped to ``[1, cap]`` (a count of steps: at least one, at
    most the cap), with the region recorded as a hypothesis event."""
    event("floor 1" if real <= 1.0 else "cap" if real > cap else "ceil")
    if real <= 1.0:
        assert value == 1
    elif real > cap:
        assert value == cap
    else:
        _ceil_agrees(value, real)


def _positive(lo: float, hi: float):
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


#: iteration counts from 0 (the offline solvers), with the first iterations always tried
ITERATIONS = st.one_of(st.sampled_from([0, 1, 2, 3]), st.integers(0, 10**6))
#: rounds from 1 (the online solvers)
ROUNDS = st.one_of(st.sampled_from([1, 2, 3]), st.integers(1, 10**6))


# ---- F2SA / F3SA: Kwon, Kwon, Wright, Nowak, ICML 2023 -----------------------------------------
# Algorithm 1, eqs. (5)-(7), Corollary 4.2 (F2SA); Algorithm 2, eqs. (8b), (9a)-(9c),
# Corollary 4.4 (F3SA).

#: Corollary 4.2's exponents (a, c) by noise regime, and Sec. 4.4's constant-lambda variant
F2SA_PAPER = {
    "stochastic": (5 / 7, 4 / 7),
    "outer-noise": (3 / 5, 2 / 5),
    "deterministic": (1 / 3, 0.0),
    "constant": (1 / 2, 1 / 2),
}
#: Corollary 4.4's exponents (a, c), and the same Sec. 4.4 variant
F3SA_PAPER = {
    "stochastic": (3 / 5, 2 / 5),
    "outer-noise": (1 / 2, 1 / 4),
    "deterministic": (1 / 3, 0.0),
    "constant": (1 / 2, 1 / 2),
}


#: every named regime, and RANDOM: exponents drawn between them
RANDOM = "random (a, c)"
REGIMES = [*F2SA_PAPER, RANDOM]
assert list(F2SA_PAPER) == list(F3SA_PAPER)


@st.composite
def _exponents(draw, table, regime):
    """``(regime, a, c, override)``: the named regime's (a, c), or (RANDOM) a >= c drawn in
    [0, 1] (eq. (5)), passed as the ``a``, ``c`` overrides of a named regime."""
    if regime != RANDOM:
        return regime, *table[regime], False
    c = draw(_positive(0.0, 1.0))
    a = draw(_positive(c, 1.0))
    return "stochastic", a, c, True


def _penalty_paper(k, *, a, c, k0, lam0, mu_g, xi, ratio, factor, lagged):
    """Eqs. (5)-(7) (F2SA: ratio 2, factor 1) or (9a)-(9c) (F3SA: ratio 1, factor 8).

    c_gamma = factor / (mu_g k0^(1-c)), c_alpha = factor / (ratio lam0 mu_g k0^(1-a)),
    gamma_k = c_gamma / (k + k0)^c, alpha_k = c_alpha / (k + k0)^a, x step xi alpha_k, and
    lam_k = gamma_k / (ratio alpha_k) (B.5's closed form (28), without its stray factor 2); or,
    ``lagged``, the update lam_{k+1} = lam_k + delta_k with delta_k = gamma_k / (ratio alpha_k)
    - lam_k from lam_0 (eq. (6) without the min's first term, which B.5 shows is never the
    smaller for T >= 32; eq. (9b) literally), so lam_1 = lam_0 and lam_{k+1} = gamma_k /
    (ratio alpha_k) (the one-step lag of the update: f2sa.penalty_schedule's docstring).
    """
    c_gamma = factor / (mu_g * k0 ** (1 - c))
    c_alpha = factor / (ratio * lam0 * mu_g * k0 ** (1 - a))

    def gamma(i):
        return c_gamma / (i + k0) ** c

    def alpha(i):
        return c_alpha / (i + k0) ** a

    if not lagged:
        lam = gamma(k) / (ratio * alpha(k))
    elif k == 0:
        lam = lam0
    else:  # lam_k = lam_{k-1} + delta_{k-1}, delta_{k-1} = gamma_{k-1}/(r alpha_{k-1}) - lam_{k-1}
        lam = gamma(k - 1) / (ratio * alpha(k - 1))
    return gamma(k), alpha(k), lam, xi * alpha(k)


@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize(
    "cls, table, ratio, factor", [(F2SA, F2SA_PAPER, 2.0, 1.0), (F3SA, F3SA_PAPER, 1.0, 8.0)]
)
@SETTINGS
@given(
    data=st.data(),
    k=ITERATIONS,
    k0=_positive(1.0, 1e4),
    lam0=_positive(1e-2, 1e3),
    mu_g=_positive(1e-3, 1e2),
    xi=_positive(1e-3, 10.0),
    lagged=st.booleans(),
)
def test_penalty_schedule_is_the_papers(
    regime, cls, table, ratio, factor, data, k, k0, lam0, mu_g, xi, lagged
):
    """gamma_k, alpha_k, lam_k (closed and lagged) and the x step of F2SA / F3SA."""
    regime, a, c, override = data.draw(_exponents(table, regime))
    gamma_0 = factor / (mu_g * k0)  # c_gamma / k0^c: the library's lr_inner
    alpha_0 = factor / (ratio * lam0 * mu_g * k0)  # c_alpha / k0^a
    solver = cls(
        lr_outer=xi * alpha_0,  # the library's lr_outer is xi alpha_0
        lr_inner=gamma_0,
        lam0=lam0,
        regime=regime,
        a=a if override else None,
        c=c if override else None,
        k0=k0,
        lam_rule="lagged" if lagged else "closed",
    )
    sched = solver.schedule(None, jnp.int32(k))
    want = _penalty_paper(
        k, a=a, c=c, k0=k0, lam0=lam0, mu_g=mu_g, xi=xi, ratio=ratio, factor=factor, lagged=lagged
    )
    for got, expected in zip((sched.gamma, sched.alpha, sched.lam, sched.outer), want, strict=True):
        _close(got, expected)
    if k == 0 or (lagged and k == 1):
        _close(sched.lam, lam0)  # lam_0 (and the lagged rule's lam_1 = lam_0)


@pytest.mark.parametrize("regime", REGIMES)
@SETTINGS
@given(data=st.data(), k=ITERATIONS)
def test_f3sa_momentum_weight_is_9a_with_8b_start(regime, data, k):
    """eta_k = (k+1)^(-2c) (9a), with eta_0 = eta_1 = 1 ((8b); (9a) alone gives 2^(-2c) at k = 1:
    f3sa.momentum_weight's docstring)."""
    regime, _, c, override = data.draw(_exponents(F3SA_PAPER, regime))
    eta = momentum_weight(jnp.int32(k), c)
    expected = 1.0 if k <= 1 else 1.0 / (k + 1) ** (2 * c)
    _close(eta, expected)
    if not override:  # the solver's wiring: its regime's c (Corollary 4.4)
        _close(F3SA(regime=regime).momentum(None, jnp.int32(k)), expected)
    fixed = data.draw(_positive(1e-3, 1.0))  # a float eta replaces (9a) from k = 2 on
    _close(momentum_weight(jnp.int32(k), c, fixed), 1.0 if k <= 1 else fixed)


# ---- SBFW: Akhtar, Bedi, Thomdapu, Rajawat, IEEE TSP 2022, as the IBCG paper writes it ---------
# Abolfazli et al., arXiv:2306.02429, App. G.1 (steps), App. G.2 Fig. 4 (tuned: eta x 0.1,
# delta x 5), App. G.3 (eta x 0.8).


@SETTINGS
@given(
    k=ITERATIONS,
    eta_factor=st.one_of(st.sampled_from([1.0, 0.1, 0.8]), _positive(1e-2, 5.0)),
    mu_g=_positive(1e-3, 10.0),
    L_ratio=_positive(1.0, 100.0),
    delta_factor=st.one_of(st.sampled_from([1.0, 5.0]), _positive(1e-2, 10.0)),
)
def test_sbfw_weights_are_app_g1_clipped(k, eta_factor, mu_g, L_ratio, delta_factor):
    """At paper iteration j = k + 1: rho_j = 2/j^(1/2), eta_j = 2/(j+1)^(3/4) (times the
    tuning's factor), both clipped to [0, 1] (the paper is silent; rho_j >= 1 for j <= 4,
    eta_1 = 1.19: sbfw_weights' docstring), and delta_j = a_0/j^(1/2) with
    a_0 = min{2/(3 mu_g), mu_g/(2 L_g^2)} (times the tuning's factor)."""
    j = k + 1
    L_g = L_ratio * mu_g
    a_0 = delta_factor * min(2 / (3 * mu_g), mu_g / (2 * L_g**2))
    eta_1 = eta_factor * 2 / 2**0.75  # the library's lr_outer: the (scaled) eta of j = 1
    rho, eta, delta = sbfw_weights(jnp.int32(k), eta_1, a_0)
    _close(rho, min(2 / j**0.5, 1.0))
    _close(eta, min(max(eta_factor * 2 / (j + 1) ** 0.75, 0.0), 1.0))
    _close(delta, a_0 / j**0.5)
    event(f"rho clipped: {j <= 4}; eta clipped: {eta_factor * 2 / (j + 1) ** 0.75 > 1}")
    if j <= 4:
        assert float(rho) == 1.0  # clipped (exactly 1 at j = 4)


@SETTINGS
@given(k=ITERATIONS)
def test_sbfw_default_eta_is_the_papers(k):
    """The default lr_outer is the paper's eta_j = 2/(j+1)^(3/4), clipped (eta_1 = 1.19 -> 1)."""
    _, eta, _ = sbfw_weights(jnp.int32(k))
    _close(eta, min(2 / (k + 2) ** 0.75, 1.0))


# ---- IBCG: Abolfazli, Jiang, Mokhtari, Yazdandoost Hamedani, arXiv:2306.02429 -----------------
# Corollary 4.2 (convex: gamma = log K / K), Corollary 4.4 (nonconvex: gamma = 1/sqrt(K));
# "last-iterate" is the library's (not in the paper): ibcg.LastIterateGamma's docstring.

HORIZONS = st.one_of(st.sampled_from([2, 3, 10, 11, 100]), st.integers(2, 10**7))


@st.composite
def _horizon_and_k(draw):
    """K >= 2 and k in [0, K]: the first steps, around k + 1 = K/10 (the kink), and beyond."""
    K = draw(HORIZONS)
    kink = max(int(0.1 * K) - 1, 0)
    k = draw(
        st.one_of(
            st.sampled_from([0, 1, 2]),
            st.integers(max(kink - 2, 0), kink + 2),
            st.integers(0, K),
        )
    )
    return K, k


@SETTINGS
@given(Kk=_horizon_and_k(), rule=st.sampled_from(["convex", "nonconvex", "last-iterate"]))
def test_ibcg_gamma_is_the_corollaries(Kk, rule):
    """horizon_step and the gamma the solver resolves and uses at step k (step_size of it)."""
    K, k = Kk
    constant = math.log(K) / K if rule == "convex" else 1.0 / math.sqrt(K)
    assert horizon_step(float(K), rule) == pytest.approx(constant, rel=RTOL, abs=0.0)
    if rule == "last-iterate":  # gamma min(1, (0.1 K / (k + 1))^(3/2))
        expected = constant * min(1.0, (0.1 * K / (k + 1)) ** 1.5)
    else:
        expected = constant
    solver = IBCG(horizon=K, gamma_rule=rule, lr_inner=0.1, lr_adjoint=0.1).resolve(None)
    _close(step_size(solver.lr_outer, jnp.int32(k)), expected)


@SETTINGS
@given(Kk=_horizon_and_k(), gamma=_positive(1e-4, 1.0))
def test_last_iterate_gamma(Kk, gamma):
    """gamma min(1, (k_1/(k+1))^(3/2)), k_1 = K/10: constant while k + 1 <= K/10, then ~ k^-1.5."""
    K, k = Kk
    event(f"constant part (k + 1 <= K/10): {k + 1 <= 0.1 * K}")
    got = LastIterateGamma(gamma, float(K))(jnp.int32(k))
    _close(got, gamma * min(1.0, (0.1 * K / (k + 1)) ** 1.5))
    if k + 1 <= 0.1 * K:
        _close(got, gamma)


# ---- TTSA, BSA, SOBA: the decaying step regimes ----------------------------------------------
# TTSA: Hong, Wai, Wang, Yang, SIAM J. Optim. 2023, strongly convex case: alpha_k = c_alpha /
# (k + k_alpha), beta_k = c_beta / (k + k_beta)^(2/3); one offset k0 for both here (as the
# STABLE paper runs it). Its growing Neumann length is the IBCG paper's App. G.1:
# t_max(k) = (L_g/mu_g) log(k + 1), with ceil and a floor at 1 (ttsa.TTSA's docstring).
# BSA: Ghadimi & Wang 2018, strongly convex: alpha_k ~ 1/(k + k0); the inner step ~ 1/(k + k0)
# in place of the growing inner loop (bsa.BSA's docstring: NOT IN PAPER).
# SOBA: Dagreou, Ablin, Vaiter, Moreau, NeurIPS 2022, Theorem 1: gamma_t = gamma_0 t^(-3/5),
# rho_t = rho_0 t^(-2/5), t = k + 1 (k0 = 1); k0 > 1 is the library's offset (soba.SOBA).

#: (outer, inner) decay orders by regime, from the papers cited above
DECAYS = {
    TTSA: {"constant": (0.0, 0.0), "strongly-convex": (1.0, 2 / 3)},
    BSA: {"constant": (0.0, 0.0), "strongly-convex": (1.0, 1.0)},
    SOBA: {"constant": (0.0, 0.0), "decreasing": (3 / 5, 2 / 5)},
}


@pytest.mark.parametrize("cls", [TTSA, BSA, SOBA])
@SETTINGS
@given(
    data=st.data(),
    k=ITERATIONS,
    lr_outer=_positive(1e-4, 10.0),
    lr_inner=_positive(1e-4, 10.0),
    k0=st.one_of(st.just(1.0), _positive(1.0, 1e4)),
)
def test_stochastic_approximation_steps(cls, data, k, lr_outer, lr_inner, k0):
    """alpha_k = c_alpha / (k + k0)^a, beta_k = c_beta / (k + k0)^b with c = value k0^order."""
    regime = data.draw(st.sampled_from(sorted(DECAYS[cls])))
    a, b = DECAYS[cls][regime]
    solver = cls(lr_outer=lr_outer, lr_inner=lr_inner, regime=regime, k0=k0)
    alpha, beta = solver.step_sizes(jnp.int32(k))
    c_alpha, c_beta = lr_outer * k0**a, lr_inner * k0**b
    _close(alpha, c_alpha / (k + k0) ** a)
    _close(beta, c_beta / (k + k0) ** b)
    if cls is SOBA and k0 == 1.0:  # Theorem 1 literally: t = k + 1
        _close(alpha, lr_outer * (k + 1) ** -a)
        _close(beta, lr_inner * (k + 1) ** -b)


@SETTINGS
@given(k=ITERATIONS, kappa=_positive(1.0, 1e3), cap=st.integers(1, 2000))
def test_ttsa_growing_neumann_length(k, kappa, cap):
    """t_max(k) = (L_g/mu_g) log(k + 1), rounded up, at least 1 (t_max(0) = 0), at most the cap."""
    solver = TTSA(lr_outer=0.1, neumann_steps="growing", condition_number=kappa, max_neumann=cap)
    got = int(solver.neumann_length(jnp.int32(k)))
    real = kappa * math.log(k + 1)
    _clamped_ceil_agrees(got, real, cap)


# ---- STABLE: Chen, Sun, Xiao, Yin, AISTATS 2022 ------------------------------------------------
# Theorem 2, eq. (28) (nonconvex: constant steps, tau = Theta(1/sqrt K)) and Theorem 3, eq. (30a)
# (strongly convex: beta_k = tau_k <= 1/(K_0 + k)).
# The default tau (tau=None) is the library's: (k+1)^(-1/2) ("constant") or K_0/(K_0 + k)
# ("strongly-convex"), from tau_0 = 1 (stable.STABLE's docstring, "tau=None").


@SETTINGS
@given(
    k=ITERATIONS,
    regime=st.sampled_from(["constant", "strongly-convex"]),
    lr_outer=_positive(1e-4, 10.0),
    lr_inner=_positive(1e-4, 10.0),
    tau=st.one_of(st.none(), st.just(1.0), _positive(1e-4, 1.0)),
    K0=_positive(1.0, 1e4),
)
def test_stable_steps_and_tau(k, regime, lr_outer, lr_inner, tau, K0):
    solver = STABLE(lr_outer=lr_outer, lr_inner=lr_inner, tau=tau, regime=regime, k0=K0)
    alpha, beta, tau_k = solver.step_sizes(jnp.int32(k))
    if regime == "constant":
        _close(alpha, lr_outer)
        _close(beta, lr_inner)
        _close(tau_k, 1.0 / math.sqrt(k + 1) if tau is None else tau)
    else:  # (30a): c / (K_0 + k), with c = the k = 0 value times K_0
        _close(alpha, lr_outer * K0 / (K0 + k))
        _close(beta, lr_inner * K0 / (K0 + k))
        _close(tau_k, (1.0 if tau is None else tau) * K0 / (K0 + k))
    assert float(tau_k) <= 1.0


# ---- Online: Jia & Chen, arXiv:2602.11665 ------------------------------------------------------
# F2OBO: Algorithm 1, Theorem 3.1 (lam_{t+1} = (1 + 1/t)^tau lam_t, beta_t <= 1/(2 lam_t L_g),
# constant gamma, K >= max{1 - ln 2/ln rho, ...}); F2OBO-SL: Theorem 3.2 (gamma_t ~ t^-tau);
# SF2OBO: Algorithm 3, Theorem 5.1 and Corollary 5.2; AF2OBO: Algorithm 2, Theorem 4.1.
# The printed product
# lam_t = prod_{i<=t} (1 + 1/i)^tau lam_1 is one round ahead (= lam_1 (t+1)^tau); the update
# rule from lam_1 is transcribed (f2obo.F2OBO's docstring).


def _lam_by_recursion(t: int, lam1: float, tau: float) -> float:
    """lam_1, then lam_{s+1} = (1 + 1/s)^tau lam_s, literally (Algorithm 1, last line)."""
    lam = lam1
    for s in range(1, t):
        lam = (1.0 + 1.0 / s) ** tau * lam
    return lam


@pytest.mark.parametrize("cls", [F2OBO, F2OBOSingleLoop, AF2OBO])
@SETTINGS
@given(
    t=ROUNDS,
    short_t=st.integers(1, 200),
    lam1=_positive(1e-2, 100.0),
    tau=st.one_of(st.sampled_from([0.0, 1 / 3, 0.5, 1.0]), _positive(0.0, 2.0)),
    L_g=_positive(1e-2, 100.0),
    gamma=_positive(1e-4, 1.0),
    lagrangian=st.one_of(st.none(), _positive(1e-4, 10.0)),
)
def test_penalty_online_round_schedule(cls, t, short_t, lam1, tau, L_g, gamma, lagrangian):
    """lam_t, alpha = 1/L_g, beta_t = beta_bar / lam_t (default beta_bar = alpha/2: Theorem 3.1's
    1/(2 lam_t L_g)), gamma_t constant (F2OBO, AF2OBO) or gamma_1 t^-tau (F2OBO-SL)."""
    solver = cls(lr_outer=gamma, lr_inner=1.0 / L_g, lr_lagrangian=lagrangian, lam1=lam1, tau=tau)
    sched = solver.schedule(jnp.int32(t))
    lam_t = lam1 * t**tau
    _close(sched.lam, lam_t)
    # the update rule itself: literally for a short run, and one step of it at round t
    _close(solver.schedule(jnp.int32(short_t)).lam, _lam_by_recursion(short_t, lam1, tau))
    _close(solver.schedule(jnp.int32(t + 1)).lam, (1.0 + 1.0 / t) ** tau * float(sched.lam))
    _close(sched.alpha, 1.0 / L_g)
    beta_t = 1.0 / (2.0 * lam_t * L_g) if lagrangian is None else lagrangian / lam_t
    _close(sched.beta, beta_t)
    decays = cls is F2OBOSingleLoop  # Theorem 3.2: gamma_t < (...) / (8 lam_1 t^tau)
    _close(sched.gamma, gamma / t**tau if decays else gamma)
    _close(solver.outer_lr(jnp.int32(t)), gamma / t**tau if decays else gamma)


@st.composite
def _sf2obo_exponents(draw):
    """(tau, a, b): Corollary 5.2's (1/6, 0, 1/6), or random, so that either term of
    max(t^(b - tau), t^a) is the larger one (b - tau from -1 to 1) and b = None (b = tau)."""
    if draw(st.booleans()):
        return 1 / 6, 0.0, 1 / 6
    tau = draw(_positive(0.0, 1.0))
    a = draw(_positive(0.0, 1.0))
    b = draw(st.one_of(st.none(), _positive(0.0, 2.0)))
    return tau, a, b


@SETTINGS
@given(
    t=ROUNDS,
    exponents=_sf2obo_exponents(),
    lam1=_positive(1e-2, 100.0),
    L_g=_positive(1e-2, 100.0),
    lagrangian=st.one_of(st.none(), _positive(1e-4, 10.0)),
)
def test_sf2obo_step_sizes(t, exponents, lam1, L_g, lagrangian):
    """Theorem 5.1: alpha_t = 1/(L_g t^a), beta_t = 1/(2 lam_1 L_g t^b) (lam_1 t^b, not lam_t),
    or beta_bar / (lam_1 t^b); b = None is F2OBO's beta_bar / lam_t."""
    tau, a, b = exponents
    solver = SF2OBO(
        lr_outer=0.01, lr_inner=1.0 / L_g, lr_lagrangian=lagrangian, lam1=lam1, tau=tau, a=a, b=b
    )
    sched = solver.schedule(jnp.int32(t))
    _close(sched.lam, lam1 * t**tau)
    _close(sched.alpha, 1.0 / (L_g * t**a))
    beta_bar = 1.0 / (2.0 * L_g) if lagrangian is None else lagrangian
    _close(sched.beta, beta_bar / (lam1 * t ** (tau if b is None else b)))
    _close(sched.gamma, 0.01)  # gamma_t = gamma constant (Theorem 5.1)


@SETTINGS
@given(
    t=ROUNDS,
    exponents=_sf2obo_exponents(),
    kappa=_positive(1.0, 100.0),
    cap=st.integers(1, 200),
)
def test_sf2obo_inner_steps(t, exponents, kappa, cap):
    """K_t = 4 kappa_g max{t^(b - tau), t^a} log t (Theorem 5.1), rounded up and clamped to
    [1, cap] (it is 0 at t = 1, since log 1 = 0: sf2obo.SF2OBO's docstring)."""
    tau, a, b = exponents
    solver = SF2OBO(tau=tau, a=a, b=b, kappa_g=kappa, max_inner_steps=cap)
    got = int(solver.inner_steps_at(jnp.int32(t)))
    b_ = tau if b is None else b
    real = 4.0 * kappa * max(t ** (b_ - tau), t**a) * math.log(t)
    event(f"max picks t^(b - tau): {b_ - tau > a}")
    _clamped_ceil_agrees(got, real, cap)


@SETTINGS
@given(
    t=st.one_of(ROUNDS, st.sampled_from([8, 27, 64, 125, 1000, 3375])),
    power=st.one_of(st.just(2 / 3), _positive(0.0, 1.5)),
    cap=st.integers(1, 10**5),
)
def test_sf2obo_batch_sizes(t, power, cap):
    """B_t = Bhat_t = t^(B_1) (Theorem 5.1; Corollary 5.2: t^(2/3)), rounded up (sf2obo's module)
    and clamped to [1, cap]. Perfect cubes make t^(2/3) an integer: either neighbour passes."""
    got = int(SF2OBO(batch_power=power).batch_size_at(jnp.int32(t), cap))
    real = t**power
    event("cap" if real > cap else "ceil")
    if real > cap + 1e-9 * cap:
        assert got == cap
    else:
        _ceil_agrees(min(got, cap), real)
        assert 1 <= got <= cap


@SETTINGS
@given(t=ROUNDS, kappa=_positive(1.0, 100.0), L_g=_positive(1e-2, 100.0))
def test_sf2obo_corollary_5_2(t, kappa, L_g):
    """Corollary 5.2: tau = b = 1/6, a = 0: alpha_t = 1/L_g, beta_t = 1/(2 lam_t L_g),
    K_t = 4 kappa_g log t, B_t = t^(2/3)."""
    solver = SF2OBO.corollary_5_2(
        kappa_g=kappa, lr_outer=0.01, lr_inner=1.0 / L_g, max_inner_steps=10**6
    )
    sched = solver.schedule(jnp.int32(t))
    lam_t = solver.lam1 * t ** (1 / 6)
    _close(sched.alpha, 1.0 / L_g)
    _close(sched.beta, 1.0 / (2.0 * lam_t * L_g))
    real = 4.0 * kappa * math.log(t)
    got = int(solver.inner_steps_at(jnp.int32(t)))
    if real <= 1.0:
        assert got == 1
    else:
        _ceil_agrees(got, real)
    _ceil_agrees(int(solver.batch_size_at(jnp.int32(t), 10**9)), t ** (2 / 3))


@SETTINGS
@given(
    T=st.one_of(st.sampled_from([1, 2, 100]), st.integers(1, 10**7)),
    tau=st.one_of(st.sampled_from([0.0, 0.5, 1.0]), _positive(0.0, 2.0)),
)
def test_af2obo_thresholds(T, tau):
    """Theorem 4.1: delta_y = 1/sqrt(T), delta_z = 1/sqrt(T^(1 + 2 tau))."""
    delta_y, delta_z = AF2OBO(tau=tau).thresholds(T)
    assert delta_y == pytest.approx(1.0 / math.sqrt(T), rel=RTOL, abs=0.0)
    assert delta_z == pytest.approx(1.0 / math.sqrt(T ** (1 + 2 * tau)), rel=RTOL, abs=0.0)


@SETTINGS
@given(
    T=st.one_of(st.sampled_from([1, 2, 100]), st.integers(1, 10**6)),
    lam1=_positive(1e-2, 100.0),
    tau=_positive(0.0, 2.0),
    rho=_positive(1e-3, 0.999),
    c=st.one_of(st.just(1.0), _positive(1e-3, 1e3)),
)
def test_f2obo_theorem_3_1_inner_steps(T, lam1, tau, rho, c):
    """Theorem 3.1's K: the least integer K >= max{1 - ln 2/ln rho, (ln c - 2 ln lam_T)/ln rho}
    (that is, lam_T^2 rho^K <= c with lam_T = lam_1 T^tau; the printed (ln c - 2 tau ln T)/ln rho
    is this with lam_1 absorbed into c), at least 1."""
    lam_T = lam1 * T**tau
    got = auto.penalty_inner_steps(lam_T, rho, c)
    real = max(
        1.0 - math.log(2.0) / math.log(rho), (math.log(c) - 2 * math.log(lam_T)) / math.log(rho)
    )
    if real <= 1.0:
        assert got == 1
    else:
        _ceil_agrees(got, real)
    # the conditions the theorem needs, at the K returned (up to float rounding at equality)
    assert 2 * rho**got <= rho * (1 + 1e-9) and lam_T**2 * rho**got <= c * (1 + 1e-9)


@SETTINGS
@given(mu=_positive(1e-3, 10.0), ratio=_positive(1.0, 100.0), frac=_positive(1e-3, 1.0))
def test_f2obo_inner_contraction(mu, ratio, frac):
    """Theorem 3.1's proof, eqs. (17), (19): rho = 1 - step mu for a step <= 1/L (rho_z =
    1 - alpha mu_g; rho_y = 1 - beta_t lam_t mu_g/2 with smoothness 2 lam_t L_g)."""
    smooth = ratio * mu
    step = frac / smooth
    assert auto.inner_contraction(step, mu, smooth) == pytest.approx(1 - step * mu, rel=RTOL)

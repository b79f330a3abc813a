"""Online solvers with their defaults (issue #33): every setting that the theory ties to the
horizon T follows the run's horizon, ``lr_outer="auto"`` is tuned by ``bl.solve_online`` below
the stable bound of the method's round map, and a numeric ``lr_outer`` either tracks the stream
or is refused with the bound and the fix.

The stream of the tracking test is a drifting quadratic of 400 rounds whose outer level is
well conditioned (rho_x = 3, so mu_F >= 3 and L_F ~ 11): there a step of 0.01 can settle
within the horizon (plain gradient descent on the exact F_t ends at 0.013 of the regret of
standing still) and 0.3 exceeds 2 / L_F, so both ends of [0.01, 0.3] are meaningful. On the
streams of tests/online_settings_*.py (mu_F ~ 0.19) no method can reach 0.1 with a step of
0.01 in 400 rounds: exact gradient descent on F_t itself ends at 0.29 there.

Measured 2026-11-26 (float64, seed 0) on this stream, ratio to standing still at default / 0.01
/ 0.3: af2obo 0.0053 / 0.015 / refused, aobo 0.0030 / 0.013 / refused, f2obo 0.0027 / 0.015 /
refused, f2obo-sl 0.0040 / 0.018 / refused (tau = 1/4; 0.004 / 0.016 / refused with its default
0.1, 2026-11-29), fsobo 0.0042 / 0.020 / 0.0042, oagd 0.0043 / 0.017 / refused, obbo 0.0025 /
0.013 / refused, sf2obo 0.0036 / 0.016 / refused, sobbo 0.017 / 0.021 / refused, sobow 0.023 /
0.025 / refused, sogd 0.0042 / 0.020 / 0.0042.
"""

import dataclasses
import math

import jax
import numpy as np
import pytest

import bilevel as bl
from bilevel.analysis import regret as _regret

ONLINE = bl.solvers.names("online")
HORIZON = 400
#: dims 2 and 3 keep the eleven solvers' compilations short (the whole module ~1 min on 2 cores)
STREAM = dict(
    dx=2,
    dy=3,
    horizon=HORIZON,
    cond=3.0,
    rho_x=3.0,
    coupling=1.5,
    drift_inner=0.02,
    drift_outer=0.02,
    seed=5,
)
#: the tuning plays tuning_rounds(400) = 40 rounds per candidate: the same chunk length for the
#: run shares its compiled programs
EVERY = bl.drivers.online.tuning_rounds(HORIZON)


@pytest.fixture(scope="module")
def stream():
    return bl.problems.drifting_quadratic(**STREAM)


def standing_still(problem) -> float:
    """The regret of the constant sequence x_t = x0, by the driver's definition (eq. (2) of
    Jia & Chen, arXiv:2602.11665, with the closed-form grad F_t, as ``regret="auto"`` picks)."""

    def term(t):
        grad = _regret.hypergradient(problem, "closed form", t, problem.x0, problem.y0, 0)
        return _regret.regret_term(problem.x_set, problem.x0, grad, 1.0)

    return float(np.sum(jax.vmap(term)(np.arange(1, problem.horizon + 1))))


def _play(problem, name, **kw):
    return bl.solve_online(problem, bl.solvers.make(name, **kw), progress=False, eval_every=EVERY)


@pytest.mark.parametrize("name", ONLINE)
def test_defaults_and_explicit_steps_track_or_are_refused(name, stream):
    """Default, lr_outer = 0.01 and lr_outer = 0.3: a regret at most 0.1 of standing still, or a
    ValueError that names the stable bound and the fix."""
    still = standing_still(stream)
    res = _play(stream, name)
    assert res.ok, res.message
    assert res.regret[-1] <= 0.1 * still, (name, "default", res.regret[-1] / still)
    tuning = res.tuning
    assert tuning.value in tuning.grid and res.solver.lr_outer == tuning.value
    assert tuning.bound is not None and max(tuning.grid) < tuning.bound
    for lr in (0.01, 0.3):
        try:
            res = _play(stream, name, lr_outer=lr)
        except ValueError as err:
            msg = str(err)
            assert f"lr_outer={lr:g}) exceeds the stable bound" in msg and "'auto'" in msg, msg
            bound = float(msg.split("lr_outer <= ")[1].split(" ")[0])
            assert bound < lr
            continue
        assert res.ok and res.tuning is None, (name, lr, res.message)
        assert res.regret[-1] <= 0.1 * still, (name, lr, res.regret[-1] / still)


def test_tuning_is_deterministic_and_counted(stream):
    """The same seed chooses the same step from the same scores; the tuning's samples and
    oracle calls are in every history row (no free work)."""
    first, second = (_play(stream, "fsobo") for _ in range(2))
    a, b = first.tuning, second.tuning
    assert a.value == b.value and a.grid == b.grid and a.scores == b.scores
    assert a.value in a.grid and a.score == "regret" and a.steps == EVERY and a.seed == 0
    assert a.samples == 0 and a.oracle_calls > 0  # deterministic stream: no samples drawn
    assert len(a.grid) == 8 and all(
        np.isfinite(s) or d for s, d in zip(a.scores, a.dropped, strict=True)
    )
    h = first.history
    fixed = bl.solve_online(
        stream,
        bl.solvers.make("fsobo", lr_outer=a.value),
        progress=False,
        eval_every=EVERY,
    )
    np.testing.assert_array_equal(first.xs, fixed.xs)  # the run starts afresh from x0
    calls = h.oracle_calls.to_numpy() - fixed.history.oracle_calls.to_numpy()
    assert (calls == a.oracle_calls).all()


def test_a_too_large_step_names_the_bound_and_check_step_false_plays_it(stream):
    """SOBOW's window of stored estimates lowers its stable bound far below 2 / L_F."""
    solver = bl.solvers.make("sobow", lr_outer=0.3)
    with pytest.raises(ValueError, match=r"exceeds the stable bound .* use lr_outer <= .*'auto'"):
        bl.solve_online(stream, solver, progress=False)
    with pytest.warns(bl.DivergenceWarning):  # unstable, as the bound said
        res = bl.solve_online(stream, solver, progress=False, eval_every=EVERY, check_step=False)
    assert not res.ok


def test_horizon_rules_follow_the_run():
    """F2OBO's K (Theorem 3.1, O(tau log T)), OBBO's K (O(log T)), AF2OBO's thresholds
    (Theorem 4.1's, over kappa_g by default), AOBO's tolerance (T^-1/2 / kappa_g) and SF2OBO's
    batch schedule are settled from problem.horizon."""

    def quad(horizon, **kw):
        return bl.problems.drifting_quadratic(dx=2, dy=3, horizon=horizon, cond=4.0, **kw)

    def resolved(name, problem):
        return bl.solvers.make(name, lr_outer=0.01).resolve(problem)

    long_stream = quad(10_000)
    short, long = resolved("f2obo", quad(10)), resolved("f2obo", long_stream)
    assert 1 <= short.inner_steps < long.inner_steps
    lam_last, rho = 5.0 * 10_000**0.5, long.inner_contraction(long_stream)
    assert lam_last**2 * rho**long.inner_steps <= 1.0 < lam_last**2 * rho ** (long.inner_steps - 1)
    assert resolved("obbo", quad(10)).inner_steps < resolved("obbo", long_stream).inner_steps
    stream = quad(400)
    af, aobo, kappa_g = resolved("af2obo", stream), resolved("aobo", stream), 4.0  # cond
    assert af.delta_y == pytest.approx(400**-0.5 / kappa_g, rel=1e-6)
    assert af.delta_z == pytest.approx(400**-1.0 / kappa_g, rel=1e-6)
    assert aobo.tolerance == pytest.approx(400**-0.5 / kappa_g, rel=1e-6)
    theory = bl.solvers.make("af2obo", lr_outer=0.01, delta_y="theory", delta_z="theory")
    theory = theory.resolve(stream)
    assert theory.thresholds(400) == (400**-0.5, 400**-1.0)
    assert (theory.delta_y, theory.delta_z) == (0.05, 400**-1.0)
    assert resolved("sf2obo", quad(40)).batch_schedule == "constant"  # deterministic
    noisy = resolved("sf2obo", quad(40, stochastic=True, n_samples=16))
    assert noisy.batch_schedule == "theory" and noisy.inner_schedule == "theory"


def test_the_bound_is_where_the_method_starts_to_diverge(stream):
    """Outside solve_online, ``resolve`` fills lr_outer="auto" with a quarter of the stable
    bound (Theorems 3.1 and 4.1's 1 / (2 L_F) for an exact gradient step); the bound itself is
    sharp on a quadratic stream, whose round maps are affine: F2OBO tracks at 0.9 times it and
    diverges at 1.15 times it."""
    resolved = bl.solvers.make("f2obo").with_horizon(HORIZON).resolve(stream)
    bound = resolved.stable_outer_step(stream).bound
    assert resolved.lr_outer == pytest.approx(bound / 4)
    below = bl.solve_online(
        stream,
        dataclasses.replace(resolved, lr_outer=0.9 * bound),
        progress=False,
        eval_every=EVERY,
    )
    assert below.ok
    with pytest.warns(bl.DivergenceWarning):
        above = bl.solve_online(
            stream,
            dataclasses.replace(resolved, lr_outer=1.15 * bound),
            progress=False,
            eval_every=EVERY,
            check_step=False,
        )
    assert not above.ok


def test_the_bound_ignores_unread_diagnostics_and_refuses_a_non_finite_round():
    """The round map's Jacobian has a row per float entry of the state; a diagnostic that no
    entry reads (a norm, NaN derivative at 0) is zeroed (it only adds eigenvalue 0), while a
    NaN in an entry the map reads is refused with a message, not a LinAlgError."""
    from bilevel.solvers.online import auto

    m = np.array([[0.9, 0.0, 0.0], [1.0, 0.5, 0.0], [np.nan, np.nan, np.nan]])
    clean = auto._unread_rows_zeroed(m)  # entry 2 is read by nobody (column 2 is zero)
    np.testing.assert_array_equal(clean, [[0.9, 0, 0], [1.0, 0.5, 0], [0, 0, 0]])
    read = np.array([[0.9, 0.0, 1.0], [1.0, 0.5, 0.0], [np.nan, np.nan, np.nan]])
    assert np.isnan(auto._unread_rows_zeroed(read)[2]).all()  # entry 2 feeds entry 0: kept
    solver = bl.solvers.make("f2obo")
    with pytest.raises(ValueError, match="not finite on round 7 of the stream"):
        auto._check_finite(solver, {1: (m[:2, :2], m[:2, :2]), 7: (read, read)})


#: the constructor's own stream (rho_x = 0.1, mu_F ~ 0.1) with drift: there a step of 0.01
#: cannot settle in 400 rounds (every method ends at 0.16-0.19 of standing still with it)
SLOW = dict(horizon=HORIZON, drift_inner=0.02, drift_outer=0.02)


@pytest.fixture(scope="module")
def slow_stream():
    return bl.problems.drifting_quadratic(**SLOW)


def _range(message: str) -> tuple[float, float]:
    low, high = message.split("where steps from ")[1].split(" reach")[0].split(" to ")
    return float(low), float(high)


@pytest.mark.parametrize("name", ["f2obo", "sobow", "f2obo-sl"])
def test_a_step_that_cannot_settle_is_refused_with_the_steps_that_do(name, slow_stream):
    """lr_outer = 0.01 on the slow stream is refused, naming a range of steps; played anyway
    (check_step=False) it ends above a tenth of standing still, as predicted; a step from the
    range ends below it. F2OBO keeps a constant step, SOBOW a window of stored estimates,
    F2OBO-SL a decaying step (the maps of rounds 1, 2, 4, ... follow them)."""
    still = standing_still(slow_stream)
    with pytest.raises(ValueError, match=r"lr_outer=0.01\) is below the steps that let x settle"):
        _play(slow_stream, name, lr_outer=0.01)
    try:
        _play(slow_stream, name, lr_outer=0.01)
    except ValueError as err:
        message = str(err)
    assert "'auto', or check_step=False to play 0.01 anyway" in message
    low, high = _range(message)
    assert 0.01 < low < high
    played = bl.solve_online(
        slow_stream,
        bl.solvers.make(name, lr_outer=0.01),
        progress=False,
        eval_every=EVERY,
        check_step=False,
    )
    assert played.regret[-1] > 0.1 * still
    inside = _play(slow_stream, name, lr_outer=math.sqrt(low * high))
    assert inside.regret[-1] <= 0.1 * still


def test_the_settling_prediction_is_the_played_regret_on_a_still_quadratic():
    """Without drift every round of a quadratic stream is the same affine map, so the
    prediction (bilevel.solvers.online.settling) is SOGD's own regret ratio up to rounding;
    the sign of any term in its recursion would show here."""
    from bilevel.solvers.online import settling

    stream = bl.problems.drifting_quadratic(dx=3, dy=4, horizon=120, cond=3.0, seed=2)
    solver = bl.solvers.make("sogd", lr_outer=0.02).with_horizon(120).resolve(stream)
    predicted = settling.settling(solver, stream, "closed form", None)
    played = bl.solve_online(stream, solver, progress=False, check_step=False)
    assert predicted.rounds == (1, 2, 4, 8, 16, 32, 64) and predicted.reaching == ()
    np.testing.assert_allclose(predicted.ratio, played.regret[-1] / standing_still(stream), 1e-8)


def test_the_settling_prediction_follows_the_drift():
    """With drift every round of a quadratic stream is an affine map with the same Jacobian
    (SOGD's step is constant) and its own offset, which the prediction takes from each round
    (``auto.round_offsets``) and judges by that round's F_t: SOGD's own regret ratio up to
    rounding. Taking round 1's offset or F_1 for every round is off by far more."""
    from bilevel.solvers.online import settling

    stream = bl.problems.drifting_quadratic(
        dx=3, dy=4, horizon=120, cond=3.0, drift_inner=0.05, drift_outer=0.05, seed=2
    )
    solver = bl.solvers.make("sogd", lr_outer=0.05).with_horizon(120).resolve(stream)
    predicted = settling.settling(solver, stream, "closed form", None)
    played = bl.solve_online(stream, solver, progress=False, check_step=False)
    np.testing.assert_allclose(predicted.ratio, played.regret[-1] / standing_still(stream), 1e-8)


@pytest.fixture(scope="module")
def lagging_stream():
    """A stream on which no step below the stable bound settles for F2OBO-SL (its step decays
    like t^-tau) or the single-step baselines (their inner iterates lag y*_t): cond 20."""
    return bl.problems.drifting_quadratic(
        dx=8, dy=12, horizon=400, cond=20.0, drift_inner=0.02, drift_outer=0.02, seed=3
    )


def test_auto_takes_the_step_predicted_to_settle_when_the_first_rounds_favour_one_too_small(
    lagging_stream,
):
    """On this stream the inner iterate starts far from y*, so on the first 40 rounds the
    smallest step scores best for F2OBO-SL with tau = 1/4; the whole horizon's prediction
    replaces it by the kept candidate predicted lowest (drivers/online.py, point 5), and the
    run ends where predicted (0.83 of standing still with the first rounds' choice, measured
    2026-11-29). No step reaches a tenth here, so "auto" is refused, naming tau; with
    ``check_step=False`` a SettlingWarning says so and the choice is played."""
    solver = bl.solvers.make("f2obo-sl", tau=0.25)
    with pytest.raises(ValueError, match=r"the lowest, 0.5.*Try a smaller tau.*check_step=False"):
        bl.solve_online(lagging_stream, solver, progress=False)
    with pytest.warns(bl.SettlingWarning, match=r"the lowest, 0.5.*Try a smaller tau"):
        res = bl.solve_online(lagging_stream, solver, progress=False, check_step=False)
    tuning = res.tuning
    kept = [i for i, d in enumerate(tuning.dropped) if not d]
    first_rounds = min(kept, key=lambda i: tuning.scores[i])
    best = min(kept, key=lambda i: tuning.predicted[i])
    assert tuning.predicted[first_rounds] > 0.1 and best != first_rounds
    assert tuning.value == tuning.grid[best]
    ratio = res.regret[-1] / standing_still(lagging_stream)
    assert abs(ratio - tuning.predicted[best]) < 0.05 and ratio < tuning.predicted[first_rounds]


def test_a_step_is_refused_where_no_step_settles_naming_what_else_to_change(lagging_stream):
    """FSOBO takes one inner step a round, which lags y*_t on this stream: no step below the
    bound is predicted to reach a tenth of standing still (the lowest 0.12, played 0.122 by
    "auto" before this check), so 0.1 (played 0.158) is refused with the inner steps named
    rather than played; ``check_step=False`` plays it, and it ends where predicted."""
    from bilevel.solvers.online import settling

    solver = bl.solvers.make("fsobo", lr_outer=0.1)
    refusal = r"no lr_outer.*the lowest, 0.1\d.*several inner steps.*fsobo takes one"
    with pytest.raises(ValueError, match=refusal):
        bl.solve_online(lagging_stream, solver, progress=False)
    res = bl.solve_online(lagging_stream, solver, progress=False, check_step=False)
    resolved = res.solver
    found = settling.settling(resolved, lagging_stream, "closed form", None)
    ratio = res.regret[-1] / standing_still(lagging_stream)
    assert ratio > 0.1 and abs(found.ratio - ratio) < 0.02


def test_the_default_tolerances_do_not_hold_x_back_on_an_ill_conditioned_stream(lagging_stream):
    """AF2OBO's thresholds over kappa_g (= 20 here): at lr_outer = 0.3 its inner loops stop
    close enough that the run ends where the linearised round map predicts (0.032 of standing
    still, measured 2026-11-29) and below a tenth. With Theorem 4.1's own thresholds, 20 times
    looser, the same step ends at 0.073, twice what the map predicts (0.038): the tolerance
    holds x back. AOBO's T^-1/2 / kappa_g likewise (0.033; 0.050 with Experiment 1's 0.1,
    whose loop takes 0.4 steps a round here, and none in the last rounds)."""
    from bilevel.solvers.online import settling

    still = standing_still(lagging_stream)

    def played_and_predicted(name, **kw):
        res = bl.solve_online(
            lagging_stream, bl.solvers.make(name, lr_outer=0.3, **kw), progress=False
        )
        found = settling.settling(res.solver, lagging_stream, "closed form", None)
        return res.regret[-1] / still, found.ratio, res

    for name in ("af2obo", "aobo"):
        ratio, predicted, _ = played_and_predicted(name)
        assert ratio < 0.05 and abs(ratio - predicted) < 0.05 * ratio, (name, ratio, predicted)
    ratio, predicted, _ = played_and_predicted("af2obo", delta_y="theory", delta_z="theory")
    assert ratio > 1.5 * predicted and ratio > 0.06
    ratio, _, res = played_and_predicted("aobo", tolerance=0.1)
    assert ratio > 0.045 and res.history.inner_iterations.iloc[-1] == 0


def test_the_settling_prediction_by_dense_inner_solves_follows_the_closed_form(slow_stream):
    """With a dense inner solve per point the prediction takes every k-th round of the horizon
    (settling.DENSE_POINTS of them), each standing for the k rounds from it: its first, so the
    sum leans high by the decay within a block (measured 0.175 against 0.170 for F2OBO at 0.01)."""
    from bilevel.solvers.online import settling

    solver = bl.solvers.make("f2obo", lr_outer=0.01).with_horizon(HORIZON).resolve(slow_stream)
    bound = solver.stable_outer_step(slow_stream).bound
    closed = settling.settling(solver, slow_stream, "closed form", bound)
    dense = settling.settling(solver, slow_stream, "dense inner solve", bound)
    assert closed.ratio > 0.1 and closed.reaching
    assert closed.ratio <= dense.ratio <= 1.1 * closed.ratio
    assert max(dense.reaching) == max(closed.reaching)


def test_the_settling_hint_names_what_each_method_can_change():
    """Where no step settles the refusal names what else to change: the tolerances at which
    AOBO's and AF2OBO's inner loops stop, the count of a method that counts its inner steps,
    and another method for the single-step ones (never the method itself)."""
    hints = {name: bl.solvers.make(name).settling_hint() for name in ONLINE}
    assert "tolerance=" in hints["aobo"] and "delta_y=" in hints["af2obo"]
    assert "inner_steps=5" in hints["oagd"] and "smaller tau" in hints["f2obo-sl"]
    for name in ("fsobo", "sogd"):
        assert f"{name} takes one" in hints[name]
    for name, hint in hints.items():
        assert f"'{name}'" not in hint, (name, hint)

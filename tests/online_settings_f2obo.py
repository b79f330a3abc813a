"""Tracking settings of the F2OBO family (F2OBO, F2OBO-SL, AF2OBO, SF2OBO) for the aggregate
check "regret <= 0.1 x regret of standing still at x0" on drifting_quadratic(dx=3, dy=4,
horizon=400, cond=2.0, drift_inner=0.002, drift_outer=0.002), deterministic (TRACKING) and with
stochastic=True, n_samples=64 (STOCHASTIC, batch_size 16). Ratios measured with seed 0.
"""

TRACKING = {
    # 0.013 (tests/test_online.py's TRACKING)
    "f2obo": dict(lr_outer=0.3, lr_inner=0.5, inner_steps=10, tau=0.5),
    # 0.0215
    "f2obo-sl": dict(lr_outer=0.3, lr_inner=0.5),
    # 0.0129; the Experiment 1 tolerances (0.5, 0.1) give 13.3: the ghat error is up to
    # 2 delta_y / mu_g + lam_t delta_z / mu_g (eqs. (10)-(11)), 10 at lam_400 = 100
    "af2obo": dict(lr_outer=0.3, lr_inner=0.5, tau=0.5, delta_y=1e-3, delta_z=1e-4),
    # 0.0129 (the constant schedules, the defaults before issue #33)
    "sf2obo": dict(
        lr_outer=0.3, lr_inner=0.5, inner_steps=10, tau=0.5, inner_schedule="constant", b=None
    ),
}

STOCHASTIC = {
    # 0.0436; tau = 1/2 with lr_inner 0.5 gives 30.7: the noise of ghat grows with lam_t
    # (Theorem 5.1's (1 + 2 lam_t^2) sigma^2 / Bhat_t)
    "f2obo": dict(lr_outer=0.3, lr_inner=0.1, inner_steps=10, tau=1 / 6, batch_size=16),
    # 0.0834
    "f2obo-sl": dict(lr_outer=0.3, lr_inner=0.5, batch_size=16),
    # 0.0416 (Corollary 5.2's tau = 1/6 with a fixed K and batch)
    "sf2obo": dict(
        lr_outer=0.3,
        lr_inner=0.1,
        inner_steps=5,
        tau=1 / 6,
        batch_size=16,
        inner_schedule="constant",
        batch_schedule="constant",
        b=None,
    ),
    # AF2OBO: no setting found: its stopping tests on minibatch norms stop early on lucky draws
    # or run to the cap (best measured 0.59 with lr_inner 0.1, tau 1/6, deltas 0.1 / 0.05, cap
    # 20); the paper only analyses it deterministically.
}

"""Battery settings for SOBA and SABA (tests/solver_settings.py).

Both take the battery's default steps (gamma = 0.05, rho = 0.1 = 1/L_g on the deterministic
quadratic); rho is a number rather than "auto" for the reason given in
tests/solver_settings_stable.py (bl.diagnose would compile on every solve).
SABA's memory starts at zero here: with its default "full" initialisation the pass over the data
at (x0, y0) is counted at step 0, so its counts are not a multiple of the step count, which the
battery's per-step-constant-count check assumes; tests/test_soba_saba.py checks the "full"
counts exactly.
"""

SETTINGS = {
    "soba": {"lr_outer": 0.05, "lr_inner": 0.1},
    "saba": {"lr_outer": 0.05, "lr_inner": 0.1, "init_memory": "zero"},
}

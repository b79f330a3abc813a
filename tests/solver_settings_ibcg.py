"""Battery settings for the Frank-Wolfe methods of the IBCG paper (tests/solver_settings.py).

The battery gives them the quadratic with ``x_set = L2Ball(1.1 ||x*||)`` (``problem_for``), so
x* is interior and ``||grad F||`` must still fall. A constant Frank-Wolfe step gamma zigzags
around an interior optimum at amplitude ~gamma R (every LMO point lies on the sphere), so
``||grad F||`` plateaus near L_F gamma R: gamma = 0.02 drops it 46x in 200 steps (0.05: 18x).
alpha = 0.1 = 1/L_g and eta = 0.1 < 2/(mu_g + L_g) = 0.18 (numbers, not "auto": "auto" runs
bl.diagnose, which compiles on every solve; tests/test_ibcg.py tests "auto").
"""

SETTINGS = {
    "ibcg": {"lr_outer": 0.02, "lr_inner": 0.1, "lr_adjoint": 0.1},
}

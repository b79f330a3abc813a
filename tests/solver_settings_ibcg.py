"""Battery settings for the Frank-Wolfe methods of the IBCG paper (tests/solver_settings.py).

The battery gives them the quadratic with ``x_set = L2Ball(1.1 ||x*||)`` (``problem_for``), so
x* is interior and ``||grad F||`` must still fall. A constant Frank-Wolfe step gamma zigzags
around an interior optimum at amplitude ~gamma R (every LMO point lies on the sphere), so
``||grad F||`` plateaus near L_F gamma R: gamma = 0.02 drops it 46x in 200 steps (0.05: 18x).
alpha = 0.1 = 1/L_g and eta = 0.1 < 2/(mu_g + L_g) = 0.18 (numbers, not "auto": "auto" runs
bl.diagnose, which compiles on every solve; tests/test_ibcg.py tests "auto").

SBFW's eta_k decays from eta_1 = lr_outer as (2/(k+1))^{3/4}, so the zigzag shrinks with k:
eta_1 = 0.2, delta_1 = 0.1 = 1/L_g measured a drop of 85x in 200 steps (eta_1 = 1: 30x). Near
x* the ball's LMO direction d/||d|| amplifies rounding step after step: eta_1 = 0.3 let the flat
and pytree runs part at 1e-4 by step 50 (rounding of a permuted dense solve), 0.2 keeps 2e-16. It
runs its exact-Hessian-inverse variant here: the Neumann variant's l ~ U{1..k} makes its HVP
count random, which the battery's per-step-constant counts check cannot take; tests/test_sbfw.py
covers the Neumann variant.
"""

SETTINGS = {
    "ibcg": {"lr_outer": 0.02, "lr_inner": 0.1, "lr_adjoint": 0.1},
    "sbfw": {"lr_outer": 0.2, "lr_inner": 0.1, "neumann_lr": 0.1, "hessian_inverse": "exact"},
}

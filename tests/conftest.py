"""Test-wide settings: float64 so exact-answer checks can use tight, justified tolerances, and
rank promotion as an error so silent broadcasting bugs surface (CONVENTIONS C9)."""

import os

# XLA:CPU's multi-threaded Eigen pool can wedge on vmapped graphs (jaxlib 0.10.2: STABLE's two
# eigendecompositions per step hung 8 vmapped seeds on 2 cores; the same hang is reported
# elsewhere with this flag as the fix). A hung test would time CI out, so the suite runs with
# single-threaded Eigen; it must be set before JAX starts its CPU backend.
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_cpu_multi_thread_eigen=false"]
).strip()

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")

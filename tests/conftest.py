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


import gc  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop every compiled program after each test module. Each XLA:CPU executable holds its
    own memory mappings: the battery file alone left 28,375 mappings in the process, and the
    whole suite crossed Linux's default vm.max_map_count (65,530), after which LLVM's JIT
    segfaulted while compiling (seen 2026-11-24 in test_solvers_battery)."""
    yield
    from bilevel.drivers import programs

    programs.clear_cache()
    jax.clear_caches()
    gc.collect()

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


def _compilation_cache_per_process() -> None:
    """JAX's persistent compilation cache in a fresh directory of this process (each xdist
    worker has its own, removed at exit): a program compiled again in a later test module (the
    fixture below drops the compiled programs after each one; the same solver on the same
    problem recurs across files) is loaded instead of compiled. The executable loaded is the
    one compiled, so nothing a test checks changes; ``--xla_...`` flags and compile options are
    part of the key. Not shared between workers: the cache writes its files in place, so a
    worker could read another's half-written entry. Measured 2026-11-27 on ten solver test
    files in one process: 148 of 369 cached programs loaded, 10% of the compile time saved.
    ``BILEVEL_TEST_COMPILATION_CACHE=0`` turns it off."""
    if os.environ.get("BILEVEL_TEST_COMPILATION_CACHE", "1") == "0":
        return
    import atexit
    import shutil
    import tempfile

    directory = tempfile.mkdtemp(prefix="bilevel-tests-xla-cache-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    jax.config.update("jax_compilation_cache_dir", directory)
    # programs under 0.3 s are cheaper to compile than to write (loading one takes ~25 ms)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.3)


_compilation_cache_per_process()


import gc  # noqa: E402

import pytest  # noqa: E402

#: modules that inspect compiled programs (their HLO, layouts, the CPU rewrites) or assert
#: bit-level results against a CLI subprocess: compiled with XLA's full optimisation as users
#: run them. Every other module compiles with most optimisations off
#: (``jax_disable_most_optimizations``: LLVM's backend at -O0, its expensive passes off; the
#: HLO passes, fusion and buffer assignment, run as usual): the suite's time is mostly
#: compiling, and what the other modules check (closed forms, replicas to 1e-10, bit identity
#: of runs compiled under the same flags, XLA's memory analysis, bfloat16 tolerances) does not
#: depend on how well LLVM optimises the code. Measured on the 2-core machine, all passing
#: either way: seven network and problem modules 277 -> 179 CPU-s, test_online and the battery
#: 454 -> 327 (2026-11-27); the whole suite with the flag off everywhere
#: (``BILEVEL_TESTS_FULL_XLA=1``; test_experiments then still set it, by a fixture of its
#: own since removed) took 2,949 worker-seconds against 2,339 with it (2026-11-28), and no
#: module was more than 4 s faster without it.
#: Moved out of this set on 2026-11-28, CPU-s fully optimised -> with the flag:
#: test_solver_contract 72 -> 51, test_unrolled_keys 42 -> 30, test_precision 30 -> 17,
#: test_memory 19 -> 14.
FULLY_OPTIMISED = {
    "test_compile_cache",
    "test_cpu_rewrites",
    "test_dot_merge",
    "test_small_dots",
    "test_wide_dots",
    "test_carry_layout",
    "test_eigen_floor",
    # a CLI subprocess (fully optimised, as users run it) against an in-process run, bit for bit
    "test_run",
    # running, not compiling, is their time (many steps of small programs): fully optimised
    # they took less CPU (measured 2026-11-27 on the 2-core machine, one module at a time:
    # test_soba_saba 62 -> 38 CPU-s, test_f2sa 29 -> 22, test_stocbio 22 -> 16)
    "test_soba_saba",
    "test_f2sa",
    "test_stocbio",
}


@pytest.fixture(autouse=True, scope="module")
def _fewer_optimisations_where_compiling_dominates(request):
    # BILEVEL_TESTS_FULL_XLA=1: every module fully optimised (to measure what the flag saves)
    full = os.environ.get("BILEVEL_TESTS_FULL_XLA") == "1"
    if full or request.module.__name__.rsplit(".", 1)[-1] in FULLY_OPTIMISED:
        yield
        return
    previous = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", previous)


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

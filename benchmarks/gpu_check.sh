#!/usr/bin/env bash
# The checks to run where a GPU is lent, in one call of under 8 minutes (docs/performance.md
# has no GPU rows yet: this is how they are measured).
#
#   bash benchmarks/gpu_check.sh                 # on the GPU machine
#   GPU_CHECK_ALLOW_CPU=1 GPU_CHECK_TOTAL=300 bash benchmarks/gpu_check.sh   # dry run on a CPU
#
# In order, each step under a `timeout` and all of them under one deadline:
#   1. setup: the package importable (`pip install -e '.[dev]'` only if it is not), and a CUDA
#      jax (`jax[cuda12]` installed only from a local wheel cache, as the machine is offline);
#   2. the device: jax.devices() and the backend; FAILS unless the backend is the GPU (or
#      GPU_CHECK_ALLOW_CPU=1), and checks that the XLA:CPU rewrites are off there;
#   3. the solver contract's tests (every solver's programs as jit / vmap arguments) and the
#      in-process checks of the device arguments;
#   4. the per-step benchmarks of docs/performance.md with small repeat counts: the quadratic
#      (us per step, solver / oracle floor, 10 vmapped seeds / 1 seed), data cleaning (solver /
#      floor), and a sweep against the loop of solves it replaces;
#   5. the solver battery (every solver: convergence, no recompilation, vmapped seeds equal
#      separate runs, exact call counts) in the time left: the longest, so it runs last;
#   6. a summary: what passed, failed, timed out or was skipped.
# Everything goes to $GPU_CHECK_DIR/gpu_check.log (default: $OUT, which the device tool brings
# back, else /tmp/gpu_check). The script exits 1 if any step failed or timed out.
#
# Settings (environment): GPU_CHECK_TOTAL (seconds for the whole run, default 450),
# GPU_CHECK_TEST_BUDGET / GPU_CHECK_BENCH_BUDGET (per step, default 90 / 70; the battery takes
# what the deadline leaves, up to 3 x the test budget), GPU_CHECK_STEPS,
# GPU_CHECK_REPEATS, GPU_CHECK_SWEEP_STEPS (benchmark sizes; tiny by default on a CPU dry run),
# GPU_CHECK_WHEELS (the wheel cache, default shared/wheels).
set -uo pipefail
cd "$(dirname "$0")/.."

start=$SECONDS
total=${GPU_CHECK_TOTAL:-450}
dir=${GPU_CHECK_DIR:-${OUT:-/tmp/gpu_check}}
mkdir -p "$dir"
log="$dir/gpu_check.log"
: >"$log"
exec > >(tee -a "$log") 2>&1

python=${PYTHON:-$(command -v python || command -v python3)}
export PYTHONUNBUFFERED=1  # output reaches the log in order, and before a timeout
summary=()

say() { printf '\n=== %s (%ds into the run)\n' "$*" "$((SECONDS - start))"; }

# step NAME BUDGET COMMAND...: runs COMMAND under `timeout`, cut to what the deadline leaves
# (10 s kept for the summary), and records passed / FAILED (rc) / TIMED OUT / SKIPPED with
# pytest's count line where there is one. The timeout sends SIGINT, not SIGTERM: pytest then
# stops like on Ctrl-C and still prints its counts (SIGKILL 15 s later if it does not stop).
step() {
  local name=$1 budget=$2 left rc t0 out counts
  shift 2
  left=$((total - (SECONDS - start) - 10))
  if [ "$left" -lt 15 ]; then
    summary+=("SKIPPED    $name (no time left of ${total}s)")
    return 0
  fi
  [ "$budget" -gt "$left" ] && budget=$left
  say "$name (timeout ${budget}s)"
  t0=$SECONDS
  out=$(mktemp)
  timeout -s INT --kill-after=15 "$budget" "$@" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  counts=$(grep -E '[0-9]+ (passed|failed|error)' "$out" | tail -n 1 | sed 's/^=* *//; s/ *=*$//')
  rm -f "$out"
  counts=${counts:+: $counts}
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    summary+=("TIMED OUT  $name (after ${budget}s$counts)")
  elif [ "$rc" -ne 0 ]; then
    summary+=("FAILED     $name (rc $rc, $((SECONDS - t0))s$counts)")
  else
    summary+=("passed     $name ($((SECONDS - t0))s$counts)")
  fi
  return 0
}

finish() {
  say "summary (log: $log)"
  printf '%s\n' "${summary[@]}"
  if printf '%s\n' "${summary[@]}" | grep -qE '^(FAILED|TIMED OUT)'; then exit 1; fi
  exit 0
}

# ---- 1. setup ---------------------------------------------------------------------------------
say "setup"
if $python -c "import bilevel" 2>/dev/null; then
  echo "bilevel: importable ($($python -c 'import bilevel; print(bilevel.__file__)'))"
else
  echo "bilevel: not importable; pip install -e '.[dev]' (offline: installed build tools only)"
  timeout 180 $python -m pip install -q --no-build-isolation -e '.[dev]' \
    || echo "bilevel: the install failed; going on with PYTHONPATH=src"
  $python -c "import bilevel" 2>/dev/null || export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
fi
backend=$($python -c "import jax; print(jax.default_backend())" 2>/dev/null || echo none)
wheels=${GPU_CHECK_WHEELS:-shared/wheels}
if [ "$backend" != gpu ] && compgen -G "$wheels/jax*cuda*.whl" >/dev/null; then
  echo "jax: backend '$backend'; a wheel cache at $wheels: installing jax[cuda12] from it"
  jax_version=$($python -c "import jax; print(jax.__version__)")
  timeout 240 $python -m pip install -q --no-index --find-links "$wheels" \
    "jax[cuda12]==$jax_version" || echo "jax: the jax[cuda12] install failed"
else
  echo "jax: backend '$backend'; no jax[cuda12] install (cache at $wheels: $(
    compgen -G "$wheels/jax*cuda*.whl" >/dev/null && echo found || echo none))"
fi
$python -m pip list 2>/dev/null | grep -iE '^(jax|jaxlib|jax-cuda|nvidia-(cublas|cudnn))' || true

# ---- 2. the device ----------------------------------------------------------------------------
say "device"
if ! $python - <<'EOF'
import os
import sys

import jax

backend = jax.default_backend()
print(f"jax {jax.__version__}, backend {backend}")
for device in jax.devices():
    print(f"  {device} ({device.device_kind}, platform {device.platform})")
if backend != "gpu" and os.environ.get("GPU_CHECK_ALLOW_CPU") != "1":
    sys.exit(f"FAIL: the backend is {backend!r}, not the GPU (GPU_CHECK_ALLOW_CPU=1 dry-runs)")

# the XLA:CPU rewrites of the compiled steps are for the CPU backend only
from bilevel.drivers import _xla_cpu
from bilevel.drivers.cpu_rewrites import CpuRewrites

applied = _xla_cpu.applies(CpuRewrites.default())
print(f"CPU rewrites applied on this backend: {applied}")
if backend == "gpu" and applied:
    sys.exit("FAIL: the XLA:CPU rewrites would run on the GPU backend")
EOF
then
  summary+=("FAILED     device (see above)")
  finish
fi
summary+=("passed     device")
device=$($python -c "import jax; d = jax.devices()[0]; print(f'{d.platform} {d.device_kind}')")

cpu_dry_run=0
[ "$($python -c 'import jax; print(jax.default_backend())')" != gpu ] && cpu_dry_run=1
if [ "$cpu_dry_run" = 1 ]; then  # a dry run: tiny sizes, only to see every step work
  steps=${GPU_CHECK_STEPS:-20} repeats=${GPU_CHECK_REPEATS:-2}
  sweep_steps=${GPU_CHECK_SWEEP_STEPS:-200}
else
  steps=${GPU_CHECK_STEPS:-200} repeats=${GPU_CHECK_REPEATS:-5}
  sweep_steps=${GPU_CHECK_SWEEP_STEPS:-2000}
fi
test_budget=${GPU_CHECK_TEST_BUDGET:-90}
bench_budget=${GPU_CHECK_BENCH_BUDGET:-70}

# ---- 3. solver tests on the device ------------------------------------------------------------
# one process (-n 0): several would each take most of the GPU's memory; of tests/test_parallel.py
# only the in-process checks (its other tests force CPU devices in subprocesses)
# hypothesis's plugin is off: on the GPU image its import in the terminal summary outlasted the
# battery's timeout once (2026-11-27), after every test had passed
pytest_args=(-n 0 -p no:cacheprovider -p no:hypothesispytest --timeout 120)
step "tests: solver contract" "$test_budget" $python -m pytest "${pytest_args[@]}" \
  tests/test_solver_contract.py
step "tests: device arguments" 45 $python -m pytest "${pytest_args[@]}" tests/test_parallel.py \
  -k "devices_must or exclusive or mesh_must or no_mesh or more_devices"

# ---- 4. per-step benchmarks (docs/performance.md) ---------------------------------------------
say "benchmarks on: $device (steps $steps, repeats $repeats)"
step "bench: quadratic, solver/floor and 10 seeds/1 seed [$device]" "$bench_budget" \
  $python benchmarks/overhead.py --problem quadratic --solvers f2sa stocbio soba \
  --steps "$steps" --repeats "$repeats" --e2e-repeats 1
step "bench: data cleaning, solver/floor [$device]" "$bench_budget" \
  $python benchmarks/overhead.py --problem cleaning --sampling window --floor-only \
  --solvers f2sa stocbio --steps "$steps" --repeats "$repeats"
step "bench: sweep against a loop of solves [$device]" "$bench_budget" \
  $python benchmarks/sweep.py --steps "$sweep_steps"

# ---- 5. the solver battery, in the time left --------------------------------------------------
step "tests: solver battery" "$((3 * test_budget))" $python -m pytest "${pytest_args[@]}" \
  tests/test_solvers_battery.py

finish

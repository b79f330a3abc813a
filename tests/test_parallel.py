"""Data parallelism: ``bl.solve(devices=k)`` / ``mesh=`` (core/sharding.py, docs/distributed.md).

A sharded run splits every minibatch over the devices and lets XLA all-reduce the batch means,
so it must reproduce the one-device run up to floating-point summation order. Several devices
on a CPU need ``XLA_FLAGS=--xla_force_host_platform_device_count=k`` before jax is imported,
and several processes need ``jax.distributed``: both run in subprocesses with their own env.

Tolerance (both subprocess tests, float64): rtol 1e-10, atol 1e-12. Splitting a batch mean
into per-device partial sums changes only the rounding of each sum (relative 1e-16 per
addition, a few additions per sample); over the ~20 short steps run here the iterates stay
within ~1e-14 (measured: <= 3e-15 on every case), while any real error -- a sample missing or
counted twice, a shard's gradient not reduced -- moves them by O(1 / batch_size) = 1e-1.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

import bilevel as bl
from bilevel.core import sharding as parallel

RTOL, ATOL = 1e-10, 1e-12

# ---- 4 forced host devices in one process ---------------------------------------------------
FOUR_DEVICES = textwrap.dedent("""
    import json
    import tempfile
    import jax
    import numpy as np
    from jax.sharding import Mesh
    jax.config.update("jax_enable_x64", True)
    import bilevel as bl
    from bilevel.drivers import programs

    assert len(jax.devices()) == 4, jax.devices()
    rng = np.random.default_rng(0)
    n, m, d, C = 64, 32, 8, 3
    quad = bl.problems.quadratic(dx=4, dy=6, stochastic=True, n_samples=64)
    clean = bl.problems.hyper_cleaning(      # pytree data: {"X", "y", "index"} and {"X", "y"}
        rng.standard_normal((n, d)), rng.integers(0, C, n),
        rng.standard_normal((m, d)), rng.integers(0, C, m), num_classes=C)
    grid = Mesh(np.array(jax.devices()).reshape(2, 2), ("a", "b"))
    F2SA = dict(lr_outer=0.05, lr_inner=0.1, batch_size=16, inner_steps=2)
    STOCBIO = dict(lr_outer=0.05, lr_inner=0.1, batch_size=16, neumann_steps=3)
    SOBA = dict(lr_outer=0.05, lr_inner=0.1, batch_size=16)
    STABLE = dict(lr_outer=0.05, lr_inner=0.1, batch_size=16)
    PZOBO_S = dict(lr_outer=0.05, lr_inner=0.1, batch_size=16, inner_steps=3, num_directions=2)
    CASES = {   # name: problem, solver, solver settings, seeds, sharding
        "quadratic-f2sa": (quad, "f2sa", F2SA, [0, 1], {"devices": 4}),
        "quadratic-stocbio-mesh2x2": (quad, "stocbio", STOCBIO, None, {"mesh": grid}),
        "cleaning-soba": (clean, "soba", SOBA, [0, 1], {"devices": 4}),
        # STABLE's projection branches on a Cholesky certificate (a custom_vmap over seeds);
        # PZOBO-S runs its Q + 1 paths in one scan on each shared batch
        "quadratic-stable": (quad, "stable", STABLE, [0, 1], {"devices": 4}),
        "quadratic-pzobo-s": (quad, "pzobo-s", PZOBO_S, [0, 1], {"devices": 4}),
        # minibatches in parts (BilevelProblem(batch_chunks=2)): each part split over the mesh
        "cleaning-f2sa-parts": (
            clean.replace(batch_chunks=2, sampling="window"), "f2sa", F2SA, [0, 1],
            {"devices": 4}),
    }

    def arrays(res):
        hist = res.history.drop(columns="seconds")
        return [np.asarray(a).tolist() for a in [*jax.tree.leaves((res.x, res.y)), hist]]

    def all_reduces():
        chunks = [v for _, v in programs.cached_programs("chunk")]
        return [v.as_text().count("all-reduce") for v in chunks]

    out = {}
    for name, (problem, solver, kw, seeds, sharding) in CASES.items():
        solver = bl.solvers.make(solver, **kw)
        args = dict(steps=20, eval_every=10, seeds=seeds, progress=False)
        programs.clear_cache()
        one = bl.solve(problem, solver, **args)
        plain = all_reduces()
        programs.clear_cache()
        many = bl.solve(problem, solver, **args, **sharding)
        out[name] = dict(one=arrays(one), many=arrays(many), plain=plain, sharded=all_reduces(),
                         replicated=bool(many.x.sharding.is_fully_replicated))
    # a sharded run resumed from its checkpoint (step 10 of 20) ends as the uninterrupted one
    ckpt = tempfile.mkdtemp()
    args = dict(eval_every=10, seeds=[0, 1], progress=False, devices=4, checkpoint=ckpt)
    bl.solve(quad, bl.solvers.make("f2sa", **F2SA), 10, **args)
    out["resumed"] = arrays(bl.solve(quad, bl.solvers.make("f2sa", **F2SA), 20, **args))
    try:
        bl.solve(quad, bl.solvers.make("f2sa", batch_size=6), 2, devices=4, progress=False)
    except ValueError as err:
        out["indivisible"] = str(err)
    # bl.sweep(devices=4): the grid's points split over the devices (6 points padded to 8)
    SWEEP = dict(steps=20, eval_every=10, seeds=[0, 1], progress=False, batch_size=16)
    GRIDS = {
        "f2sa": {"lr_outer": [0.01, 0.05, 0.1], "lr_inner": [0.05, 0.1]},
        "stable": {"lr_outer": [0.01, 0.05, 0.1]},
    }
    for name, grid in GRIDS.items():
        frames = []
        for devices in (None, 4):
            programs.clear_cache()
            df = bl.sweep(quad, name, grid, devices=devices, **SWEEP).drop(columns="seconds")
            frames.append(df.to_numpy(float).tolist())
        chunk = next(v for _, v in programs.cached_programs("chunk"))
        specs = sorted({str(s.spec) for s in jax.tree.leaves(chunk.input_shardings)})
        out["sweep-" + name] = dict(one=frames[0], many=frames[1], specs=specs)
    print("RESULT" + json.dumps(out))
""")


def _run_child(script: str, env_extra: dict, timeout: float = 300) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu", **env_extra)
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


@pytest.fixture(scope="module")
def four_devices() -> dict:
    flags = "--xla_force_host_platform_device_count=4 --xla_cpu_multi_thread_eigen=false"
    # most XLA optimisations off: the child's time is compiling its ~40 programs, and one-device
    # and four-device runs are compared within it, under the same flags (95 -> 66 CPU-s)
    fast = {"JAX_DISABLE_MOST_OPTIMIZATIONS": "1"}
    return _run_child(FOUR_DEVICES, {"XLA_FLAGS": flags, **fast})


CASES = [
    "quadratic-f2sa",
    "quadratic-stocbio-mesh2x2",
    "cleaning-soba",
    "quadratic-stable",
    "quadratic-pzobo-s",
    "cleaning-f2sa-parts",
]


@pytest.mark.parametrize("case", CASES)
def test_sharded_run_matches_one_device(four_devices, case):
    """x, y (every leaf) and every history column but ``seconds`` agree on 4 devices and 1."""
    got = four_devices[case]
    assert len(got["one"]) == len(got["many"]) >= 3
    for one, many in zip(got["one"], got["many"], strict=True):
        np.testing.assert_allclose(np.array(many), np.array(one), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("case", CASES)
def test_sharded_program_is_partitioned(four_devices, case):
    """The compiled chunk all-reduces (each device holds a part of every minibatch), the
    unsharded one does not, and the iterates come back replicated. Without the sharding
    constraint in ``sampling._gather`` XLA keeps everything replicated and this fails."""
    got = four_devices[case]
    assert got["sharded"] and all(n > 0 for n in got["sharded"])
    assert got["plain"] and all(n == 0 for n in got["plain"])
    assert got["replicated"]


def test_sharded_run_resumes_from_its_checkpoint(four_devices):
    """The loaded state is placed back on the mesh: the resumed run is bit-identical."""
    whole = four_devices["quadratic-f2sa"]["many"]
    for got, want in zip(four_devices["resumed"], whole, strict=True):
        np.testing.assert_array_equal(np.array(got), np.array(want))


@pytest.mark.parametrize("solver", ["f2sa", "stable"])
def test_sweep_split_over_devices_matches_one_device(four_devices, solver):
    """``bl.sweep(devices=4)``: every row (6 grid points x 2 seeds x 3 evaluations; the 2
    points padded to reach 8 dropped) is the one-device sweep's, and the chunk program takes its
    state split over the devices (``P('data')``), the shared PRNG key replicated (``P()``)."""
    got = four_devices["sweep-" + solver]
    assert len(got["one"]) == len(got["many"]) == 3 * 2 * {"f2sa": 6, "stable": 3}[solver]
    np.testing.assert_allclose(np.array(got["many"]), np.array(got["one"]), rtol=RTOL, atol=ATOL)
    assert set(got["specs"]) == {"P()", "P('data',)"}


def test_batch_size_must_split_over_the_devices(four_devices):
    msg = four_devices["indivisible"]
    assert "batch_size=6" in msg and "multiple of 4" in msg


# ---- argument checks (no devices needed) ----------------------------------------------------
@pytest.fixture(scope="module")
def small():
    problem = bl.problems.quadratic(dx=2, dy=3, stochastic=True, n_samples=16)
    return problem, bl.solvers.make("f2sa", batch_size=4)


def test_more_devices_than_jax_sees_names_the_flag(small):
    k = len(jax.devices()) + 1
    with pytest.raises(ValueError, match=f"xla_force_host_platform_device_count={k}"):
        bl.solve(*small, 1, devices=k, progress=False)


@pytest.mark.parametrize("devices", [0, -1, 2.0, True, "4"])
def test_devices_must_be_a_positive_int(small, devices):
    with pytest.raises(ValueError, match=r"solve\(devices=...\) must be a positive int"):
        bl.solve(*small, 1, devices=devices, progress=False)


def test_devices_and_mesh_are_exclusive(small):
    mesh = Mesh(np.array(jax.devices()[:1]), ("data",))
    with pytest.raises(ValueError, match="devices= or mesh=, not both"):
        bl.solve(*small, 1, devices=1, mesh=mesh, progress=False)


def test_mesh_must_be_a_mesh(small):
    with pytest.raises(ValueError, match=r"mesh=...\) must be a jax.sharding.Mesh"):
        bl.solve(*small, 1, mesh=jax.devices(), progress=False)


def test_no_mesh_leaves_batches_alone():
    batch = {"X": np.ones((3, 2))}
    assert parallel.current_mesh() is None
    assert parallel.shard_batch(batch) is batch


# ---- two processes under jax.distributed ----------------------------------------------------
WORKER = textwrap.dedent("""
    import sys
    import jax
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    process_id, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2,
                               process_id=process_id, initialization_timeout=60)
    import numpy as np
    import bilevel as bl

    problem = bl.problems.quadratic(dx=4, dy=6, stochastic=True, n_samples=64)
    solver = bl.solvers.make("stocbio", lr_outer=0.05, lr_inner=0.1, batch_size=8,
                             neumann_steps=3)
    assert len(jax.devices()) == 2 and len(jax.local_devices()) == 1
    res = bl.solve(problem, solver, 10, eval_every=5, seeds=[0, 1], devices=2,
                   checkpoint=out + "/ckpt", checkpoint_interval=0)
    np.savez(f"{out}/process{process_id}.npz", x=res.x, y=res.y,
             history=res.history.drop(columns="seconds").to_numpy(float))
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _two_processes(tmp_path, timeout: float = 180) -> list[str]:
    """Run WORKER as processes 0 and 1; their stderr. Fails with both stderr tails when one
    fails or the pair outlives ``timeout`` (a lost peer leaves the other waiting)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_cpu_multi_thread_eigen=false")
    port = str(_free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(i), port, str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in (0, 1)
    ]
    errs = []
    try:
        for proc in procs:
            errs.append(proc.communicate(timeout=timeout)[1])
    except subprocess.TimeoutExpired:
        pass
    finally:
        for proc in procs:
            proc.kill()
    tails = "\n".join(f"--- process {i}:\n{e[-2000:]}" for i, e in enumerate(errs))
    assert len(errs) == 2, f"the two processes did not finish in {timeout} s\n{tails}"
    assert all(p.returncode == 0 for p in procs), tails
    return errs


def test_two_processes_match_one(tmp_path):
    """Two processes (one CPU device each, gloo collectives over localhost) run one sharded
    solve; both hold the one-process result. Only process 0 shows progress and checkpoints."""
    errs = _two_processes(tmp_path)
    problem = bl.problems.quadratic(dx=4, dy=6, stochastic=True, n_samples=64)
    solver = bl.solvers.make("stocbio", lr_outer=0.05, lr_inner=0.1, batch_size=8, neumann_steps=3)
    ref = bl.solve(problem, solver, 10, eval_every=5, seeds=[0, 1], progress=False)
    want = [ref.x, ref.y, ref.history.drop(columns="seconds").to_numpy(float)]
    for i in (0, 1):
        with np.load(tmp_path / f"process{i}.npz") as got:
            for name, w in zip(("x", "y", "history"), want, strict=True):
                np.testing.assert_allclose(got[name], np.asarray(w), rtol=RTOL, atol=ATOL)
    assert "step 10/10" in errs[0] and "step 10/10" not in errs[1]
    assert (tmp_path / "ckpt" / "checkpoint.npz").exists()

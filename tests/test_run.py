"""The driver: history, accounting, checkpoints (SIGKILL and resume), divergence, progress."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

import bilevel as bl
from bilevel.drivers.checkpoints import CHECKPOINT_FILE as _CHECKPOINT_FILE


@pytest.fixture(scope="module")
def quad_sto():
    return bl.problems.quadratic(dx=4, dy=6, stochastic=True, n_samples=200)


def test_history_columns_and_accounting(quad_sto):
    solver = bl.solvers.make(
        "stocbio", lr_outer=0.02, lr_inner=0.1, batch_size=8, inner_steps=3, neumann_steps=2
    )
    res = bl.solve(quad_sto, solver, steps=25, eval_every=10, progress=False)
    h = res.history
    assert list(h.step) == [0, 10, 20, 25]  # a last, shorter chunk
    for col in (
        "seed",
        "step",
        "samples",
        "samples_outer",
        "samples_inner",
        "oracle_calls",
        "grad_f",
        "grad_g",
        "hvp",
        "cross",
        "seconds",
        "grad_norm",
        "x_err",
        "y_err",
        "F_gap",
        "outer_loss",
        "inner_grad_norm",
    ):
        assert col in h.columns, col
    last = h.iloc[-1]
    # per step: D + Q + 1 inner draws and 1 outer draw of 8 samples; D + 1 + Q + 1 calls
    assert last.samples_inner == 25 * 8 * (3 + 2 + 1)
    assert last.samples_outer == 25 * 8
    assert last.samples == last.samples_inner + last.samples_outer
    assert last.oracle_calls == 25 * (3 + 1 + 2 + 1)
    assert (np.diff(h.seconds) >= 0).all() and h.seconds.iloc[0] == 0
    assert res.ok and res.steps == 25 and "completed 25 steps" in res.message


def test_same_seed_same_bits(quad_sto):
    solver = bl.solvers.make("f2sa", lr_outer=0.02, lr_inner=0.1, batch_size=8, inner_steps=2)
    a = bl.solve(quad_sto, solver, steps=40, seed=7, eval_every=20, progress=False)
    b = bl.solve(quad_sto, solver, steps=40, seed=7, eval_every=13, progress=False)
    np.testing.assert_array_equal(np.asarray(a.x), np.asarray(b.x))  # chunking is invisible
    c = bl.solve(quad_sto, solver, steps=40, seed=8, eval_every=20, progress=False)
    assert not np.array_equal(np.asarray(a.x), np.asarray(c.x))


def test_progress_bar_runs(quad_sto, capsys):
    solver = bl.solvers.make("f2sa", lr_outer=0.02, lr_inner=0.1, batch_size=8, inner_steps=2)
    res = bl.solve(quad_sto, solver, steps=20, eval_every=10, progress=True)
    assert res.ok


def test_checkpoint_resume_and_mismatch(quad_sto, tmp_path):
    solver = bl.solvers.make("f2sa", lr_outer=0.02, lr_inner=0.1, batch_size=8, inner_steps=2)
    full = bl.solve(quad_sto, solver, steps=60, seeds=[0, 1], eval_every=10, progress=False)
    part = bl.solve(
        quad_sto,
        solver,
        steps=30,
        seeds=[0, 1],
        eval_every=10,
        progress=False,
        checkpoint=tmp_path,
        checkpoint_interval=0,
    )
    assert part.steps == 30 and (tmp_path / _CHECKPOINT_FILE).exists()
    resumed = bl.solve(
        quad_sto,
        solver,
        steps=60,
        seeds=[0, 1],
        eval_every=10,
        progress=False,
        checkpoint=tmp_path,
        checkpoint_interval=0,
    )
    np.testing.assert_array_equal(np.asarray(resumed.x), np.asarray(full.x))
    assert list(resumed.history.step.unique()) == [0, 10, 20, 30, 40, 50, 60]
    np.testing.assert_array_equal(resumed.history.grad_norm, full.history.grad_norm)
    np.testing.assert_array_equal(resumed.history.oracle_calls, full.history.oracle_calls)
    other = bl.solvers.make("f2sa", lr_outer=0.03, lr_inner=0.1, batch_size=8, inner_steps=2)
    with pytest.raises(ValueError, match="written by a different run"):
        bl.solve(
            quad_sto,
            other,
            steps=60,
            seeds=[0, 1],
            eval_every=10,
            progress=False,
            checkpoint=tmp_path,
        )
    with pytest.raises(ValueError, match="beyond steps=20"):
        bl.solve(
            quad_sto,
            solver,
            steps=20,
            seeds=[0, 1],
            eval_every=10,
            progress=False,
            checkpoint=tmp_path,
        )
    # the checkpoint is plain npz: loads with allow_pickle=False
    with np.load(tmp_path / _CHECKPOINT_FILE, allow_pickle=False) as npz:
        assert json.loads(str(npz["meta"]))["step"] == 60


CHILD = textwrap.dedent("""
    import sys, time
    import jax
    jax.config.update("jax_enable_x64", True)
    import bilevel as bl
    import bilevel.drivers.checkpoints as checkpoints

    save = checkpoints.save_checkpoint
    def slow_save(*args, **kwargs):   # slow the run down so the parent can kill it mid-way
        save(*args, **kwargs)
        time.sleep(0.15)
    checkpoints.save_checkpoint = slow_save

    p = bl.problems.quadratic(dx=4, dy=6, stochastic=True, n_samples=200)
    solver = bl.solvers.make("f2sa", lr_outer=0.02, lr_inner=0.1, batch_size=8, inner_steps=2)
    bl.solve(p, solver, steps=3000, seeds=[0, 1, 2], eval_every=50, progress=False,
             checkpoint=sys.argv[1], checkpoint_interval=0)
    print("FINISHED")
""")


def test_sigkill_then_resume_is_bit_identical(quad_sto, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    ckpt = tmp_path / "ckpt"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(ckpt)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.time() + 120
    step = 0
    try:
        while time.time() < deadline and proc.poll() is None:
            if (ckpt / _CHECKPOINT_FILE).exists():
                try:
                    with np.load(ckpt / _CHECKPOINT_FILE, allow_pickle=False) as npz:
                        step = json.loads(str(npz["meta"]))["step"]
                except (OSError, ValueError, KeyError):
                    step = 0
                if step >= 300:
                    break
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        out, err = proc.communicate(timeout=60)
    assert b"FINISHED" not in out, "the child finished before it could be killed"
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    assert 300 <= step < 3000
    solver = bl.solvers.make("f2sa", lr_outer=0.02, lr_inner=0.1, batch_size=8, inner_steps=2)
    resumed = bl.solve(
        quad_sto,
        solver,
        steps=3000,
        seeds=[0, 1, 2],
        eval_every=50,
        progress=False,
        checkpoint=ckpt,
        checkpoint_interval=0,
    )
    straight = bl.solve(
        quad_sto, solver, steps=3000, seeds=[0, 1, 2], eval_every=50, progress=False
    )
    for a, b in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(straight.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert list(resumed.history.step) == list(straight.history.step)


def test_counter_totals_survive_int32_wraparound(quad_sto):
    """Counters are int32 in the state; the driver adds deltas mod 2^32 in Python ints."""
    solver = bl.solvers.make(
        "stocbio", lr_outer=0.02, lr_inner=0.1, batch_size=8, inner_steps=1, neumann_steps=1
    )
    state = jax.jit(solver.init)(quad_sto, jax.random.PRNGKey(0))
    big = state.counts._replace(samples_inner=np.int32(2**31 - 10))
    from bilevel.drivers import programs

    raw = programs.BUILDERS["eval"](programs.ProgramSpec("eval"))

    def evaluate(problem, state):
        return raw(solver, problem, state)

    _, _, c1, _ = evaluate(quad_sto, state._replace(counts=big))
    stepped = jax.jit(solver.step)(quad_sto, state._replace(counts=big))
    _, _, c2, _ = evaluate(quad_sto, stepped)
    delta = (
        int(np.int64(c2.samples_inner) & 0xFFFFFFFF) - int(np.int64(c1.samples_inner) & 0xFFFFFFFF)
    ) % (1 << 32)
    assert int(c2.samples_inner) < 0  # it did wrap
    assert delta == 8 * 3  # D + Q + 1 = 3 inner draws of 8


def test_random_initialisation_per_seed(quad_sto):
    import jax.numpy as jnp

    solver = bl.solvers.make("f2sa", lr_outer=0.02, lr_inner=0.1, batch_size=8, inner_steps=2)

    def init(key):
        kx, ky = jax.random.split(key)
        return jax.random.normal(kx, (4,)), jax.random.normal(ky, (6,))

    res = bl.solve(
        quad_sto, solver, steps=1, seeds=[0, 1, 2], eval_every=1, progress=False, init=init
    )
    start = res.history[res.history.step == 0].x_err.to_numpy()
    assert len(set(np.round(start, 12))) == 3  # three different random starts
    same = bl.solve(
        quad_sto,
        solver,
        steps=10,
        seeds=[0, 1],
        eval_every=5,
        progress=False,
        init=lambda key: (jnp.zeros(4), jnp.zeros(6)),
    )
    plain = bl.solve(quad_sto, solver, steps=10, seeds=[0, 1], eval_every=5, progress=False)
    np.testing.assert_array_equal(np.asarray(same.x), np.asarray(plain.x))


def test_the_compiled_program_cache_is_bounded(monkeypatch):
    """At most MAX_COMPILED programs stay alive (each holds memory mappings; an unbounded
    cache crashed a long process inside LLVM), least recently used dropped first."""
    from bilevel.drivers import programs

    monkeypatch.setattr(programs, "MAX_COMPILED", 3)
    programs.clear_cache()
    problem = bl.problems.quadratic(dx=2, dy=3)
    for steps in (1, 2, 3):  # chunk lengths 1, 2, 3: three chunk programs, plus init, eval and
        solver = bl.solvers.make("f2sa", lr_outer=0.01, lr_inner=0.1)  # the problem's metrics
        bl.solve(problem, solver, steps=steps, eval_every=steps, progress=False)
    assert len(programs.cached_programs()) == 3
    kinds_lengths = [(spec.kind, spec.length) for spec, _ in programs.cached_programs()]
    assert sorted(kinds_lengths) == [("chunk", 3), ("eval", 0), ("metrics", 0)]  # the last used


def test_a_checkpoint_of_another_problem_instance_is_not_resumed(tmp_path):
    """Two instances that differ only in constants their functions close over (the quadratic's
    matrices, by seed) have the same name and data-free leaves: the checkpoint fingerprint
    must still tell them apart (it used to hash only the functions' code)."""
    solver = bl.solvers.make("f2sa", lr_outer=0.05, lr_inner=0.1)
    run = dict(steps=4, eval_every=2, progress=False, checkpoint=tmp_path, checkpoint_interval=0)
    bl.solve(bl.problems.quadratic(dx=2, dy=3, seed=0), solver, **run)
    with pytest.raises(ValueError, match="written by a different run"):
        bl.solve(bl.problems.quadratic(dx=2, dy=3, seed=1), solver, **run)


def test_time_limit_stops_at_the_first_evaluation_past_it(quad_sto):
    """Timing-free: any chunk takes more than 1e-9 s, so the run stops after the first one;
    no limit reached runs every step. The result says why it stopped and keeps what it did."""
    solver = bl.solvers.make("stocbio", lr_outer=0.05, batch_size=8)
    res = bl.solve(quad_sto, solver, 300, eval_every=100, progress=False, time_limit=1e-9)
    assert res.steps == 100 and res.history.step.tolist() == [0, 100]
    assert res.ok and "time limit" in res.message
    full = bl.solve(quad_sto, solver, 300, eval_every=100, progress=False, time_limit=1e9)
    assert full.steps == 300 and "completed" in full.message
    np.testing.assert_array_equal(full.history.step, [0, 100, 200, 300])
    with pytest.raises(ValueError, match="time_limit"):
        bl.solve(quad_sto, solver, 300, progress=False, time_limit=0)

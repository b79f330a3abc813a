"""Reliability of runs (issue #37): a run directory owned by one process (the lock file),
leftovers of killed checkpoint writes removed, checkpoints verified by their content hash and
refused in one line when corrupt, ``--checkpoint-every``, and the numerics in the signature."""

import json
import os
import signal
import socket
import subprocess
import time

import jax
import numpy as np
import pytest
import typer
from typer.testing import CliRunner

import bilevel as bl
import bilevel.drivers.solve as driver
from bilevel.cli import app
from bilevel.drivers import checkpoint_integrity as integrity
from bilevel.drivers import engine
from bilevel.drivers.checkpoints import CHECKPOINT_FILE, TEMP_PREFIX
from bilevel.drivers.run_lock import LOCK_FILE, DirectoryInUse, RunLock

runner = CliRunner()

SOLVER = dict(lr_outer=0.05, lr_inner=0.1)
RUN = dict(steps=4, seeds=[0, 1], eval_every=2, progress=False, checkpoint_interval=0)
CLI_RUN = ["run", "--problem", "quadratic", "--problem-opt", "dx=2", "--problem-opt", "dy=3"]
CLI_RUN += ["--steps", "4", "--eval-every", "2", "--no-progress"]


@pytest.fixture(scope="module")
def quad():
    return bl.problems.quadratic(dx=2, dy=3)


@pytest.fixture
def solver():
    return bl.solvers.make("f2sa", **SOLVER)


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _write_lock(directory, pid, host=None, started=None, boot=None):
    directory.mkdir(parents=True, exist_ok=True)
    owner = dict(
        pid=pid,
        host=host or socket.gethostname(),
        started=time.time() if started is None else started,
        boot=_boot_id() if boot is None else boot,
        token="abcd",
    )
    (directory / LOCK_FILE).write_text(json.dumps(owner))


@pytest.fixture
def live_pid():
    """The pid of a live process that is not this one (a ``sleep``)."""
    proc = subprocess.Popen(["sleep", "60"])
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.fixture
def dead_pid():
    """A pid that ran a moment ago and is gone (reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


# ---- the lock -----------------------------------------------------------------------------------
def test_a_directory_held_by_a_live_process_is_refused(quad, solver, tmp_path, live_pid):
    _write_lock(tmp_path, live_pid)
    with pytest.raises(DirectoryInUse) as info:
        bl.solve(quad, solver, **RUN, checkpoint=tmp_path)
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(f"{tmp_path} is in use by pid {live_pid} on {socket.gethostname()} (")
    assert text.endswith("); wait for it or use another checkpoint directory.")
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == live_pid  # left alone


def test_the_command_refuses_an_out_in_use_in_one_line(tmp_path, live_pid):
    _write_lock(tmp_path, live_pid)
    out = runner.invoke(app, [*CLI_RUN, "--out", str(tmp_path)])
    assert out.exit_code == 2, out.output
    host = socket.gethostname()
    line = f"error: {tmp_path} is in use by pid {live_pid} on {host} (started "
    assert out.output.startswith(line), out.output
    assert out.output.rstrip().endswith("); wait for it or use another --out.")
    assert len(out.output.strip().splitlines()) == 1 and "Traceback" not in out.output
    assert not (tmp_path / "history.csv").exists()


def test_a_stale_lock_is_taken_over_with_a_line(quad, solver, tmp_path, dead_pid, capsys):
    _write_lock(tmp_path, dead_pid)
    res = bl.solve(quad, solver, **(RUN | {"progress": True}), checkpoint=tmp_path)
    assert res.steps == 4
    err = capsys.readouterr().err
    assert f"{tmp_path}: took over the lock of pid {dead_pid} on {socket.gethostname()}" in err
    assert f"(pid {dead_pid} is not running)" in err
    assert not (tmp_path / LOCK_FILE).exists()  # and released at the end


def test_the_command_takes_over_a_stale_lock_and_releases_its_own(tmp_path, dead_pid):
    _write_lock(tmp_path, dead_pid)
    out = runner.invoke(app, [*CLI_RUN, "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert f"took over the lock of pid {dead_pid}" in out.stderr
    assert not (tmp_path / LOCK_FILE).exists()
    assert not (tmp_path / "checkpoint" / LOCK_FILE).exists()
    assert (tmp_path / "checkpoint" / CHECKPOINT_FILE).exists()


def test_locks_after_a_reboot_of_a_reused_pid_or_unreadable_are_stale(tmp_path, live_pid):
    lines = []
    _write_lock(tmp_path, live_pid, boot="another-boot")
    with RunLock(tmp_path, "--out", log=lines.append):
        pass
    assert lines[-1].endswith(f"({socket.gethostname()} has rebooted since)")
    (tmp_path / LOCK_FILE).write_text("{half a lo")  # its writer died amid the write
    with RunLock(tmp_path, "--out", log=lines.append):
        pass
    assert lines[-1].endswith("(the lock file is unreadable)")
    if os.path.exists(f"/proc/{live_pid}/stat"):  # Linux: the process started after the lock
        _write_lock(tmp_path, live_pid, started=time.time() - 86_400)
        with RunLock(tmp_path, "--out", log=lines.append):
            pass
        assert f"pid {live_pid} now belongs to a process started after the lock" in lines[-1]
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_lock_of_another_host_is_never_taken_over(tmp_path, dead_pid):
    _write_lock(tmp_path, dead_pid, host="elsewhere.example")
    with pytest.raises(DirectoryInUse, match=rf"in use by pid {dead_pid} on elsewhere.example"):
        RunLock(tmp_path, "--out").acquire()
    hint = r"; wait for it or use another --out \(if that run is gone, delete .*bilevel\.lock\)\.$"
    with pytest.raises(DirectoryInUse, match=hint):
        RunLock(tmp_path, "--out").acquire()
    assert (tmp_path / LOCK_FILE).exists()


def test_two_runs_of_one_process_on_one_directory(tmp_path):
    with RunLock(tmp_path, "--out"):
        with pytest.raises(DirectoryInUse, match=rf"in use by pid {os.getpid()} "):
            RunLock(tmp_path, "--out").acquire()
        assert (tmp_path / LOCK_FILE).exists()  # the refused one leaves the holder's lock
    assert not (tmp_path / LOCK_FILE).exists()


def test_the_lock_is_released_after_an_exception_and_an_interrupt(
    quad, solver, tmp_path, monkeypatch
):
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with monkeypatch.context() as patch:
            evaluate = engine.Engine.evaluate

            def interrupted(self, state, at):
                if at == 2:
                    os.kill(os.getpid(), signal.SIGINT)
                return evaluate(self, state, at)

            patch.setattr(engine.Engine, "evaluate", interrupted)
            with pytest.raises(bl.Interrupted):
                bl.solve(quad, solver, **RUN, checkpoint=tmp_path)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not (tmp_path / LOCK_FILE).exists()
    with pytest.raises(ValueError, match="written by a different run"):
        bl.solve(quad, bl.solvers.make("f2sa", lr_outer=0.01), **RUN, checkpoint=tmp_path)
    assert not (tmp_path / LOCK_FILE).exists()


# ---- leftovers of a killed write ----------------------------------------------------------------
def test_leftover_temp_files_of_a_killed_write_are_removed(quad, solver, tmp_path):
    leftover = tmp_path / f"{TEMP_PREFIX}k1ll3d_x.npz"  # tempfile.mkstemp's 8 characters
    leftover.write_bytes(b"PK\x03\x04 half a checkpoint")
    others = [tmp_path / f"{TEMP_PREFIX}notes.txt", tmp_path / "mine.npz"]
    for path in others:
        path.write_text("not the writer's")
    bl.solve(quad, solver, **RUN, checkpoint=tmp_path)
    assert not leftover.exists()
    assert all(path.exists() for path in others)  # only the writer's own pattern


# ---- verified checkpoints -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def good_checkpoint(quad, tmp_path_factory):
    """A checkpoint at step 4 (two seeds), and the leaf indices of x and of k."""
    where = tmp_path_factory.mktemp("good")
    res = bl.solve(quad, bl.solvers.make("f2sa", **SOLVER), **RUN, checkpoint=where)
    names = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(res.state)[0]]
    return (where / CHECKPOINT_FILE).read_bytes(), names.index(".x"), names.index(".k")


def _entries(path):
    with np.load(path, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


def _rewrite(path, edit, rehash: bool):
    """Apply ``edit`` to the checkpoint's entries (``meta`` and ``history`` as Python objects)
    and write it back, with its hash recomputed (``rehash``) or the old one kept."""
    arrays = _entries(path)
    arrays["meta"] = json.loads(str(arrays["meta"]))
    arrays["history"] = json.loads(str(arrays["history"]))
    edit(arrays)
    meta_json, history_json = json.dumps(arrays["meta"]), json.dumps(arrays["history"])
    arrays["meta"], arrays["history"] = np.array(meta_json), np.array(history_json)
    if rehash:
        leaves = [arrays[f"leaf_{i}"] for i in range(sum(k.startswith("leaf_") for k in arrays))]
        arrays["digest"] = np.array(integrity.content_digest(leaves, meta_json, history_json))
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def _set(key, index, value):
    def edit(arrays):
        arrays[key] = arrays[key].copy()
        arrays[key][index] = value

    return edit


def _corruptions(x, k):
    """(name, how to damage the file, the reason the refusal names)."""
    hash_differs = "its content does not match its hash: edited or damaged"
    return {
        "empty": (lambda p: p.write_bytes(b""), "the file is empty"),
        "random bytes": (
            lambda p: p.write_bytes(np.random.default_rng(0).bytes(4096)),
            "not a .npz archive",
        ),
        "truncated": (
            lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
            "truncated or damaged: BadZipFile",
        ),
        "edited x": (lambda p: _rewrite(p, _set(f"leaf_{x}", (0, 0), 1.5), False), hash_differs),
        "edited step": (
            lambda p: _rewrite(p, lambda a: a["meta"].update(step=2), False),
            hash_differs,
        ),
        "step vs state, rehashed": (
            lambda p: _rewrite(p, lambda a: a["meta"].update(step=2), True),
            "its step 2 disagrees with the state's iteration count [4, 4]",
        ),
        "step vs history, rehashed": (
            lambda p: _rewrite(
                p, lambda a: a.update(history=[r for r in a["history"] if r["step"] < 4]), True
            ),
            "its step 4 disagrees with the history, which ends at step 2",
        ),
        "k vs step, rehashed": (
            lambda p: _rewrite(p, _set(f"leaf_{k}", 1, 3), True),
            "its step 4 disagrees with the state's iteration count [4, 3]",
        ),
        "NaN in x": (lambda p: _rewrite(p, _set(f"leaf_{x}", (1, 0), np.nan), False), hash_differs),
        "NaN in x, rehashed": (
            lambda p: _rewrite(p, _set(f"leaf_{x}", (1, 0), np.nan), True),
            "NaN or inf in the state (.x)",
        ),
    }


CORRUPTIONS = list(_corruptions(0, 0))


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_a_corrupt_checkpoint_is_refused_in_one_line(quad, solver, tmp_path, good_checkpoint, name):
    data, x, k = good_checkpoint
    path = tmp_path / CHECKPOINT_FILE
    path.write_bytes(data)
    damage, reason = _corruptions(x, k)[name]
    damage(path)
    with pytest.raises(integrity.CorruptCheckpoint) as info:
        bl.solve(quad, solver, **RUN, checkpoint=tmp_path)
    text = str(info.value)
    assert text.startswith(f"checkpoint {path} is corrupt ({reason}")
    assert text.endswith("); delete it or use another directory") and "\n" not in text
    assert "allow_pickle" not in text and not (tmp_path / LOCK_FILE).exists()


def test_the_good_checkpoint_resumes(quad, solver, tmp_path, good_checkpoint):
    """The control of the corruptions: the same file untouched (and rewritten with its hash
    recomputed and nothing changed) is taken up."""
    (tmp_path / CHECKPOINT_FILE).write_bytes(good_checkpoint[0])
    _rewrite(tmp_path / CHECKPOINT_FILE, lambda a: None, True)
    res = bl.solve(quad, solver, **(RUN | {"steps": 6}), checkpoint=tmp_path)
    assert res.message.startswith("resumed; completed 6 steps")


def test_a_checkpoint_without_a_hash_is_of_an_older_version(
    quad, solver, tmp_path, good_checkpoint
):
    path = tmp_path / CHECKPOINT_FILE
    path.write_bytes(good_checkpoint[0])
    arrays = _entries(path)
    del arrays["digest"]
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.raises(ValueError) as info:
        bl.solve(quad, solver, **RUN, checkpoint=tmp_path)
    assert str(info.value) == (
        f"checkpoint {path} was written by an older version of bilevel (it has no content "
        "hash); delete it to start afresh"
    )


def test_a_write_that_would_be_refused_is_not_made(quad, solver, tmp_path):
    """A state whose iteration count disagrees with the step (a second Ctrl-C amid the
    bookkeeping) is not written over the last good checkpoint."""
    from bilevel.drivers.checkpoints import Checkpointer
    from bilevel.drivers.history import History

    res = bl.solve(quad, solver, **RUN, checkpoint=tmp_path)
    before = (tmp_path / CHECKPOINT_FILE).read_bytes()
    history = History([0, 1])
    history.rows = [{"seed": s, "step": 6} for s in (0, 1)]
    writer = Checkpointer(tmp_path, "sig", interval=0)
    with pytest.warns(RuntimeWarning, match=r"not writing the checkpoint of step 6 \(its step 6"):
        writer.save(res.state, history, step=6, seconds=1.0, force=True)
    assert (tmp_path / CHECKPOINT_FILE).read_bytes() == before


@pytest.fixture(scope="module")
def cli_checkpoint(tmp_path_factory):
    """The checkpoint file of a ``bilevel run`` (CLI_RUN)."""
    where = tmp_path_factory.mktemp("cli")
    first = runner.invoke(app, [*CLI_RUN, "--out", str(where)])
    assert first.exit_code == 0, first.output
    return (where / "checkpoint" / CHECKPOINT_FILE).read_bytes()


@pytest.mark.parametrize("name", ["empty", "truncated", "edited x"])
def test_the_command_prints_a_corrupt_checkpoint_as_one_line(tmp_path, cli_checkpoint, name):
    path = tmp_path / "checkpoint" / CHECKPOINT_FILE
    path.parent.mkdir()
    path.write_bytes(cli_checkpoint)
    damage, reason = _corruptions(0, 0)[name]  # x is the state's first leaf
    damage(path)
    again = runner.invoke(app, [*CLI_RUN, "--out", str(tmp_path)])
    assert again.exit_code == 2, again.output
    assert again.output.startswith(f"error: checkpoint {path} is corrupt ({reason}")
    assert again.output.endswith("); delete it or use another directory\n")
    assert len(again.output.splitlines()) == 1
    assert "Traceback" not in again.output and "Aborted" not in again.output
    assert not (tmp_path / LOCK_FILE).exists()
    assert not (tmp_path / "checkpoint" / LOCK_FILE).exists()


# ---- numerics in the signature ------------------------------------------------------------------
def test_a_checkpoint_of_another_float_width_names_it(quad, solver, tmp_path, monkeypatch):
    now = integrity.numerics()
    assert now["float"] == "float64"  # the tests run with jax_enable_x64
    with monkeypatch.context() as patch:
        patch.setattr(integrity, "numerics", lambda: now | {"float": "float32"})
        bl.solve(quad, solver, **RUN, checkpoint=tmp_path)
    with pytest.raises(ValueError) as info:
        bl.solve(quad, solver, **RUN, checkpoint=tmp_path)
    assert str(info.value).startswith(
        f"the checkpoint in {tmp_path} was written with float32 (jax_enable_x64 off: "
        "JAX_ENABLE_X64 unset); this run uses float64 (jax_enable_x64 on: JAX_ENABLE_X64 set)"
    )


def test_a_checkpoint_of_another_jax_names_it(quad, solver, tmp_path, monkeypatch):
    now = integrity.numerics()
    with monkeypatch.context() as patch:
        patch.setattr(integrity, "numerics", lambda: now | {"jax": "0.0.1"})
        bl.solve(quad, solver, **RUN, checkpoint=tmp_path)
    with pytest.raises(ValueError, match=r"written with JAX 0\.0\.1 \(jaxlib .*this run uses JAX"):
        bl.solve(quad, solver, **RUN, checkpoint=tmp_path)


def test_numerics_follow_jax_enable_x64(quad, solver):
    sig = driver.signature(quad, solver, [0], True, 2)
    jax.config.update("jax_enable_x64", False)
    try:
        assert integrity.numerics()["float"] == "float32"
        assert driver.signature(quad, solver, [0], True, 2) != sig
    finally:
        jax.config.update("jax_enable_x64", True)
    assert integrity.numerics()["jax"] == jax.__version__


# ---- --checkpoint-every -------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_checkpoint_every_must_be_positive(tmp_path, value):
    out = runner.invoke(app, [*CLI_RUN, "--checkpoint-every", value, "--out", str(tmp_path)])
    assert out.exit_code == 2, out.output
    shown = "nan" if value == "nan" else str(float(value))
    assert out.output == (
        f"error: --checkpoint-every must be a positive number of seconds, got {shown}.\n"
    )


def test_checkpoint_every_reaches_the_checkpointer(tmp_path, monkeypatch):
    intervals = []

    class Recording(driver.Checkpointer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            intervals.append(self.interval)

    monkeypatch.setattr(driver, "Checkpointer", Recording)
    out = runner.invoke(app, [*CLI_RUN, "--checkpoint-every", "7.5", "--out", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert intervals == [7.5]
    command = typer.main.get_command(app).commands["run"]  # the help, whatever the width
    flag = next(p for p in command.params if p.name == "checkpoint_every")
    assert flag.opts == ["--checkpoint-every"] and flag.default == 30.0
    assert flag.metavar == "SECONDS" and "every SECONDS (> 0)" in flag.help

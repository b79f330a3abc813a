"""No fault of issue #37 prints a traceback to a ``bilevel`` user: each ends in one line that
names the path or the cause, with a nonzero exit code, and leaves a state the same command
takes up once the fault is gone.

The faults: an ``--out`` locked by another live process; a corrupt checkpoint; an ``OSError``
(ENOSPC) while writing an output or a checkpoint (injected); a read-only ``--out``; a resume
under another float width. Tiny problems, four steps: the file runs in well under a minute.
"""

import errno
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_run_reliability import _corruptions
from typer.testing import CliRunner

import bilevel as bl
import bilevel.experiments.report as report
from bilevel.cli import app
from bilevel.drivers.checkpoints import CHECKPOINT_FILE, TEMP_PREFIX
from bilevel.drivers.run_lock import LOCK_FILE
from bilevel.drivers.writes import WriteError

runner = CliRunner()

RUN = ["run", "--problem", "quadratic", "--problem-opt", "dx=2", "--problem-opt", "dy=3"]
RUN += ["--steps", "4", "--eval-every", "2", "--seeds", "2", "--no-progress"]
EVERY_EVALUATION = ["--checkpoint-every", "1e-6"]  # a checkpoint at steps 2 and 4
NO_SPACE = f"[Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)}"


def _invoke(out: Path, *extra: str):
    return runner.invoke(app, [*RUN, *extra, "--out", str(out)])


def _one_line(result, code: int) -> str:
    """The one line a fault printed (on stderr; nothing else there), after checking that the
    command exited with ``code`` by itself, not by an exception (CliRunner hides tracebacks)."""
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def _steps(out: Path) -> list:
    """The (seed, step) rows of ``out/history.csv``, checked for duplicates."""
    rows = pd.read_csv(out / "history.csv")[["seed", "step"]].values.tolist()
    assert len(rows) == len({tuple(r) for r in rows}), rows
    return sorted(map(tuple, rows))


ALL_STEPS = [(s, k) for s in (0, 1) for k in (0, 2, 4)]


def _checkpoint_step(out: Path) -> int:
    with np.load(out / "checkpoint" / CHECKPOINT_FILE, allow_pickle=False) as npz:
        return json.loads(str(npz["meta"]))["step"]


def _no_partial_files(out: Path) -> None:
    left = [p.name for p in out.rglob("*") if p.name.startswith((TEMP_PREFIX, "."))]
    assert not left and not (out / LOCK_FILE).exists(), left


def _no_space(path) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


@pytest.fixture(autouse=True)
def _quick_figures(monkeypatch):
    """A stand-in for the figure (matplotlib takes most of a four-step run; test_cli.py checks
    the real one): a file written where ``bilevel run`` asks for it."""
    monkeypatch.setattr(
        report, "plot_run", lambda history, path, **kw: Path(path).write_bytes(b"png")
    )


# ---- a locked --out ---------------------------------------------------------------------------
_HOLD = (  # another process owns the directory, as a `bilevel run` on it does
    "import sys, time; from pathlib import Path; from bilevel.drivers.run_lock import RunLock; "
    "RunLock(Path(sys.argv[1]), '--out').acquire(); print('locked', flush=True); time.sleep(300)"
)


def test_an_out_locked_by_a_live_process_then_taken_over_once_it_is_killed(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        with holder.stdout:
            assert holder.stdout.readline().strip() == "locked"
        line = _one_line(_invoke(tmp_path), code=2)
        assert line.startswith(
            f"error: {tmp_path} is in use by pid {holder.pid} on {socket.gethostname()} (started "
        )
        assert line.endswith("); wait for it or use another --out.")
        assert not (tmp_path / "history.csv").exists()
    finally:
        holder.send_signal(signal.SIGKILL)  # killed outright: its lock stays behind
        holder.wait()
    assert (tmp_path / LOCK_FILE).exists()
    again = _invoke(tmp_path)
    assert again.exit_code == 0, again.output
    assert f"took over the lock of pid {holder.pid} " in again.stderr
    assert f"(pid {holder.pid} is not running)" in again.stderr
    assert _steps(tmp_path) == ALL_STEPS and not (tmp_path / LOCK_FILE).exists()


# ---- a corrupt checkpoint ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint_bytes(tmp_path_factory):
    """The checkpoint file of the command above (two seeds; x is the state's first leaf)."""
    where = tmp_path_factory.mktemp("good")
    first = _invoke(where)
    assert first.exit_code == 0, first.output
    return (where / "checkpoint" / CHECKPOINT_FILE).read_bytes()


CORRUPTIONS = [
    "empty",
    "random bytes",
    "truncated",
    "edited x",
    "edited step",
    "step vs state, rehashed",
    "step vs history, rehashed",
    "NaN in x",
    "NaN in x, rehashed",
]


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_a_corrupt_checkpoint_is_one_line(tmp_path, checkpoint_bytes, name):
    path = tmp_path / "checkpoint" / CHECKPOINT_FILE
    path.parent.mkdir()
    path.write_bytes(checkpoint_bytes)
    damage, reason = _corruptions(0, None)[name]
    damage(path)
    damaged = path.read_bytes()
    line = _one_line(_invoke(tmp_path), code=2)
    assert line.startswith(f"error: checkpoint {path} is corrupt ({reason}")
    assert line.endswith("); delete it or use another directory")
    assert "allow_pickle" not in line and "Aborted" not in line
    assert path.read_bytes() == damaged  # left for the user to look at
    _no_partial_files(tmp_path)
    if name == "NaN in x, rehashed":  # deleted, as the line says: the command starts afresh
        path.unlink()
        assert _invoke(tmp_path).exit_code == 0 and _steps(tmp_path) == ALL_STEPS


# ---- a full disk (an injected ENOSPC) ---------------------------------------------------------
def test_enospc_on_an_output_writes_the_rest_then_one_line_and_resumes(tmp_path, monkeypatch):
    def full(self, path, *args, **kwargs):
        raise _no_space(path)

    with monkeypatch.context() as patch:
        patch.setattr(pd.DataFrame, "to_parquet", full)
        line = _one_line(_invoke(tmp_path), code=1)
    parquet = tmp_path / "history.parquet"
    assert line == f"error: cannot write {parquet}: {NO_SPACE}; rerun the same command to resume"
    assert not parquet.exists()
    for name in ("history.csv", "summary.json", "history.png"):  # written all the same
        assert (tmp_path / name).stat().st_size > 0, name
    _no_partial_files(tmp_path)
    assert _checkpoint_step(tmp_path) == 4
    again = _invoke(tmp_path)
    assert again.exit_code == 0, again.output
    assert again.stdout.startswith("resumed; completed 4 steps")
    assert _steps(tmp_path) == ALL_STEPS
    assert pd.read_parquet(parquet).shape == pd.read_csv(tmp_path / "history.csv").shape


def _savez_failing_at(call: int, monkeypatch) -> None:
    """``np.savez`` (the checkpoint writer) runs out of space at its ``call``-th write, after
    writing part of the file."""
    real, calls = np.savez, []

    def savez(fh, **arrays):
        calls.append(1)
        if len(calls) == call:
            fh.write(b"PK\x03\x04 part of a checkpoint")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fh, **arrays)

    monkeypatch.setattr(np, "savez", savez)


def test_enospc_on_a_checkpoint_keeps_the_last_one_and_writes_the_outputs(tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        _savez_failing_at(2, patch)  # at step 4; the checkpoint of step 2 was written
        line = _one_line(_invoke(tmp_path, *EVERY_EVALUATION), code=1)
    path = tmp_path / "checkpoint" / CHECKPOINT_FILE
    assert line == f"error: cannot write {path}: {NO_SPACE}; rerun the same command to resume"
    assert _checkpoint_step(tmp_path) == 2  # the previous checkpoint, whole
    _no_partial_files(tmp_path)  # its temporary file removed
    assert _steps(tmp_path) == ALL_STEPS  # the outputs of the steps done
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["message"].endswith(f"; then cannot write {path}: {NO_SPACE}")
    assert (tmp_path / "history.png").exists() and (tmp_path / "history.parquet").exists()
    again = _invoke(tmp_path, *EVERY_EVALUATION)
    assert again.exit_code == 0, again.output
    assert again.stdout.startswith("resumed; completed 4 steps")
    assert _steps(tmp_path) == ALL_STEPS and _checkpoint_step(tmp_path) == 4


def test_every_write_failing_is_still_one_line(tmp_path, monkeypatch):
    real = os.replace

    def replace(src, dst, *args, **kwargs):
        if Path(dst).parent == tmp_path:
            raise _no_space(src)
        return real(src, dst, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", replace)
        line = _one_line(_invoke(tmp_path, "--no-checkpoint"), code=1)
    assert line == (
        f"error: cannot write {tmp_path / 'history.csv'}: {NO_SPACE} (not written either: "
        "history.parquet, summary.json, history.png)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no half files, no lock


def test_a_png_failure_without_checkpoint_still_writes_the_summary(tmp_path, monkeypatch):
    def plot_run(history, path, **kwargs):
        raise _no_space(path)

    with monkeypatch.context() as patch:
        patch.setattr(report, "plot_run", plot_run)
        line = _one_line(_invoke(tmp_path, "--no-checkpoint"), code=1)
    assert line == f"error: cannot write {tmp_path / 'history.png'}: {NO_SPACE}"
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "history.csv",
        "history.parquet",
        "summary.json",
    ]


def test_the_library_names_the_checkpoint_and_keeps_the_errno(tmp_path, monkeypatch):
    prob = bl.problems.quadratic(dx=2, dy=3)
    slv = bl.solvers.make("f2sa", lr_outer=0.05, lr_inner=0.1)
    args = dict(steps=4, seeds=[0, 1], eval_every=2, progress=False, checkpoint_interval=0)
    with monkeypatch.context() as patch:
        _savez_failing_at(2, patch)
        with pytest.raises(WriteError) as info:
            bl.solve(prob, slv, **args, checkpoint=tmp_path)
    err, path = info.value, tmp_path / CHECKPOINT_FILE
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC and err.filename == str(path)
    assert str(err) == f"cannot write {path}: {NO_SPACE}"
    assert err.result.steps == 4 and err.result.history.step.max() == 4  # the steps done
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_FILE]  # no temp, no lock
    resumed = bl.solve(prob, slv, **args, checkpoint=tmp_path)
    straight = bl.solve(prob, slv, **args)
    assert resumed.message.startswith("resumed; completed 4 steps")
    cols = [c for c in straight.history.columns if c != "seconds"]
    pd.testing.assert_frame_equal(resumed.history[cols], straight.history[cols], check_exact=True)


# ---- a read-only --out ------------------------------------------------------------------------
def _read_only(directory: Path, monkeypatch) -> int:
    """Make ``directory`` read-only; the errno a write into it then fails with. By its mode,
    or for root (whom modes do not stop) by failing the creation of files in it with EROFS,
    as a read-only filesystem does."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        return errno.EACCES
    real = os.open

    def open_(path, flags, *args, **kwargs):
        if Path(path).parent == directory and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    return errno.EROFS


def test_a_read_only_out_is_refused_early_naming_out(tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        code = _read_only(tmp_path, patch)
        try:
            line = _one_line(_invoke(tmp_path), code=2)
        finally:
            tmp_path.chmod(0o755)
    assert line == (
        f"error: --out {tmp_path} is not writable (cannot write {tmp_path / LOCK_FILE}: "
        f"[Errno {code}] {os.strerror(code)}); give another --out."
    )
    assert "solve(" not in line and list(tmp_path.iterdir()) == []
    assert _invoke(tmp_path).exit_code == 0 and _steps(tmp_path) == ALL_STEPS


def test_a_read_only_checkpoint_directory_names_out(tmp_path, monkeypatch):
    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != ckpt and real(p, mode))
    line = _one_line(_invoke(tmp_path), code=2)
    assert (
        line
        == f"error: --out's checkpoint directory {str(ckpt)!r} is not writable; give another one."
    )


# ---- a resume under another float width -------------------------------------------------------
def test_a_resume_with_another_dtype_setting_names_it(tmp_path):
    assert _invoke(tmp_path).exit_code == 0  # the tests run in float64 (JAX_ENABLE_X64 on)
    env = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    args = [*RUN, "--out", str(tmp_path)]
    proc = subprocess.run(
        [sys.executable, "-c", "from bilevel.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert proc.stderr == (
        f"error: the checkpoint in {tmp_path / 'checkpoint'} was written with float64 "
        "(jax_enable_x64 on: JAX_ENABLE_X64 set); this run uses float32 (jax_enable_x64 off: "
        "JAX_ENABLE_X64 unset), which rounds differently, so the resumed run would not continue "
        "it exactly. Resume with the same setting, or use another --out, or --no-checkpoint.\n"
    )
    again = _invoke(tmp_path, "--steps", "6")  # the same setting: it goes on
    assert again.exit_code == 0 and again.stdout.startswith("resumed; completed 6 steps")


# ---- sweep and reproduce share the one-line faults ----------------------------------------------
def test_sweep_writes_the_table_when_the_figure_fails(tmp_path, monkeypatch):
    def plot_sweep(final, fields, metric, path, **kwargs):
        raise _no_space(path)

    def sweep(problem, solver, grid, steps, seeds, **kwargs):  # its table, without the compile
        rows = [(lr, s, k) for lr in grid["lr_outer"] for s in seeds for k in (0, steps)]
        df = pd.DataFrame(rows, columns=["lr_outer", "seed", "step"])
        return df.assign(grad_norm=1.0 / (1 + df.step * df.lr_outer))

    monkeypatch.setattr(report, "plot_sweep", plot_sweep)
    monkeypatch.setattr(bl, "sweep", sweep)
    args = ["sweep", "--problem", "quadratic", "--grid", "lr_outer=0.01,0.05", "--steps", "4"]
    result = runner.invoke(app, [*args, "--no-progress", "--out", str(tmp_path)])
    line = _one_line(result, code=1)
    assert line == f"error: cannot write {tmp_path / 'sweep.png'}: {NO_SPACE}"
    assert f"wrote {tmp_path}/sweep.csv\n" in result.stdout
    assert "grad_norm: 8.3333e-01 at lr_outer=0.05" in result.stdout  # the results, printed
    assert pd.read_csv(tmp_path / "sweep.csv").shape == (4, 4)


def test_reproduce_prints_an_os_error_as_one_line(tmp_path, monkeypatch):
    import bilevel.experiments as experiments

    def run(name, out, **kwargs):
        raise _no_space(out / "claims.md")

    monkeypatch.setattr(experiments, "run", run)
    result = runner.invoke(app, ["reproduce", experiments.names()[0], "--out", str(tmp_path)])
    line = _one_line(result, code=1)
    assert line == f"error: {tmp_path / experiments.names()[0] / 'claims.md'}: {NO_SPACE}"

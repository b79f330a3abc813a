"""The `bilevel` command line."""

import json
import re
import signal
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from bilevel.cli import app

runner = CliRunner()


def test_solvers_and_problems_lists():
    out = runner.invoke(app, ["solvers"])
    assert out.exit_code == 0 and "f2sa" in out.output and "stocbio" in out.output
    out = runner.invoke(app, ["problems"])
    assert out.exit_code == 0 and "quadratic" in out.output


def test_run_writes_history_plot_and_summary(tmp_path):
    out = runner.invoke(
        app,
        [
            "run",
            "--problem",
            "quadratic-stochastic",
            "--solver",
            "f2sa",
            "--steps",
            "40",
            "--seeds",
            "2",
            "--eval-every",
            "20",
            "--batch-size",
            "16",
            "--opt",
            "inner_steps=3",
            "--problem-opt",
            "n_samples=100",
            "--out",
            str(tmp_path),
            "--no-progress",
        ],
    )
    assert out.exit_code == 0, out.output
    for name in ("history.csv", "history.parquet", "history.png", "summary.json"):
        assert (tmp_path / name).stat().st_size > 0, name
    h = pd.read_parquet(tmp_path / "history.parquet")
    assert sorted(h.seed.unique()) == [0, 1] and h.step.max() == 40
    assert pd.read_csv(tmp_path / "history.csv").shape == h.shape
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 40 and "grad_norm" in summary["final_mean"]
    assert "grad_norm" in out.output


def test_run_unknown_solver_is_a_clear_error(tmp_path):
    out = runner.invoke(app, ["run", "--solver", "nope", "--steps", "3", "--out", str(tmp_path)])
    assert out.exit_code == 2
    assert "error: unknown solver 'nope'" in out.output


def test_bad_opt_syntax(tmp_path):
    out = runner.invoke(app, ["run", "--opt", "inner_steps", "--out", str(tmp_path)])
    assert out.exit_code != 0 and "key=value" in out.output


# ---- Ctrl-C keeps the work: a real process, a real signal ---------------------------------------
def _run_args(out, steps):
    return [
        "run",
        "--problem",
        "quadratic-stochastic",
        "--problem-opt",
        "n_samples=200",
        "--batch-size",
        "8",
        "--seeds",
        "2",
        "--steps",
        str(steps),
        # a number: F2SA's k0="auto" is the horizon, so a run of other steps is another run
        # (test_a_horizon_default_is_another_run_with_other_steps); these resume longer runs
        "--opt",
        "k0=100",
        "--eval-every",
        "500",
        "--out",
        str(out),
    ]


# the command as a terminal starts it: SIGINT raises KeyboardInterrupt, whatever this test
# process inherited (a shell's background job ignores SIGINT, and solve leaves that alone)
_MAIN = (
    "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from bilevel.cli import main; main()"
)


def _bilevel(*args, **kwargs):
    cmd = [sys.executable, "-c", _MAIN, *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def test_sigint_mid_run_writes_outputs_and_the_same_command_resumes(tmp_path):
    out = tmp_path / "run"
    proc = _bilevel(*_run_args(out, 400_000), text=True)
    seen = []
    try:  # wait for evaluations to appear (one line each off a terminal), then Ctrl-C
        for line in proc.stderr:
            seen.append(line)
            if re.search(r"step (\d+,)?\d{3},\d{3}/400,000", line) and "step 0/" not in line:
                if int(re.search(r"step ([\d,]+)/", line).group(1).replace(",", "")) >= 2000:
                    proc.send_signal(signal.SIGINT)
                    break
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    stderr = "".join(seen) + stderr
    assert proc.returncode == 130, stderr[-3000:]
    assert "SIGINT: stopped at step" in stderr and "Traceback" not in stderr
    assert "rerun the same command to resume" in stdout
    history = pd.read_csv(out / "history.csv")
    assert (out / "history.png").stat().st_size > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] and summary["steps"] == history.step.max()
    with np.load(out / "checkpoint" / "checkpoint.npz", allow_pickle=False) as npz:
        ckpt_step = json.loads(str(npz["meta"]))["step"]
    stopped = int(history.step.max())
    assert ckpt_step == stopped >= 2000  # not one evaluation behind: at the last one
    # the same command resumes; to keep the test short, both it and the reference end soon after
    end = stopped + 1000
    # (in subprocesses too: the tests run in float64, the command in float32)
    straight_out = tmp_path / "straight"
    for where in (out, straight_out):
        proc = _bilevel(*_run_args(where, end), text=True)
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        assert (f"resuming from step {stopped:,}" in stderr) == (where == out)
    a, b = pd.read_csv(out / "history.csv"), pd.read_csv(straight_out / "history.csv")
    cols = [c for c in a.columns if c != "seconds"]
    pd.testing.assert_frame_equal(a[cols], b[cols], check_exact=True)
    with (
        np.load(out / "checkpoint" / "checkpoint.npz") as x,
        np.load(straight_out / "checkpoint" / "checkpoint.npz") as y,
    ):
        leaves = [k for k in x.files if k.startswith("leaf_")]
        for k in leaves:
            np.testing.assert_array_equal(x[k], y[k])


def test_a_horizon_default_is_another_run_with_other_steps(tmp_path):
    """F2SA's k0="auto" is the run's horizon: a longer run is another run, whose checkpoint
    directory is refused with what to give as a number (the same command resumes: above)."""
    args = [a for a in _run_args(tmp_path, 1000) if a not in ("--opt", "k0=100")]
    first = runner.invoke(app, [*args, "--no-progress"])
    assert first.exit_code == 0, first.output
    longer = [*args[: args.index("--steps") + 1], "1500", *args[args.index("--steps") + 2 :]]
    again = runner.invoke(app, [*longer, "--no-progress"])
    assert again.exit_code == 2 and "written by a different run" in again.output
    assert "k0='auto'" in again.output and "give those as numbers" in again.output


def test_rerun_says_resuming(tmp_path):
    first = runner.invoke(app, [*_run_args(tmp_path, 1000), "--no-progress"])
    assert first.exit_code == 0, first.output
    again = runner.invoke(
        app, _run_args(tmp_path, 1500)[:-4] + ["--eval-every", "500", "--out", str(tmp_path)]
    )
    assert again.exit_code == 0, again.output
    assert "resuming from step 1,000" in again.output


# ---- bad input: one line, flag names --------------------------------------------------------
@pytest.mark.parametrize(
    "args, message",
    [
        (["--steps", "0"], "error: --steps must be a positive integer, got 0."),
        (["--seeds", "0"], "error: --seeds must be a positive integer, got 0."),
        (["--batch-size", "32"], "error: --batch-size=32 but quadratic(dx=10"),
        (["--lr-outer", "-1"], "error: --lr-outer"),
        (["--opt", "inner_steps=0"], "error: --opt inner_steps=... must be a positive int"),
        (["--devices", "64"], "error: --devices asks for 64 devices but JAX sees"),
    ],
)
def test_bad_flags_are_one_line_errors_naming_the_flag(tmp_path, args, message):
    out = runner.invoke(app, ["run", "--steps", "5", *args, "--out", str(tmp_path)])
    assert out.exit_code == 2, out.output
    assert out.output.startswith(message), out.output
    assert len(out.output.strip().splitlines()) == 1 and "Traceback" not in out.output
    assert "solve(" not in out.output and "F2SA(" not in out.output


def test_sweep_devices_flag_is_one_line(tmp_path):
    args = ["sweep", "--grid", "lr_outer=0.01,0.1", "--steps", "5", "--devices", "64"]
    out = runner.invoke(app, [*args, "--out", str(tmp_path)])
    assert out.exit_code == 2, out.output
    assert out.output.startswith("error: --devices asks for 64 devices"), out.output
    assert len(out.output.strip().splitlines()) == 1 and "sweep(" not in out.output


def test_out_that_is_a_file_is_one_line(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    out = runner.invoke(app, ["run", "--steps", "5", "--out", str(path)])
    assert out.exit_code == 2 and out.output == f"error: --out {path} is a file; give a " + (
        "directory for the outputs.\n"
    )


def test_missing_dataset_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("BILEVEL_DATA", str(tmp_path / "empty"))
    monkeypatch.setenv("BILEVEL_IGNORE_SYSTEM_DATA", "1")
    out = runner.invoke(app, ["run", "--problem", "hyper-cleaning", "--out", str(tmp_path)])
    assert out.exit_code == 2, out.output
    assert out.output.startswith("error: ") and len(out.output.strip().splitlines()) == 1
    assert "fashion-mnist" in out.output.lower() and "Traceback" not in out.output


def test_checkpoint_of_another_run_names_the_flags(tmp_path):
    assert runner.invoke(app, [*_run_args(tmp_path, 500), "--no-progress"]).exit_code == 0
    other = runner.invoke(app, [*_run_args(tmp_path, 500), "--lr-outer", "0.01", "--no-progress"])
    assert other.exit_code == 2
    assert "written by a different run" in other.output and "--no-checkpoint" in other.output

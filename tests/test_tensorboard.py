"""``log_to=``: the history streamed to TensorBoard event files, read back here.

The events are read with tensorboardX's own protobuf classes and a reader of the TFRecord
framing written below (the ``tensorboard`` package is not a dependency): each record is a
little-endian uint64 length, its masked CRC-32C, the data and the data's masked CRC-32C. The
reader applies TensorBoard's restart rule (a ``SessionLog.START`` at step s hides what the
run's earlier events hold from step s on) so that a resumed run can be checked as TensorBoard
shows it.
"""

from __future__ import annotations

import struct
import sys
import time

import numpy as np
import pandas as pd
import pytest

import bilevel as bl
from bilevel.drivers import engine, loggers

tbx = pytest.importorskip("tensorboardX")
from tensorboardX.crc32c import crc32c  # noqa: E402
from tensorboardX.proto.event_pb2 import Event, SessionLog  # noqa: E402
from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData  # noqa: E402

STEPS, EVERY, SEEDS = 100, 10, [0, 1]
SOLVER = dict(lr_outer=0.05, lr_inner=0.1)  # the quadratic's step-size hints
#: columns that are not a scalar: the run (one per seed) and the global step
KEYS = ("seed", "step")


@pytest.fixture(scope="module")
def quad():
    return bl.problems.quadratic(dx=4, dy=6)


def _masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _records(path, complete: bool = True):
    """The records of one event file, their CRCs checked; ``complete=False``: a file being
    written, whose last record may not be all there yet."""
    data = path.read_bytes()
    at = 0
    while at < len(data):
        if not complete and (len(data) - at < 12 or len(data) - at < 16 + _length(data, at)):
            return
        header = data[at : at + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[at + 8 : at + 12])
        assert header_crc == _masked_crc(header), f"{path}: a damaged record header"
        record = data[at + 12 : at + 12 + length]
        (record_crc,) = struct.unpack("<I", data[at + 12 + length : at + 16 + length])
        assert record_crc == _masked_crc(record), f"{path}: a damaged record"
        yield record
        at += 16 + length


def _length(data: bytes, at: int) -> int:
    return struct.unpack("<Q", data[at : at + 8])[0]


def _events(run_dir, complete: bool = True):
    """Every event of a TensorBoard run (its files in name order, as TensorBoard reads them)."""
    files = sorted(run_dir.glob("events.out.tfevents.*"))
    assert files or not complete, f"no event files in {run_dir}"
    return [Event.FromString(r) for f in files for r in _records(f, complete)]


def _scalars(run_dir, purge: bool = True, complete: bool = True) -> dict[str, list]:
    """``{tag: [(step, value), ...]}``; ``purge``: as TensorBoard shows them after restarts."""
    out: dict[str, list[tuple[int, float]]] = {}
    for event in _events(run_dir, complete):
        if purge and event.session_log.status == SessionLog.START:
            out = {tag: [(s, v) for s, v in pts if s < event.step] for tag, pts in out.items()}
        for value in event.summary.value:
            if value.WhichOneof("value") == "simple_value":
                out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


def _hparams(run_dir) -> tuple[dict, list[str]]:
    """The recorded hyperparameters (the last session start) and the experiment's metrics."""
    values, metrics = {}, []
    for event in _events(run_dir):
        for value in event.summary.value:
            if value.metadata.plugin_data.plugin_name != "hparams":
                continue
            data = HParamsPluginData.FromString(value.metadata.plugin_data.content)
            if data.HasField("session_start_info"):
                hp = data.session_start_info.hparams
                values = {k: getattr(v, v.WhichOneof("kind")) for k, v in hp.items()}
            if data.HasField("experiment"):
                metrics = [m.name.tag for m in data.experiment.metric_infos]
    return values, metrics


def _assert_logged_as_history(log_dir, history, seeds) -> None:
    """Each seed's run holds every numeric column of ``history`` at each of its steps."""
    assert sorted(p.name for p in log_dir.iterdir()) == [f"seed_{s}" for s in seeds]
    columns = [c for c in history.columns if c not in KEYS]
    for seed in seeds:
        rows = history[history.seed == seed]
        scalars = _scalars(log_dir / f"seed_{seed}")
        assert sorted(scalars) == sorted(columns)
        for column in columns:
            steps, values = zip(*scalars[column], strict=True)
            assert list(steps) == rows.step.tolist(), column
            # TensorBoard keeps scalars as float32
            np.testing.assert_array_equal(
                np.float32(values), rows[column].to_numpy(np.float32), err_msg=column
            )


def test_a_run_streams_its_history_rows_per_seed_with_hyperparameters(quad, tmp_path, monkeypatch):
    log_dir = tmp_path / "tb"
    monkeypatch.setattr(loggers, "FLUSH_SECONDS", 0)  # written out at once, to see it mid-run
    seen_mid_run = []
    evaluate = engine.Engine.evaluate

    def evaluate_and_look(self, state, step):
        if step == 60:  # the rows up to step 50 are on disk before the run ends
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                logged = _scalars(log_dir / "seed_1", complete=False).get("grad_norm", [])
                if [s for s, _ in logged] == list(range(0, 60, EVERY)):
                    break
                time.sleep(0.02)
            seen_mid_run.append(logged)
        return evaluate(self, state, step)

    monkeypatch.setattr(engine.Engine, "evaluate", evaluate_and_look)
    solver = bl.solvers.make("f2sa", **SOLVER)
    res = bl.solve(
        quad, solver, STEPS, seeds=SEEDS, eval_every=EVERY, progress=False, log_to=log_dir
    )
    assert res.ok and res.history.step.unique().tolist() == list(range(0, STEPS + 1, EVERY))
    assert [s for s, _ in seen_mid_run[0]] == [0, 10, 20, 30, 40, 50]
    _assert_logged_as_history(log_dir, res.history, SEEDS)
    for seed in SEEDS:
        values, metrics = _hparams(log_dir / f"seed_{seed}")
        assert values["lr_outer"] == 0.05 and values["lr_inner"] == 0.1
        assert values["run.solver"] == "f2sa" and values["run.problem"] == quad.name
        assert values["run.steps"] == STEPS and values["run.eval_every"] == EVERY
        assert values["run.seed"] == seed and values["run.seeds"] == len(SEEDS)
        assert {"grad_norm", "outer_loss", "x_err"} <= set(metrics)
        assert not {"samples", "seconds", "step", "seed"} & set(metrics)
        texts = [
            v.tensor.string_val[0].decode()
            for e in _events(log_dir / f"seed_{seed}")
            for v in e.summary.value
            if v.tag == "hyperparameters/text_summary"
        ]
        assert len(texts) == 1 and "| lr_outer | 0.05 |" in texts[0]


def test_a_resumed_run_continues_the_log_without_repeating_steps(quad, tmp_path, monkeypatch):
    """A run that crashed at step 80, its checkpoint at 40 and its log at 70, resumed: the
    resumed run's events start with a restart marker at 41, so TensorBoard shows each step
    once, with the values of the resumed (uninterrupted) history."""
    log_dir, ckpt = tmp_path / "tb", tmp_path / "ckpt"
    run = dict(seeds=SEEDS, eval_every=EVERY, progress=False, log_to=log_dir, checkpoint=ckpt)
    solver = bl.solvers.make("f2sa", **SOLVER)
    with monkeypatch.context() as patch:
        save, evaluate = engine.Engine.save, engine.Engine.evaluate

        def save_until_40(self, state, force):
            if self.done <= 40:
                save(self, state, force)

        def crash_at_80(self, state, step):
            if step == 80:
                raise RuntimeError("crash")
            return evaluate(self, state, step)

        patch.setattr(engine.Engine, "save", save_until_40)
        patch.setattr(engine.Engine, "evaluate", crash_at_80)
        with pytest.raises(RuntimeError, match="crash"):
            bl.solve(quad, solver, STEPS, checkpoint_interval=0, **run)
    first = _scalars(log_dir / "seed_0")["grad_norm"]
    assert [s for s, _ in first] == list(range(0, 80, EVERY))  # flushed despite the crash
    res = bl.solve(quad, solver, STEPS, **run)
    assert res.message.startswith("resumed; completed 100 steps")
    _assert_logged_as_history(log_dir, res.history, SEEDS)
    # without the restart rule, 50 to 70 would be there twice: the marker is what hides them
    raw = [s for s, _ in _scalars(log_dir / "seed_0", purge=False)["grad_norm"]]
    assert raw == list(range(0, 80, EVERY)) + list(range(50, STEPS + 1, EVERY))
    starts = [
        e.step for e in _events(log_dir / "seed_0") if e.session_log.status == SessionLog.START
    ]
    assert starts == [0, 41]


def test_solve_online_logs_one_row_per_round(tmp_path):
    problem = bl.problems.oscillating(horizon=30)
    solver = bl.solvers.make("f2obo", lr_outer=0.05, lr_inner=0.1)
    res = bl.solve_online(
        problem, solver, eval_every=10, progress=False, regret=None, log_to=tmp_path
    )
    history = res.history.rename(columns={"round": "step"})
    _assert_logged_as_history(tmp_path, history, [0])
    values, _ = _hparams(tmp_path / "seed_0")
    assert values["run.rounds"] == 30 and values["run.solver"] == "f2obo"


def test_without_tensorboardx_the_error_names_the_extra(quad, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import tensorboardX fails
    solver = bl.solvers.make("f2sa", **SOLVER)
    with pytest.raises(ImportError, match=r"pip install 'bilevel\[tensorboard\]'"):
        bl.solve(quad, solver, STEPS, progress=False, log_to=tmp_path / "tb")
    assert not (tmp_path / "tb").exists()  # refused before anything ran


def test_log_to_a_file_is_refused(quad, tmp_path):
    path = tmp_path / "file"
    path.write_text("")
    with pytest.raises(ValueError, match="is a file"):
        bl.solve(quad, bl.solvers.make("f2sa", **SOLVER), STEPS, log_to=path)


def test_bilevel_run_log_to(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from bilevel.cli import app

    # the programs of the tests above: the same problem, solver, seeds and chunk length
    args = ["run", "--problem", "quadratic", "--problem-opt", "dx=4", "--problem-opt", "dy=6"]
    args += ["--steps", "20", "--eval-every", str(EVERY), "--seeds", str(len(SEEDS))]
    args += ["--out", str(tmp_path / "out"), "--no-progress", "--no-checkpoint"]
    done = CliRunner().invoke(app, [*args, "--log-to", str(tmp_path / "tb")])
    assert done.exit_code == 0, done.output
    history = pd.read_parquet(tmp_path / "out" / "history.parquet")
    _assert_logged_as_history(tmp_path / "tb", history, SEEDS)
    (tmp_path / "file").write_text("")
    refused = CliRunner().invoke(app, [*args, "--log-to", str(tmp_path / "file")])
    assert refused.exit_code == 2 and "error: --log-to" in refused.output
    assert "is a file" in refused.output
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    refused = CliRunner().invoke(app, [*args, "--log-to", str(tmp_path / "tb2")])
    assert refused.exit_code == 2
    assert "error: --log-to" in refused.output and "bilevel[tensorboard]" in refused.output

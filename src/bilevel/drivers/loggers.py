"""Run histories streamed to TensorBoard: ``bl.solve(..., log_to=DIR)``.

:class:`TensorBoardLog` writes a run's history rows, as the engine evaluates them, to
TensorBoard event files under ``DIR``: one TensorBoard run per seed (``DIR/seed_<s>``), every
numeric column of the row (``samples``, the oracle calls, ``seconds``, the metrics) as a scalar
of that name (float32, as TensorBoard keeps them) with the row's ``step`` as its global step.
Each seed's run also records the hyperparameters: the solver's fields and the run's settings,
as the HParams dashboard's session (tensorboardX's ``hparams`` summaries) and as a Markdown
table in the Text dashboard.

It hooks in where the engine announces rows: :class:`Logged` wraps the run's progress display,
whose ``update(done, rows)`` the engine calls after every evaluation with the history so far
(:meth:`bilevel.drivers.engine.Engine.loop`), so the new rows go out at once; ``close`` (in
the driver's ``finally`` around the loop: the end, an exception, Ctrl-C or SIGTERM) writes out
and closes the files.
The files are flushed every :data:`FLUSH_SECONDS` while the run goes.

Every run opens new event files with a restart marker (tensorboardX's ``purge_step``) at the
first step it writes: TensorBoard hides what earlier files hold from that step on. A fresh run
(step 0) thus replaces an earlier run logged into the same directory, and a run resumed from a
checkpoint at step c writes from step c + 1: the rows up to c were logged by the run it takes
up, those it logged past the checkpoint are replaced, and no step is shown twice.

Writing needs ``tensorboardX`` (``pip install 'bilevel[tensorboard]'``); reading the events
needs TensorBoard itself (``tensorboard --logdir DIR``), which this package does not install.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from bilevel.core.oracles import Counts

__all__ = [
    "EXTRA",
    "FLUSH_SECONDS",
    "Logged",
    "TensorBoardLog",
    "check_log_to",
    "hyperparameters",
    "logged",
    "require_tensorboardx",
]

#: how to install what ``log_to=`` needs
EXTRA = "pip install 'bilevel[tensorboard]'"
#: the event files are flushed at least this often (seconds) while a run goes
FLUSH_SECONDS = 5
#: columns that are not a scalar of their own: the TensorBoard run and the global step
_KEYS = ("seed", "step")
#: columns that are not the HParams dashboard's metrics: the keys and the counters of work
_NOT_METRICS = frozenset((*_KEYS, *Counts._fields, "samples", "oracle_calls", "seconds"))


def require_tensorboardx():
    """``tensorboardX.SummaryWriter``; an ImportError naming the extra when it is missing."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError as err:
        raise ImportError(
            f"log_to= writes TensorBoard event files with tensorboardX, which is not "
            f"installed: {EXTRA} (or pip install tensorboardX)."
        ) from err
    return SummaryWriter


def check_log_to(log_to, caller: str = "solve") -> Path | None:
    """The log directory, created now (``None``: no log): fails before anything runs when
    ``tensorboardX`` is missing (ImportError), ``log_to`` names a file (ValueError) or cannot
    be created (OSError)."""
    if log_to is None:
        return None
    if not isinstance(log_to, str | os.PathLike):
        raise TypeError(f"{caller}(log_to=...) must be a directory path, got {log_to!r}.")
    path = Path(log_to)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{caller}(log_to={str(path)!r}) is a file; give a directory.")
    require_tensorboardx()
    path.mkdir(parents=True, exist_ok=True)
    return path


def hyperparameters(solver, settings: dict[str, Any]) -> dict[str, Any]:
    """What a run's TensorBoard log records as its hyperparameters: the solver's fields by
    name, then ``settings`` (the run's) as ``run.<name>``; every value a number, bool or
    string (anything else as its ``repr``)."""
    fields = {f.name: getattr(solver, f.name) for f in dataclasses.fields(solver)}
    named = {"run.solver": solver.name} | {f"run.{k}": v for k, v in settings.items()}
    return {k: _plain(v) for k, v in (fields | named).items()}


def _plain(value) -> bool | int | float | str:
    """A value the HParams dashboard takes."""
    if isinstance(value, bool | str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    try:  # a numpy or JAX scalar
        array = np.asarray(value)
    except Exception:  # an object numpy cannot read: its repr below
        array = None
    if array is not None and array.ndim == 0 and array.dtype.kind in "biuf":
        return array.item()
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


class TensorBoardLog:
    """The TensorBoard event files of one run (module docstring).

    Args:
        directory: the log directory; each seed writes to ``directory/seed_<seed>``.
        hparams: the run's hyperparameters (:func:`hyperparameters`); each seed's run records
            them with ``run.seed`` added.
        written: rows of the history that are already logged (a resumed run's restored rows).
        first_step: the first step this run writes (0 for a fresh run, the checkpoint's step
            plus 1 for a resumed one): TensorBoard hides the earlier files' events from it on.
    """

    def __init__(
        self, directory, hparams: dict[str, Any], *, written: int = 0, first_step: int = 0
    ):
        self.SummaryWriter = require_tensorboardx()
        self.directory = Path(directory)
        self.hparams = hparams
        self.written = written
        self.first_step = first_step
        self.writers: dict[Any, Any] = {}

    def write(self, rows: list[dict]) -> None:
        """Log the rows not logged yet (``rows`` is the history so far)."""
        from tensorboardX.proto.summary_pb2 import Summary

        for row in rows[self.written :]:
            values = [
                Summary.Value(tag=name, simple_value=float(v))
                for name, v in row.items()
                if name not in _KEYS and _numeric(v)
            ]
            step = int(row["step"])
            self._writer(row).file_writer.add_summary(Summary(value=values), step)
        self.written = len(rows)

    def _writer(self, row: dict):
        """The seed's writer, opened at its first row (with the restart marker and the
        hyperparameters)."""
        seed = row["seed"]
        if seed not in self.writers:
            writer = self.SummaryWriter(
                str(self.directory / f"seed_{seed}"),
                purge_step=self.first_step,
                max_queue=1000,
                flush_secs=FLUSH_SECONDS,
                # sortable and unique: tensorboardX names files by the second only, and a
                # second file of the same second would overwrite the first
                filename_suffix=f".{time.time_ns()}",
            )
            self._record_hparams(writer, seed, row)
            self.writers[seed] = writer
        return self.writers[seed]

    def _record_hparams(self, writer, seed, row: dict) -> None:
        """The hyperparameters in the HParams and Text dashboards, at the first step written
        (a resumed run records them again, at its own first step)."""
        from tensorboardX.summary import hparams

        values = self.hparams | {"run.seed": _plain(seed)}
        metrics = [k for k, v in row.items() if k not in _NOT_METRICS and _numeric(v)]
        experiment, session_start, _ = hparams(values, dict.fromkeys(metrics, 0.0))
        writer.file_writer.add_summary(experiment, self.first_step)
        writer.file_writer.add_summary(session_start, self.first_step)
        table = "\n".join(f"| {k} | {v} |" for k, v in values.items())
        writer.add_text("hyperparameters", f"| name | value |\n|---|---|\n{table}", self.first_step)

    def flush(self) -> None:
        for writer in self.writers.values():
            writer.flush()

    def close(self) -> None:
        """Write out and close every seed's file."""
        writers, self.writers = self.writers, {}
        for writer in writers.values():
            writer.close()


def _numeric(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def logged(display, log_to, solver, settings: dict[str, Any], history, first_step: int = 0):
    """``display``, with a :class:`TensorBoardLog` of the run behind it when ``log_to`` is
    not ``None``. ``settings`` are the run's (:func:`hyperparameters`); the rows ``history``
    already holds (a resumed run's) are not logged again."""
    if log_to is None:
        return display
    hparams = hyperparameters(solver, settings)
    log = TensorBoardLog(log_to, hparams, written=len(history.rows), first_step=first_step)
    return Logged(display, log)


class Logged:
    """A progress display that also hands the run's new history rows to ``log`` (a
    :class:`TensorBoardLog`): the engine's display, with the log behind it."""

    def __init__(self, display, log: TensorBoardLog):
        self.display = display
        self.log = log

    def note(self, text: str) -> None:
        self.display.note(text)

    def update(self, done: int, rows: list[dict]) -> None:
        self.display.update(done, rows)
        self.log.write(rows)

    def close(self) -> None:
        try:
            self.display.close()
        finally:
            self.log.close()

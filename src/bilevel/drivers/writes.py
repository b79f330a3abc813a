"""Faults while writing a run's files: :class:`WriteError` and :func:`write_each`.

A full disk (``ENOSPC``), a read-only filesystem (``EROFS``) or a directory without write
permission (``EACCES``) makes a write raise ``OSError``; the message of Python's own error
often names no path (numpy's, pyarrow's) or a temporary one. The drivers turn it into a
:class:`WriteError`: still an ``OSError`` with the same ``errno``, whose ``filename`` is the
file the run meant to write and which prints as one line::

    cannot write runs/x/history.parquet: [Errno 28] No space left on device

:func:`write_each` writes a list of files in order, each to a temporary sibling renamed over it
(a file is the new one whole, or stays as it was), and goes on past a failure, so that what
still can be written is written (``bilevel run``: the history, then the summary, then the
figure).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["WriteError", "cannot_write", "write_each"]


class WriteError(OSError):
    """Writing ``path`` failed (``errno`` and ``strerror`` of the cause, ``filename`` the path).

    Attributes:
        path: the file that could not be written.
        result: when a checkpoint write of ``bl.solve`` failed, the run's
            :class:`~bilevel.drivers.results.Result` of the steps done (their history
            included, for the outputs that can still be written); ``None`` otherwise. The
            previous checkpoint is kept and the temporary file removed, so the same call,
            once the fault is gone, resumes from it.
    """

    def __init__(self, path: str | os.PathLike, cause: OSError):
        code = cause.errno
        reason = os.strerror(code) if code else " ".join(str(cause).split()) or type(cause).__name__
        super().__init__(code, reason, str(path))
        self.path = Path(path)
        self.result: Any = None
        self.state: Any = None  # the engine's state at a failed checkpoint write (for result)

    def __str__(self) -> str:
        code = f"[Errno {self.errno}] " if self.errno else ""
        return f"cannot write {self.filename}: {code}{self.strerror}"

    def __reduce__(self):  # picklable (multiprocessing, pytest-xdist) despite the signature
        return _rebuild, (self.filename, self.errno, self.strerror)


def _rebuild(path: str, code: int | None, reason: str) -> WriteError:
    return WriteError(path, OSError(code, reason))


def cannot_write(path: str | os.PathLike, err: OSError) -> WriteError:
    """``err`` as a :class:`WriteError` of ``path`` (itself when it already is one)."""
    return err if isinstance(err, WriteError) else WriteError(path, err)


def write_each(writes: Sequence[tuple[Path, Callable[[Path], Any]]]) -> list[WriteError]:
    """Write each ``(path, write)`` in order: ``write(temporary)`` into a hidden sibling of
    ``path`` (same suffix), then renamed over ``path``. An ``OSError`` leaves ``path`` as it
    was, removes the temporary file and goes on to the next file. Returns the failures in
    order (empty: every file written)."""
    failed = []
    for path, write in writes:
        path = Path(path)
        partial = path.with_name(f".{path.stem}.partial{path.suffix}")
        try:
            write(partial)
            os.replace(partial, path)
        except OSError as err:
            failed.append(cannot_write(path, err))
        finally:
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
    return failed

"""Ctrl-C (SIGINT) and SIGTERM during a run: a request to stop at a consistent point.

The engine (:mod:`bilevel.drivers.engine`) runs its loop inside :class:`StopSignals` and its
bookkeeping (history rows, checkpoint writes) inside :meth:`StopSignals.bookkeeping`, so a
stop never leaves rows, counters and state describing different steps.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any

__all__ = ["StopRequested", "StopSignals"]


class StopRequested(BaseException):
    """Raised by the signal handler to leave a running chunk (a ``BaseException``, like
    ``KeyboardInterrupt``, so that no ``except Exception`` on the way swallows it)."""


class StopSignals:
    """SIGINT and SIGTERM while a run goes on: a request to stop at a consistent point.

    Outside bookkeeping the handler raises at once (JAX's wait for a chunk is interruptible,
    and the chunk's result is simply dropped: the last evaluation is at most one chunk
    behind). Inside :meth:`bookkeeping` it only records the request, acted on after that
    block. A second signal aborts at once with a plain ``KeyboardInterrupt``. Handlers are
    installed only in the main thread (Python allows no other), not for a signal the process
    ignores (a shell starts background jobs with SIGINT ignored; Python itself leaves it so),
    and restored on exit.

    Attributes:
        requested: ``"SIGINT"`` or ``"SIGTERM"`` once a stop was asked for, else ``None``.
    """

    def __init__(self):
        self.requested: str | None = None
        self._critical = False
        self._previous: dict[int, Any] = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(sig) is signal.SIG_IGN:
                    continue  # ignored on purpose (a shell's background job): leave it so
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False

    def _handle(self, signum, frame):
        if self.requested is not None:
            raise KeyboardInterrupt  # second signal: the user wants out now
        self.requested = signal.Signals(signum).name
        if not self._critical:
            raise StopRequested

    @contextlib.contextmanager
    def bookkeeping(self):
        """A block a (first) signal does not interrupt; the caller checks ``requested`` after."""
        self._critical = True
        try:
            yield
        finally:
            self._critical = False
